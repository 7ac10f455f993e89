package blender

import (
	"errors"
	"fmt"
)

// Errors of the package; check them with errors.Is.
var (
	// ErrScene marks a scene or request no retry can fix: not a .blend, no camera, a missing
	// texture, a scene that needs scripts. The farm treats it as terminal.
	ErrScene = errors.New("blender scene")
	// ErrNotFound is returned when the Blender binary cannot be found or started.
	ErrNotFound = errors.New("blender not found")
	// ErrProcess marks trouble of one Blender process (it crashed, hung, or answered
	// nonsense). The process is discarded; a retry runs on a fresh one.
	ErrProcess = errors.New("blender process failed")
	// ErrBadDescription is wrapped by every error about a scene description's content.
	ErrBadDescription = errors.New("bad blender scene description")
)

func sceneErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrScene, fmt.Sprintf(format, args...))
}

// ErrBuildMismatch is returned for a tile made for another Blender build than the pool's: its
// pixels could differ in their last bits, so it must be rendered by a worker of the farm's build.
var ErrBuildMismatch = errors.New("blender build mismatch")

package render

import "fmt"

// SceneError reports a problem with a scene or the settings a render was
// asked for: bad JSON, unknown materials, missing assets, absurd settings.
// Such problems do not go away on retry, so the farm classifies them as
// terminal with errors.As.
type SceneError struct {
	Field string // where the problem is, e.g. "materials[2].type" or "settings.spp"
	Msg   string // what is wrong
	err   error  // underlying cause, if any (e.g. fs.ErrNotExist)
}

// Error formats the problem as "scene: FIELD: MSG".
func (e *SceneError) Error() string {
	if e.Field == "" {
		return "scene: " + e.Msg
	}
	return "scene: " + e.Field + ": " + e.Msg
}

// Unwrap returns the underlying cause, so errors.Is(err, fs.ErrNotExist) works
// for a missing asset.
func (e *SceneError) Unwrap() error { return e.err }

// sceneErr builds a *SceneError with a formatted message.
func sceneErr(field, format string, args ...any) *SceneError {
	return &SceneError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// joinField appends a sub-field to a field path.
func joinField(parent, child string) string {
	switch {
	case parent == "":
		return child
	case child == "":
		return parent
	}
	return parent + "." + child
}

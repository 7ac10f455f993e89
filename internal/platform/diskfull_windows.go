//go:build windows

package platform

import (
	"errors"

	"golang.org/x/sys/windows"
)

// DiskFull reports whether err says a disk has no room left.
func DiskFull(err error) bool {
	return errors.Is(err, windows.ERROR_DISK_FULL) || errors.Is(err, windows.ERROR_HANDLE_DISK_FULL)
}

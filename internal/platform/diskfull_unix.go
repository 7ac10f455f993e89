//go:build unix

package platform

import (
	"errors"
	"syscall"
)

// DiskFull reports whether err says a disk has no room left.
func DiskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

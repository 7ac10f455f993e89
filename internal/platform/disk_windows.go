//go:build windows

package platform

import (
	"fmt"

	"golang.org/x/sys/windows"
)

// FreeBytes is the space left to this user on the disk holding dir.
func FreeBytes(dir string) (uint64, error) {
	p, err := windows.UTF16PtrFromString(dir)
	if err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	var free, total, all uint64
	if err := windows.GetDiskFreeSpaceEx(p, &free, &total, &all); err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	return free, nil
}

//go:build windows

package platform

import "golang.org/x/sys/windows"

var diskFullErr = windows.ERROR_DISK_FULL

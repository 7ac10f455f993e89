//go:build unix

package platform

import "syscall"

var diskFullErr = syscall.ENOSPC

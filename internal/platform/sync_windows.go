//go:build windows

package platform

// SyncDir does nothing on Windows: a directory cannot be opened to be flushed there (access
// denied), and NTFS journals a rename itself, so the entry a rename made survives a crash.
func SyncDir(dir string) error { return nil }

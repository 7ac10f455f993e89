// Package platform is the code that differs between the systems tilefarm runs on (Linux,
// Windows, macOS), one file per concern and system, so the rest of the farm is written once:
// the free space of a disk (disk_*.go), a full disk's error (diskfull_*.go), a directory's sync
// (sync_*.go). Process groups and signals live with the processes
// they end (blender/proc_*.go: Blender's death with its worker).
package platform

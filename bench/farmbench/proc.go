package farmbench

import (
	"time"

	"github.com/tilefarm/tilefarm/bench/internal/procstat"
)

// CPUTime reads a live process's user+system CPU time from /proc/PID/stat.
func CPUTime(pid int) (time.Duration, error) { return procstat.CPUTime(pid) }

// PeakRSS reads a process's peak resident set (VmHWM) in bytes from /proc.
func PeakRSS(pid int) (int64, error) { return procstat.PeakRSS(pid) }

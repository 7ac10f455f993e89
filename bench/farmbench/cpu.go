package farmbench

import "runtime"

func numCPU() int { return runtime.NumCPU() }

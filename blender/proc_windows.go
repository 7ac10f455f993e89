package blender

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/windows"
)

// prepareCommand hands the driver its request and reply pipes where Windows can: a child
// inherits handles, not fds, so the two pipe handles are made inheritable and listed for the
// child alone (AdditionalInheritedHandles), and the driver gets their values ("h" and the
// number), which it opens with msvcrt.open_osfhandle. Once Blender runs, it joins the worker's
// Job Object, which kills every process in it when its last handle closes: the worker holds
// that handle, so Blender and anything it started end with the worker, however it ends
// (Windows' answer to Linux's parent-death signal).
func prepareCommand(cmd *exec.Cmd, req, rep *os.File) (args []string, started func() error, err error) {
	handles := []syscall.Handle{syscall.Handle(req.Fd()), syscall.Handle(rep.Fd())}
	for _, h := range handles {
		// Go's os.Pipe makes them non-inheritable; AdditionalInheritedHandles wants them marked.
		if err := windows.SetHandleInformation(windows.Handle(h), windows.HANDLE_FLAG_INHERIT, windows.HANDLE_FLAG_INHERIT); err != nil {
			return nil, nil, fmt.Errorf("%w: making the driver's pipes inheritable: %v", ErrProcess, err)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{AdditionalInheritedHandles: handles}
	args = []string{"h" + strconv.FormatUint(uint64(handles[0]), 10), "h" + strconv.FormatUint(uint64(handles[1]), 10)}
	return args, func() error { return joinWorkersJob(cmd.Process) }, nil
}

// workersJob is the Job Object every Blender of this worker joins, made once: its handle stays
// open for the worker's life on purpose (closing it would kill them).
var workersJob = sync.OnceValues(func() (windows.Handle, error) {
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return 0, fmt.Errorf("creating a job object for Blender: %w", err)
	}
	info := windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION{
		BasicLimitInformation: windows.JOBOBJECT_BASIC_LIMIT_INFORMATION{LimitFlags: windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE},
	}
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		windows.CloseHandle(job)
		return 0, fmt.Errorf("setting Blender's job object to end with the worker: %w", err)
	}
	return job, nil
})

// joinWorkersJob puts p in workersJob.
func joinWorkersJob(p *os.Process) error {
	job, err := workersJob()
	if err != nil {
		return err
	}
	h, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, uint32(p.Pid))
	if err != nil {
		return fmt.Errorf("opening Blender's process: %w", err)
	}
	defer windows.CloseHandle(h)
	if err := windows.AssignProcessToJobObject(job, h); err != nil {
		return fmt.Errorf("putting Blender in the worker's job object: %w", err)
	}
	return nil
}

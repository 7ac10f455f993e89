package blender

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/windows"
)

// prepareCommand hands the driver its request and reply pipes where Windows can: a child
// inherits handles, not fds, so the two pipe handles are made inheritable and listed for the
// child alone (AdditionalInheritedHandles), and the driver gets their values ("h" and the
// number), which it opens with msvcrt.open_osfhandle. Once Blender runs, it is put in a Job
// Object that kills every process in it when its last handle closes: the worker holds that
// handle, so Blender and anything it started end with the worker, however it ends (Windows'
// answer to Linux's parent-death signal).
func prepareCommand(cmd *exec.Cmd, req, rep *os.File) (args []string, started func() error) {
	handles := []syscall.Handle{syscall.Handle(req.Fd()), syscall.Handle(rep.Fd())}
	for _, h := range handles {
		// Go's os.Pipe makes them non-inheritable; AdditionalInheritedHandles wants them marked.
		_ = windows.SetHandleInformation(windows.Handle(h), windows.HANDLE_FLAG_INHERIT, windows.HANDLE_FLAG_INHERIT)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{AdditionalInheritedHandles: handles}
	args = []string{"h" + strconv.FormatUint(uint64(handles[0]), 10), "h" + strconv.FormatUint(uint64(handles[1]), 10)}
	return args, func() error { return killWithWorker(cmd.Process) }
}

// killWithWorker puts p in a Job Object that kills it when the worker's handle on the job
// closes (the worker exits or dies). The handle is kept open for the worker's lifetime on
// purpose.
func killWithWorker(p *os.Process) error {
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return fmt.Errorf("creating a job object for Blender: %w", err)
	}
	info := windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION{
		BasicLimitInformation: windows.JOBOBJECT_BASIC_LIMIT_INFORMATION{LimitFlags: windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE},
	}
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		windows.CloseHandle(job)
		return fmt.Errorf("setting Blender's job object to end with the worker: %w", err)
	}
	h, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, uint32(p.Pid))
	if err != nil {
		windows.CloseHandle(job)
		return fmt.Errorf("opening Blender's process: %w", err)
	}
	defer windows.CloseHandle(h)
	if err := windows.AssignProcessToJobObject(job, h); err != nil {
		windows.CloseHandle(job)
		return fmt.Errorf("putting Blender in its job object: %w", err)
	}
	return nil
}

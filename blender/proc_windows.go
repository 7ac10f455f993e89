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
// Object of its own that kills every process in it when its handle closes: the worker holds
// the handle, so Blender and anything it started end with the worker, however it ends
// (Windows' answer to Linux's parent-death signal), and release, called once Blender has
// exited or was killed (a hang, a stop), ends what it started.
func prepareCommand(cmd *exec.Cmd, req, rep *os.File) (args []string, started func() (release func(), err error), err error) {
	handles := []syscall.Handle{syscall.Handle(req.Fd()), syscall.Handle(rep.Fd())}
	for _, h := range handles {
		// Go's os.Pipe makes them non-inheritable; AdditionalInheritedHandles wants them marked.
		if err := windows.SetHandleInformation(windows.Handle(h), windows.HANDLE_FLAG_INHERIT, windows.HANDLE_FLAG_INHERIT); err != nil {
			return nil, nil, fmt.Errorf("%w: making the driver's pipes inheritable: %v", ErrProcess, err)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{AdditionalInheritedHandles: handles}
	args = []string{"h" + strconv.FormatUint(uint64(handles[0]), 10), "h" + strconv.FormatUint(uint64(handles[1]), 10)}
	return args, func() (func(), error) { return killWithWorker(cmd.Process) }, nil
}

// killWithWorker puts p in a Job Object that kills everything in it when its handle closes,
// and returns the function that closes it.
func killWithWorker(p *os.Process) (release func(), err error) {
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return nil, fmt.Errorf("creating a job object for Blender: %w", err)
	}
	release = func() { windows.CloseHandle(job) }
	info := windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION{
		BasicLimitInformation: windows.JOBOBJECT_BASIC_LIMIT_INFORMATION{LimitFlags: windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE},
	}
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		release()
		return nil, fmt.Errorf("setting Blender's job object to end with the worker: %w", err)
	}
	h, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, uint32(p.Pid))
	if err != nil {
		release()
		return nil, fmt.Errorf("opening Blender's process: %w", err)
	}
	defer windows.CloseHandle(h)
	if err := windows.AssignProcessToJobObject(job, h); err != nil {
		release()
		return nil, fmt.Errorf("putting Blender in its job object: %w", err)
	}
	return release, nil
}

package cgroup

import "errors"

// Sentinel errors callers branch on with errors.Is. Every error this package
// returns wraps one of these or an OS error (for example syscall.EACCES), and
// its text names the controller, the path and the cause.
var (
	// ErrInvalidName: a group or lease name is not a single safe path
	// element, or the configured parent path is not a clean relative path.
	ErrInvalidName = errors.New("cgroup: invalid name")
	// ErrInvalidLimits: a Limits value is out of the kernel's range.
	ErrInvalidLimits = errors.New("cgroup: invalid limits")
	// ErrInvalidPid: a pid that can never be attached (<= 0, or mpsd itself
	// or one of its threads).
	ErrInvalidPid = errors.New("cgroup: invalid pid")
	// ErrInvalidCmd: Start was given a command it cannot start safely
	// (already started, or with SysProcAttr fields Start must own).
	ErrInvalidCmd = errors.New("cgroup: invalid command")
	// ErrNotExist: the lease cgroup does not exist.
	ErrNotExist = errors.New("cgroup: lease cgroup does not exist")
	// ErrExist: Create found the lease cgroup already there; use Open to
	// re-adopt it.
	ErrExist = errors.New("cgroup: lease cgroup already exists")
	// ErrNotEmpty: Delete found processes still in the lease; Kill first.
	ErrNotEmpty = errors.New("cgroup: lease cgroup still has processes")
	// ErrNoProcess: the process to attach or start has already exited.
	ErrNoProcess = errors.New("cgroup: no such process")
	// ErrControllerMissing: a controller the backend or the requested limits
	// need is not mounted (v1) or not available in cgroup.controllers (v2).
	ErrControllerMissing = errors.New("cgroup: controller not available")
	// ErrUnavailable: no usable cgroup hierarchy at the configured root.
	ErrUnavailable = errors.New("cgroup: hierarchy not available")
)

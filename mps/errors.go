package mps

import (
	"errors"
	"fmt"
)

// Sentinel errors callers branch on with errors.Is. Every error this package
// returns for a failed command is a *CommandError wrapping one of them (or a
// lower-level cause) with the command and the pipe directory.
var (
	// ErrNoDaemon: no control daemon listens on the pipe directory.
	ErrNoDaemon = errors.New("mps: no control daemon")
	// ErrDaemonQuitting: the daemon refused the command ("Cannot send command"):
	// it is quitting, or (seen with NVIDIA's daemon under churn) briefly busy.
	ErrDaemonQuitting = errors.New("mps: control daemon is quitting")
	// ErrAlreadyRunning: Start found a live daemon owning the pipe directory.
	ErrAlreadyRunning = errors.New("mps: a control daemon already owns the pipe directory")
	// ErrServerNotFound: the daemon knows no server with that pid.
	ErrServerNotFound = errors.New("mps: server not found")
	// ErrServerNotReady: the server exists but cannot answer yet (still
	// initializing); the real daemon prints nothing in that case.
	ErrServerNotReady = errors.New("mps: server not ready")
	// ErrUnknownCommand: the daemon does not know the command.
	ErrUnknownCommand = errors.New("mps: unknown command")
	// ErrUnsupported: this daemon's driver generation lacks the command and
	// there is no fallback (typed methods wrap ErrUnknownCommand too).
	ErrUnsupported = errors.New("mps: not supported by this control daemon")
	// ErrInvalidValue: the daemon rejected a value (it echoes its unchanged
	// old value) or was missing an argument.
	ErrInvalidValue = errors.New("mps: invalid value")
	// ErrPermission: the daemon refused the command for lack of privilege.
	ErrPermission = errors.New("mps: insufficient privilege")
	// ErrTimeout: the call's deadline passed; the client process was killed.
	ErrTimeout = errors.New("mps: timeout")
	// ErrUnexpectedOutput: the daemon answered with something this package
	// cannot parse.
	ErrUnexpectedOutput = errors.New("mps: unexpected output")
	// ErrClosed: the Daemon handle was closed.
	ErrClosed = errors.New("mps: daemon handle closed")
	// ErrUnverifiedDaemon: the process holding the pipe directory's
	// control_lock is not a control daemon this package may own (another
	// executable or uid, gone), or not the one Config.Expect names. Adopt
	// and Reclaim errors wrap it together with ErrNoDaemon.
	ErrUnverifiedDaemon = errors.New("mps: lock holder is not a verified control daemon")
	// ErrForeignLockHolder: a process of the daemons' own uid (root) that
	// does not run the control program holds control_lock. Nothing of the
	// pipe directory is touched; an operator must look. Start and Adopt
	// errors wrap it.
	ErrForeignLockHolder = errors.New("mps: control_lock is held by another program of the daemons' uid")
	// ErrLocalResources: this process (mpsd) could not start the control
	// program or open a pidfd or eventfd because it is out of file
	// descriptors, processes or memory itself (EMFILE, ENFILE, EAGAIN,
	// ENOMEM). It says nothing about the daemon: such an error never wraps
	// ErrTimeout, ErrNoDaemon or ErrDaemonQuitting.
	ErrLocalResources = errors.New("mps: mpsd is out of local resources")
)

// CommandError is a failed control command: which command, against which
// pipe directory, what the daemon printed, and why it failed (Err).
type CommandError struct {
	Command string
	PipeDir string
	Output  string
	Err     error
}

func (e *CommandError) Error() string {
	if e.Output == "" {
		return fmt.Sprintf("mps: %q on %s: %v", e.Command, e.PipeDir, e.Err)
	}
	return fmt.Sprintf("mps: %q on %s: %v (output %q)", e.Command, e.PipeDir, e.Err, e.Output)
}

func (e *CommandError) Unwrap() error { return e.Err }

// CUDAError is a non-zero CUDA result code printed by terminate_client.
type CUDAError struct{ Code int }

func (e *CUDAError) Error() string { return fmt.Sprintf("CUDA error %d", e.Code) }

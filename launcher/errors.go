package launcher

import (
	"errors"
	"strings"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
)

// Exit statuses of mps-launch besides the command's own (docs/architecture.md#mps-launchs-command-line-and-exit-statuses).
const (
	// ExitTempFail (EX_TEMPFAIL): the wait timed out, the requeue
	// attempts are used up, one of mpsd's limits was hit, mpsd is shutting
	// down (mpsctl shutdown ended the lease: the line printed says so), or
	// mpsd went away (restarting) and did not come back within
	// Config.ReconnectTimeout; trying later may work, and a batch system
	// may requeue the job (Slurm's RequeueExit=75).
	ExitTempFail = 75
	// ExitCancelled: the lease's owner or an admin cancelled it (mpsctl
	// cancel): its command was stopped (or never ran) and it is not to be
	// tried again; the line printed names who cancelled it. Not 75, so a
	// batch system that requeues on 75 does not bring a cancelled job
	// back.
	ExitCancelled = 122
	// ExitFailure: bad usage, no mpsd at the socket and none coming (no
	// socket, or one nothing listens on without its api.LiveMarker, before
	// mpsd ever answered), refused by policy, or any other launcher or
	// daemon error.
	ExitFailure = 125
	// ExitNotExecutable: the command exists but cannot be executed.
	ExitNotExecutable = 126
	// ExitNotFound: the command was not found.
	ExitNotFound = 127
)

var (
	// ErrUsage is wrapped by every ParseArgs error: bad flag, bad value,
	// missing command.
	ErrUsage = errors.New("launcher: usage")
	// ErrUnreachable is package client's: wrapped when mpsd's socket
	// cannot be connected to, or mpsd ended the connection before it
	// answered (reset, EOF, no response headers in time): what a
	// restarting mpsd looks like.
	ErrUnreachable = client.ErrUnreachable
	// ErrCommandNotFound is wrapped when the command is not on PATH or
	// its path does not exist.
	ErrCommandNotFound = errors.New("launcher: command not found")
	// ErrNotExecutable is wrapped when the command exists but cannot be
	// executed (no permission, a directory).
	ErrNotExecutable = errors.New("launcher: command not executable")
	// ErrProtocol is package client's: wrapped when mpsd's answers break
	// the protocol of package api.
	ErrProtocol = client.ErrProtocol
	// ErrLost is wrapped when mpsd stayed unreachable for
	// Config.ReconnectTimeout: after a stream ended, an attach failed, or
	// a first request found mpsd's socket but no mpsd answering. It is
	// temporary (ExitTempFail).
	ErrLost = errors.New("launcher: gave up on mpsd")
	// ErrUnsafeEnv is wrapped when the lease's environment would let MPS
	// run the command without its limits (mpsenv.ErrFallsOpen says how);
	// the command is not started.
	ErrUnsafeEnv = errors.New("launcher: the lease's MPS environment would not hold the command to its limits")
)

// ExitCode is the exit status mps-launch reports for err (never 0):
// ExitNotFound, ExitNotExecutable, ExitTempFail for ErrLost and temporary
// api errors, ExitCancelled for a cancel, otherwise ExitFailure.
func ExitCode(err error) int {
	var apiErr *api.Error
	switch {
	case errors.Is(err, ErrCommandNotFound):
		return ExitNotFound
	case errors.Is(err, ErrNotExecutable):
		return ExitNotExecutable
	case errors.Is(err, ErrLost):
		return ExitTempFail
	case errors.As(err, &apiErr) && apiErr.Code == api.CodeCancelled:
		return ExitCancelled
	case errors.As(err, &apiErr) && apiErr.Code.Temporary():
		return ExitTempFail
	}
	return ExitFailure
}

// message is err as the one line mps-launch prints after "mps-launch: ",
// without the package's prefixes (a wrapped error brings its own).
func message(err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, ErrUsage.Error()+": ")
	msg = strings.ReplaceAll(msg, ": launcher: ", ": ")
	return strings.TrimPrefix(msg, "launcher: ")
}

package mpsd

import "time"

// processes is the edge where mpsd looks up, by pid, a process it did not
// start and does not own: on a host a pidfd and /proc (procFS); in the
// core's simulation the simulated processes. The facts that confirm a
// culprit a server's log names (culprithint.go) are read through it.
type processes interface {
	// open holds the process that has pid now; an error: there is none.
	open(pid int) (process, error)
	// bootTicks is the time since boot in the unit of a process's start
	// time (clock ticks, userHZ a second): a process whose start time is
	// larger began after the call.
	bootTicks() (uint64, error)
}

// process is a process held by its pid: what it says is the held
// process's, even after the pid is taken again.
type process interface {
	// startTime is the process's start, in clock ticks after boot.
	startTime() uint64
	// alive: it has not exited (a zombie has).
	alive() bool
	// exitsWithin waits up to d for it to exit, and reports whether it
	// has.
	exitsWithin(d time.Duration) bool
	close()
}

// procFS is the host's processes: pidfds, and /proc mounted at root.
type procFS struct{ root string }

func (p procFS) open(pid int) (process, error) {
	h, err := openPid(p.root, pid)
	if err != nil {
		return nil, err
	}
	return h, nil
}

func (procFS) bootTicks() (uint64, error) { return bootTicks() }

func (h *pidHandle) startTime() uint64 { return h.start }

var _ processes = procFS{}

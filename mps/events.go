package mps

import (
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"
)

// EventKind says what happened to a daemon or one of its servers.
type EventKind int

// Event kinds.
const (
	DaemonExited      EventKind = iota + 1 // the control daemon process is gone (pidfd)
	ServerStarted                          // the daemon started a server (PID, UID)
	ServerReady                            // a server finished initializing
	ServerExited                           // a server process is gone (PID, ExitStatus/Signal)
	FatalException                         // a server hit a fatal exception and is shutting down (a record anyone may write: while one waits for the reader, more are dropped)
	ServerStartFailed                      // the daemon could not start a server for UID
	// ClientConnected: a CUDA client (PID, UID) asked the daemon for a
	// server. MPS logs a "NEW CLIENT" line per request, and a CUDA process
	// makes two (one per context; a pending client's first one says "Server
	// is not ready"), so expect it twice per client (docs/gpu-probe). Anyone
	// may write the record: while one waits for the reader, more are
	// dropped (the reader learns that clients came, not how many).
	ClientConnected
	// ServerFault: a server hit a fatal GPU error that it contains (Volta
	// and newer): it survives, but every one of its clients got a sticky
	// error and must be restarted. From server.log; PID is the server's.
	ServerFault
	// Barrier is no event of MPS: Daemon.Barrier queues it behind every
	// event found so far; the reader calls Ack once it has handled those.
	Barrier
	// UnverifiedRecord: a log record (or a get_server_list answer) named
	// a pid that is not a verified server of this daemon, so it was
	// dropped: a server start, ready, exit or fault line for a process
	// that is no child of the daemon running nvidia-cuda-mps-server (any
	// local user can write such lines into the daemon's log FIFO), or one
	// for a server gone before it could be checked. Message is the record,
	// PID the pid it named, Suppressed how many more were dropped before
	// it unreported (over the rate limit of 20 a second). Nothing is done
	// about it but counting.
	UnverifiedRecord
	// FaultCulprit: a server's log names the client whose fatal GPU
	// error it is about to handle ("Client {PID: C, Context: N}
	// encountered a fatal GPU error.", before its ServerFault record).
	// From server.log; PID is the server's (verified, KnownServer), Client
	// the pid the record names. Only a hint of whose fault it was: anyone
	// who reaches the log FIFO may write the record, naming anyone.
	// While one waits for the reader, more of the same server's are
	// folded into it (Suppressed): then the culprit is not known.
	FaultCulprit
)

func (k EventKind) String() string {
	switch k {
	case DaemonExited:
		return "daemon exited"
	case ServerStarted:
		return "server started"
	case ServerReady:
		return "server ready"
	case ServerExited:
		return "server exited"
	case FatalException:
		return "fatal exception"
	case ServerStartFailed:
		return "server failed to start"
	case ClientConnected:
		return "client connected"
	case ServerFault:
		return "server fault"
	case Barrier:
		return "barrier"
	case UnverifiedRecord:
		return "unverified record"
	case FaultCulprit:
		return "fault culprit"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// EventSource says how an event was learned.
type EventSource int

// Event sources.
const (
	SourcePidfd   EventSource = iota + 1 // process exit notification, immediate
	SourceLog                            // a control.log or server.log line
	SourceCommand                        // a command's answer (get_server_list)
)

func (s EventSource) String() string {
	switch s {
	case SourcePidfd:
		return "pidfd"
	case SourceLog:
		return "log"
	case SourceCommand:
		return "command"
	}
	return fmt.Sprintf("EventSource(%d)", int(s))
}

// Event is one lifecycle event of a daemon. Each server exit and the daemon's
// exit are reported once, by whichever source sees it first (pidfd, normally).
type Event struct {
	Kind EventKind
	Time time.Time // when it happened (log time) or was observed (pidfd)
	// PID is the daemon's (DaemonExited), the server's or the client's pid;
	// for FatalException the pid that logged it; 0 when unknown.
	PID int
	// Client, on FaultCulprit: the client pid the record names.
	Client int
	// UID of the server or client; -1 when unknown.
	UID int
	// ExitStatus is the exit code, -1 when unknown or killed by a signal.
	// MPS logs status 0 for a SIGKILLed server; pidfd events read the real
	// wait status from /proc while the process is still a zombie.
	ExitStatus int
	Signal     syscall.Signal // the killing signal, 0 when none or unknown
	Message    string         // the log message for FatalException and ServerStartFailed
	Source     EventSource
	// InServerLog: the event is a server.log line, which starts at
	// LogOffset in that file. A reader keeps how far it has handled such
	// events and passes that as Config.ServerLogOffset to the next handle,
	// so a line it never handled is read again.
	InServerLog bool
	LogOffset   int64
	// KnownServer, on ServerFault and FatalException: the record's pid is
	// a server of this daemon verified through a pidfd (child of the
	// daemon, running nvidia-cuda-mps-server), live or gone for at most a
	// few seconds. The record itself is still only a claim (its text is
	// anyone's): confirm a fault (get_server_status FAULT, an Xid) before
	// acting on it. A ServerFault is only ever reported with KnownServer
	// true; one naming another pid is an UnverifiedRecord. A
	// ServerStartFailed names no server (PID is 0), so KnownServer is
	// false for it: like every control.log line, anyone may have written it.
	KnownServer bool
	// Suppressed: the records this hint stands for beyond its own,
	// dropped without an event of their own: on UnverifiedRecord those
	// over its rate limit since the previous one; on any hint those of
	// its kind (and server) pushed while it waited (eventQueue).
	Suppressed int

	ack *barrierAck // Barrier's
}

type barrierAck struct {
	once sync.Once
	ch   chan struct{}
}

// Ack tells Daemon.Barrier's caller that the events before this Barrier
// are handled. It does nothing for other events and may be called twice.
func (e Event) Ack() {
	if e.ack != nil {
		e.ack.once.Do(func() { close(e.ack.ch) })
	}
}

func (e Event) String() string {
	return fmt.Sprintf("%s pid=%d client=%d uid=%d status=%d signal=%d source=%s known_server=%v %s", e.Kind, e.PID, e.Client, e.UID, e.ExitStatus, int(e.Signal), e.Source, e.KnownServer, e.Message)
}

// maxQueuedEvents bounds the hints (events learned from log lines, which
// anyone who can reach the log FIFO may write) waiting for a slow reader;
// beyond it the oldest hint is dropped (and counted) rather than blocking
// the watchers. Facts (the pidfd's exits, verified server starts, barriers)
// are never dropped: there are at most a few per watched process, so they
// need no bound of their own, and a flood of forged records must not push
// a server's exit out of the queue.
const maxQueuedEvents = 4096

// vital reports whether ev is a fact the reader must get: a daemon's or
// server's exit (from its pidfd), a server verified through a pidfd, or a
// barrier its caller waits on.
func (e Event) vital() bool {
	switch e.Kind {
	case DaemonExited, ServerStarted, ServerExited, Barrier:
		return true
	}
	return false
}

// coalesceKey is what a hint waits under: one hint of a key waits at a
// time, and one pushed while another of its key waits is folded into it
// (counted in its Suppressed). Ready records wait per server; NEW CLIENT,
// fatal-exception and start-failure records per kind. Not folded: a
// fault record (each real one is a fault of its own, which an Xid
// confirms one to one; mpsd bounds how many wait per server), and
// UnverifiedRecord (each names the record mps dropped, and mps sends at
// most 20 a second). Anyone who reaches the log FIFO may write any of
// them as fast as the daemon takes them: one waiting is as good as a
// thousand for the reader (a reason to reconcile, to check, to log or to
// count), and a thousand of one kind would push another server's records
// out of the hints' bound.
type coalesceKey struct {
	kind EventKind
	pid  int
}

func (e Event) coalesceKey() (coalesceKey, bool) {
	switch e.Kind {
	case ServerReady, FaultCulprit:
		return coalesceKey{e.Kind, e.PID}, true
	case ServerFault, UnverifiedRecord:
		return coalesceKey{}, false
	}
	return coalesceKey{kind: e.Kind}, true
}

// queued is an event with its place in the order of pushes.
type queued struct {
	seq uint64
	ev  Event
}

// eventQueue decouples producers (pidfd watchers, the log follower) from the
// reader, so a slow reader never delays exit detection. Facts and hints
// wait apart, so that dropping a hint is cheap and never touches a fact,
// and leave in the order they came.
type eventQueue struct {
	log    *slog.Logger
	out    chan Event
	notify chan struct{}
	mu     sync.Mutex
	seq    uint64
	facts  []queued
	hints  []*queued
	// waiting is the hint waiting under each key: a push of another of
	// its key is folded into it.
	waiting map[coalesceKey]*queued
	// dropped counts the hints dropped; droppedLogged is when a drop was
	// last logged (at most once a second: a flood must not fill the log).
	dropped       int
	droppedLogged time.Time
	closed        bool // finish has run: a late push is dropped (its barrier released)
}

func newEventQueue(log *slog.Logger) *eventQueue {
	return &eventQueue{log: log, out: make(chan Event), notify: make(chan struct{}, 1), waiting: map[coalesceKey]*queued{}}
}

// finish releases the barriers never delivered, once run and every
// producer have returned; a later push is dropped (its barrier released).
// A server.log event never delivered is read again by the next handle, from
// the offset its reader last handled (Event.LogOffset).
func (q *eventQueue) finish() {
	q.mu.Lock()
	left := q.facts
	q.facts, q.hints = nil, nil
	q.closed = true
	q.mu.Unlock()
	for _, e := range left {
		e.ev.Ack()
	}
}

func (q *eventQueue) push(ev Event) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		ev.Ack()
		return
	}
	q.seq++
	e := queued{seq: q.seq, ev: ev}
	key, folds := ev.coalesceKey()
	switch w := q.waiting[key]; {
	case ev.vital():
		q.facts = append(q.facts, e)
	case folds && w != nil:
		// One of its key waits already: it stands for this one too.
		w.ev.Suppressed += 1 + max(ev.Suppressed, 0)
		q.mu.Unlock()
		return
	default:
		if len(q.hints) >= maxQueuedEvents {
			q.forgetLocked(q.hints[0])
			q.hints = q.hints[1:]
			q.dropped++
			if now := time.Now(); now.Sub(q.droppedLogged) >= time.Second {
				q.droppedLogged = now
				q.log.Warn("mps: event reader too slow, dropped the oldest log-line events", "dropped_total", q.dropped)
			}
		}
		if folds {
			q.waiting[key] = &e
		}
		q.hints = append(q.hints, &e)
	}
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// popLocked takes the oldest waiting event, fact or hint.
func (q *eventQueue) popLocked() (queued, bool) {
	switch {
	case len(q.facts) > 0 && (len(q.hints) == 0 || q.facts[0].seq < q.hints[0].seq):
		e := q.facts[0]
		q.facts = q.facts[1:]
		return e, true
	case len(q.hints) > 0:
		e := q.hints[0]
		q.hints = q.hints[1:]
		q.forgetLocked(e)
		return *e, true
	}
	return queued{}, false
}

// forgetLocked takes the hint e, leaving the queue, off waiting: the next
// of its key waits again.
func (q *eventQueue) forgetLocked(e *queued) {
	if key, folds := e.ev.coalesceKey(); folds && q.waiting[key] == e {
		delete(q.waiting, key)
	}
}

// run forwards queued events to out until stop is closed, then closes out.
func (q *eventQueue) run(stop <-chan struct{}) {
	defer close(q.out)
	var next queued
	var have bool
	defer func() {
		// The one in flight goes back at the head, for finish.
		if have {
			q.mu.Lock()
			if next.ev.vital() {
				q.facts = append([]queued{next}, q.facts...)
			}
			q.mu.Unlock()
		}
	}()
	for {
		// Pop before sending so that overflow dropping in push never races
		// with the event in flight.
		q.mu.Lock()
		next, have = q.popLocked()
		q.mu.Unlock()
		if !have {
			select {
			case <-q.notify:
				continue
			case <-stop:
				return
			}
		}
		select {
		case q.out <- next.ev:
			have = false
		case <-stop:
			return
		}
	}
}

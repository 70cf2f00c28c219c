package mps

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// proc is a watched process: a pidfd, so that exit is noticed at once and
// signals never hit a recycled pid.
type proc struct {
	pid  int
	done chan struct{} // closed when the process has exited

	mu     sync.Mutex
	fd     int // -1 once closed
	status int
	sig    syscall.Signal
}

// signal sends sig through the pidfd; false if the process is already gone.
func (p *proc) signal(sig unix.Signal) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fd < 0 {
		return false
	}
	return unix.PidfdSendSignal(p.fd, sig, nil, 0) == nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// watchFD watches the process behind pidfd fd (owned from now on; the
// caller verified it). It returns nil, closing fd, when the handle is
// closed. register runs under d.mu before the watcher starts, so the
// process is recorded before its exit can be seen; onExit runs once, on
// the watcher goroutine, when it exits.
func (d *Daemon) watchFD(pid, fd int, register, onExit func(*proc)) *proc {
	p := &proc{pid: pid, fd: fd, done: make(chan struct{}), status: -1}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		unix.Close(fd)
		return nil
	}
	if register != nil {
		register(p)
	}
	d.wg.Add(1) // under mu, so Close's Wait never races an Add
	d.mu.Unlock()
	go func() {
		defer d.wg.Done()
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(d.stopFD), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if err != nil && !errors.Is(err, unix.EINTR) {
				d.log.Error("mps: poll pidfd", "pid", pid, "err", err)
				break
			}
			if fds[0].Revents != 0 || fds[1].Revents != 0 {
				break
			}
		}
		exitedNow := fds[0].Revents != 0
		if exitedNow {
			// The wait status: from /proc while the process is a zombie
			// (or being reaped), else, once its parent has reaped it,
			// from the pidfd (Linux 6.15); on older kernels a process
			// reaped first stays unknown.
			if st, err := readProcStat(d.cfg.ProcRoot, pid); err == nil && (st.state == 'Z' || st.state == 'X') {
				p.status, p.sig = exitFromWaitStatus(st.exitCode)
			} else if ws, ok := pidfdExit(fd); ok {
				p.status, p.sig = exitFromWaitStatus(ws)
			}
		}
		p.mu.Lock()
		unix.Close(p.fd)
		p.fd = -1
		p.mu.Unlock()
		if exitedNow {
			close(p.done)
			onExit(p)
		}
	}()
	return p
}

// knownGrace is how long after its exit a server still counts as known:
// its last records may be read after the pidfd told of its end.
const knownGrace = 5 * time.Second

// onLogLine handles one control.log line from the follower. Every line
// is a claim anyone could have written into the log FIFO: it names a
// process that is checked through a pidfd before anything is done for it,
// and a server's exit is taken only from its pidfd.
func (d *Daemon) onLogLine(line string, _ int64) {
	l, ok := ParseLogLine(line)
	if !ok || l.Source != "Control" {
		return
	}
	if v, ok := scanBinaryVersion(l.Message); ok {
		d.noteBinaryVersion(l.PID, v)
		return
	}
	if status, ok := scanExitStatus(l.Message); ok {
		// Only a hint for the daemon's own exit status, when the pidfd
		// could not read it; still, only in the daemon's name.
		if l.PID == d.pid {
			d.mu.Lock()
			d.lastExitStatus = status
			d.mu.Unlock()
		}
		return
	}
	ev, ok := logEvent(l)
	if !ok {
		return
	}
	record := strings.TrimRight(line, "\r\n")
	if d.log.Enabled(context.Background(), slog.LevelDebug) {
		// Asked first: the event would be copied for every record.
		d.log.Debug("mps: log event", "event", ev)
	}
	switch ev.Kind {
	case ServerStarted:
		d.serverSeen(ev.PID, l.Time, SourceLog, record)
		return
	case ServerReady:
		if !d.knownServer(ev.PID, record) {
			return
		}
		d.mu.Lock()
		d.ready[ev.PID] = true
		d.mu.Unlock()
	case ServerExited:
		// The pidfd reports a verified server's exit; a line about any
		// other pid is a forgery or a server never verified.
		if !d.recentServer(ev.PID) {
			d.unverified(ev.PID, record, SourceLog, errors.New("no verified server of this daemon"))
		}
		return
	case FatalException:
		ev.KnownServer = ev.PID > 0 && d.recentServer(ev.PID)
	}
	d.events.push(ev)
}

// onServerLogLine handles one server.log line from its follower.
func (d *Daemon) onServerLogLine(line string, start int64) {
	l, ok := ParseLogLine(line)
	if !ok {
		return
	}
	if ev, ok := serverLogEvent(l); ok {
		ev.InServerLog, ev.LogOffset = true, start
		if !d.knownServer(ev.PID, strings.TrimRight(line, "\r\n")) {
			return
		}
		ev.KnownServer = true
		d.log.Debug("mps: server log event", "event", ev)
		d.events.push(ev)
	}
}

func scanExitStatus(m string) (int, bool) {
	var n int
	return n, scan1(m, "Exit with status %d", &n)
}

// recentServer reports whether pid is a verified server of this daemon,
// live or gone within knownGrace.
func (d *Daemon) recentServer(pid int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p := d.servers[pid]; p != nil {
		return true
	}
	at, gone := d.exited[pid]
	return gone && time.Since(at) < knownGrace
}

// knownServer reports whether a record naming pid concerns a verified
// server of this daemon: known already, or verified now (a record may be
// read before the server's start line). Otherwise the record is reported
// as UnverifiedRecord and false returned.
func (d *Daemon) knownServer(pid int, record string) bool {
	if d.recentServer(pid) {
		return true
	}
	return d.serverSeen(pid, time.Now(), SourceLog, record)
}

// Unverified records are reported at most unverifiedRate a second (bursts
// of unverifiedBurst): anyone can write them as fast as the FIFO takes
// them, and a flood must neither fill the log nor push real events out of
// the bounded queue. The ones over the rate are counted in the next
// reported one's Suppressed.
const (
	unverifiedRate  = 20
	unverifiedBurst = 100
)

// unverified drops a record naming pid: logged and reported (rate
// limited), never acted on.
func (d *Daemon) unverified(pid int, record string, src EventSource, why error) {
	now := time.Now()
	d.mu.Lock()
	d.unverifiedTokens = min(unverifiedBurst, d.unverifiedTokens+now.Sub(d.unverifiedAt).Seconds()*unverifiedRate)
	d.unverifiedAt = now
	if d.unverifiedTokens < 1 {
		d.unverifiedSuppressed++
		d.mu.Unlock()
		return
	}
	d.unverifiedTokens--
	suppressed := d.unverifiedSuppressed
	d.unverifiedSuppressed = 0
	d.mu.Unlock()
	d.log.Warn("mps: record names no verified server of this daemon; ignored", "pid", pid, "record", record, "reason", why, "suppressed_before", suppressed)
	d.events.push(Event{Kind: UnverifiedRecord, Time: now, PID: pid, UID: -1, ExitStatus: -1, Source: src, Message: record, Suppressed: suppressed})
}

// serverSeen registers a server pid learned from the log or a command,
// once verified through a pidfd (verifyServer): it is watched, reported
// as ServerStarted once per incarnation, and only then ever signalled. A
// pid that fails the check is reported as UnverifiedRecord (record says
// what named it). It reports whether pid is a verified live server.
func (d *Daemon) serverSeen(pid int, at time.Time, src EventSource, record string) bool {
	var mine chan struct{}
	for mine == nil {
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			return false
		}
		if p := d.servers[pid]; p != nil && !p.exited() {
			d.mu.Unlock()
			return true
		}
		if ch, busy := d.verifying[pid]; busy {
			// Another source names it at the same time: its check decides.
			d.mu.Unlock()
			<-ch
			continue
		}
		mine = make(chan struct{})
		d.verifying[pid] = mine
		d.mu.Unlock()
	}
	defer func() {
		d.mu.Lock()
		delete(d.verifying, pid)
		d.mu.Unlock()
		close(mine)
	}()

	fd, uid, err := d.verifyServer(pid)
	if err != nil {
		d.mu.Lock()
		exitAt, gone := d.exited[pid]
		d.mu.Unlock()
		if gone && errors.Is(err, errProcGone) && time.Since(exitAt) < knownGrace {
			// The start line of a server already reported gone (it died
			// before the line was read).
			d.log.Debug("mps: server start line after its exit", "pid", pid, "source", src)
			return false
		}
		if errors.Is(err, ErrLocalResources) {
			d.log.Error("mps: cannot verify a server: out of local resources", "pid", pid, "record", record, "err", err)
			return false
		}
		d.unverified(pid, record, src, err)
		return false
	}

	// Watch before announcing, so whoever reacts to ServerStarted (by killing
	// the server, say) is sure to get its exit from the pidfd.
	started := Event{Kind: ServerStarted, Time: at, PID: pid, UID: uid, ExitStatus: -1, Source: src}
	var announce sync.Once
	announceStart := func() { announce.Do(func() { d.events.push(started) }) }
	p := d.watchFD(pid, fd, func(p *proc) {
		// A new incarnation on a pid once used by another server.
		delete(d.exited, pid)
		d.servers[pid] = p
	}, func(p *proc) {
		announceStart()
		d.serverGone(p, Event{Kind: ServerExited, Time: time.Now(), PID: p.pid, UID: -1, ExitStatus: p.status, Signal: p.sig, Source: SourcePidfd})
	})
	if p == nil {
		return false
	}
	announceStart()
	return true
}

// serverGone reports a verified server's exit (from its pidfd) once.
func (d *Daemon) serverGone(p *proc, ev Event) {
	d.mu.Lock()
	if len(d.exited) > 4096 {
		clear(d.exited) // bounded memory; only the grace of very old pids is lost
	}
	if d.servers[ev.PID] == p {
		d.exited[ev.PID] = time.Now()
		delete(d.servers, ev.PID)
		delete(d.ready, ev.PID)
	}
	d.mu.Unlock()
	d.events.push(ev)
}

// procUID reads the real uid of pid from /proc; -1 when unknown. An error
// reading the file is returned, wrapping ErrLocalResources when this
// process is out of descriptors or memory.
func procUID(procRoot string, pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "status"))
	if err != nil {
		return -1, localResources(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				if uid, err := strconv.Atoi(f[0]); err == nil {
					return uid, nil
				}
			}
		}
	}
	return -1, nil
}

// liveServers returns the watched servers that have not exited.
func (d *Daemon) liveServers() []*proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*proc
	for _, p := range d.servers {
		if p != nil && !p.exited() {
			out = append(out, p)
		}
	}
	return out
}

func (d *Daemon) String() string {
	return fmt.Sprintf("mps daemon pid %d on %s", d.pid, d.cfg.PipeDir)
}

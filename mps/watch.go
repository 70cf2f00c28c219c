package mps

import (
	"errors"
	"fmt"
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

// watch starts watching pid. It returns nil when the process is already
// gone; onExit runs once, on the watcher goroutine, when it exits.
func (d *Daemon) watch(pid int, onExit func(*proc)) *proc {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		if !errors.Is(err, unix.ESRCH) {
			d.log.Warn("mps: pidfd_open", "pid", pid, "err", err)
		}
		return nil
	}
	p := &proc{pid: pid, fd: fd, done: make(chan struct{}), status: -1}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		unix.Close(fd)
		return nil
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
			// Read the wait status while the process is still a zombie (its
			// parent may reap it any moment; then it stays unknown).
			if st, err := readProcStat(d.cfg.ProcRoot, pid); err == nil && st.state == 'Z' {
				p.status, p.sig = exitFromWaitStatus(st.exitCode)
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

// onLogLine handles one control.log line from the follower.
func (d *Daemon) onLogLine(line string, _ int64) {
	l, ok := ParseLogLine(line)
	if !ok || l.Source != "Control" {
		return
	}
	if pid, ok := scanExitStatus(l.Message); ok {
		d.mu.Lock()
		d.lastExitStatus = pid
		d.mu.Unlock()
		return
	}
	ev, ok := logEvent(l)
	if !ok {
		return
	}
	d.log.Debug("mps: log event", "event", ev)
	switch ev.Kind {
	case ServerStarted:
		d.serverSeen(ev.PID, ev.UID, l.Time, SourceLog)
		return
	case ServerReady:
		d.mu.Lock()
		d.ready[ev.PID] = true
		d.mu.Unlock()
	case ServerExited:
		d.serverGone(ev)
		return
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
		d.log.Debug("mps: server log event", "event", ev)
		d.events.push(ev)
	}
}

func scanExitStatus(m string) (int, bool) {
	var n int
	return n, scan1(m, "Exit with status %d", &n)
}

// serverSeen registers a server pid learned from the log or a command:
// emits ServerStarted once per incarnation and watches it.
func (d *Daemon) serverSeen(pid, uid int, at time.Time, src EventSource) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	if _, live := d.servers[pid]; live {
		d.mu.Unlock()
		return
	}
	if exitAt, gone := d.exited[pid]; gone {
		// The start line of a server already reported gone (it died before
		// the line was read), unless the pid was recycled since.
		if src != SourceLog || !at.After(exitAt.Add(time.Second)) {
			d.mu.Unlock()
			d.log.Debug("mps: server start line after its exit", "pid", pid, "source", src)
			return
		}
		delete(d.exited, pid)
	}
	if uid < 0 {
		uid = procUID(d.cfg.ProcRoot, pid)
	}
	d.servers[pid] = nil // reserve: a concurrent serverSeen must not double-emit
	d.mu.Unlock()

	// Watch before announcing, so whoever reacts to ServerStarted (by killing
	// the server, say) is sure to get its exit from the pidfd.
	started := Event{Kind: ServerStarted, Time: at, PID: pid, UID: uid, ExitStatus: -1, Source: src}
	var announce sync.Once
	announceStart := func() { announce.Do(func() { d.events.push(started) }) }
	p := d.watch(pid, func(p *proc) {
		announceStart()
		d.serverGone(Event{Kind: ServerExited, Time: time.Now(), PID: p.pid, UID: -1, ExitStatus: p.status, Signal: p.sig, Source: SourcePidfd})
	})
	announceStart()
	d.mu.Lock()
	if p == nil {
		d.mu.Unlock()
		d.serverGone(Event{Kind: ServerExited, Time: time.Now(), PID: pid, UID: -1, ExitStatus: -1, Source: SourcePidfd})
		return
	}
	if cur, ok := d.servers[pid]; ok && cur == nil {
		d.servers[pid] = p
	}
	d.mu.Unlock()
}

// serverGone reports a server's exit once, whichever source sees it first.
func (d *Daemon) serverGone(ev Event) {
	d.mu.Lock()
	if _, done := d.exited[ev.PID]; done {
		d.mu.Unlock()
		return
	}
	if len(d.exited) > 4096 {
		clear(d.exited) // bounded memory; only dedup of very old pids is lost
	}
	d.exited[ev.PID] = time.Now()
	delete(d.servers, ev.PID)
	delete(d.ready, ev.PID)
	d.mu.Unlock()
	d.events.push(ev)
}

// procUID reads the real uid of pid from /proc; -1 when unknown.
func procUID(procRoot string, pid int) int {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "status"))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				if uid, err := strconv.Atoi(f[0]); err == nil {
					return uid
				}
			}
		}
	}
	return -1
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

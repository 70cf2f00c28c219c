package control

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/cstr"
	"github.com/mpsd/mpsd/internal/mpsemu/ctlwire"
	"github.com/mpsd/mpsd/internal/mpsemu/emuwire"
	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
)

// Output and log texts of the commands, as NVIDIA's daemon prints them.
const (
	msgPIDRequired     = "A server PID is required"
	msgUIDRequired     = "A user id (UID) is required to start a new server"
	msgNotFound        = "Server %d not found"
	msgNotFoundBang    = "Server %d not found!"
	msgBusy            = "Server %d is <busy>"
	msgInvalidPercent  = "Invalid percentage, expected between (0.0, 100.0]"
	msgInvalidOrdinal  = "Invalid device ordinal!"
	msgNoDefaultPinned = "No default pinned memory limit set for the device!"
	msgInvalidPriority = "Invalid priority value - must be 0 or 1!"
	msgQuitPrivilege   = "Not enough privilege to execute quit command"
	msgUnknown         = "Unknown command \"%s\""
	msgInvalidProcess  = "Invalid process %d!"
	msgRemovedShm      = "Removed Shm file at "
)

// parsePercent is how the daemon reads a thread percentage: strtod, then
// (0, 100].
func parsePercent(s string) (float64, bool) {
	p, n := cstr.Strtod(s)
	return p, n > 0 && cstr.ValidPercent(p)
}

// scanIntDefault is sscanf("%d") into a variable that starts at 0.
func scanIntDefault(s string) int32 {
	v, _, _ := cstr.ScanInt(s)
	return v
}

// scanInts is sscanf("%d %d ...") into variables that start at 0: it stops
// at the first field that does not convert, leaving the rest 0. It also
// returns what follows the last converted field.
func scanInts(s string, n int) ([]int32, string, bool) {
	out := make([]int32, n)
	for i := range out {
		v, rest, ok := cstr.ScanInt(s)
		if !ok {
			return out, "", false
		}
		out[i], s = v, rest
	}
	return out, s, true
}

func (d *Daemon) acceptUI(l *net.UnixListener) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		go d.serveUI(ctlwire.NewConn(c))
	}
}

// serveUI runs one nvidia-cuda-mps-control client session.
func (d *Daemon) serveUI(c *ctlwire.Conn) {
	d.mu.Lock()
	d.logf("Accepting connection...")
	d.mu.Unlock()
	cred, kind, err := c.Accept()
	if err != nil {
		if errors.Is(err, ctlwire.ErrNoCredentials) {
			d.mu.Lock()
			d.logf("User did not send valid credentials")
			d.mu.Unlock()
		}
		c.Close()
		return
	}
	if kind != ctlwire.KindUI {
		d.mu.Lock()
		d.logf("Unknown type of connection")
		d.mu.Unlock()
		c.Close()
		return
	}
	d.mu.Lock()
	d.logf("NEW UI")
	d.mu.Unlock()
	var deferred []mpslog.Record
	// flush writes the session's deferred lines, stamped now.
	flush := func() {
		for _, r := range deferred {
			r.Time = time.Now()
			d.record(r)
		}
		deferred = nil
	}
	for {
		line, end, err := c.ReadCommand()
		if err != nil {
			d.mu.Lock()
			if !d.finished {
				d.logf("UI closed")
			}
			flush()
			d.mu.Unlock()
			c.Close()
			return
		}
		if end {
			d.mu.Lock()
			if d.sched.Quitting() {
				// While it waits for its servers NVIDIA's daemon no
				// longer ends sessions: the caller hangs until it exits.
				flush()
				d.mu.Unlock()
				continue
			}
			d.logf("UI closed")
			flush()
			d.mu.Unlock()
			_ = c.WriteStatus(0)
			c.Close()
			return
		}
		d.mu.Lock()
		d.deferred = &deferred
		d.execLocked(c, cred.Uid, line)
		d.deferred = nil
		d.mu.Unlock()
	}
}

// session is one command's view of its caller.
type session struct {
	d   *Daemon
	c   uiConn
	uid uint32
}

// say prints s to the caller and logs it.
func (s session) say(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.d.logf("%s", msg)
	_ = s.c.WriteLine(msg)
}

// note only logs.
func (s session) note(format string, args ...any) { s.d.logf(format, args...) }

func (s session) root() bool { return s.uid == 0 }

// mayChangeDefaults: root or the daemon's own user (550 and newer check).
func (s session) mayChangeDefaults() bool {
	if !s.d.gen.SettingsNeedPrivilege() || s.root() || s.uid == s.d.uid {
		return true
	}
	s.say("%s", s.d.gen.Insufficient(privSettings, s.uid))
	return false
}

// execLocked runs one command line as the caller sent it, its newline
// included (which the "Cmd:" record keeps, as NVIDIA's does); d.mu is
// held.
func (d *Daemon) execLocked(c uiConn, uid uint32, line string) {
	s := session{d: d, c: c, uid: uid}
	d.logf("Cmd:%s", line)
	line = strings.TrimSuffix(line, "\n")
	name, args, _ := cstr.ScanToken(line)
	switch name {
	case "get_server_list":
		for _, sv := range d.sched.Servers() {
			s.say("%d", sv.PID)
		}
	case "get_server_status":
		if !d.gen.HasServerStatus() {
			s.say(msgUnknown, name)
			return
		}
		pid, _, ok := cstr.ScanInt(args)
		if !ok {
			s.say(msgPIDRequired)
			return
		}
		if sv := d.lookup(s, pid); sv != nil {
			s.say("%s", d.status(sv))
		}
	case "start_server":
		d.cmdStartServer(s, args)
	case "shutdown_server":
		d.cmdShutdownServer(s, args)
	case "get_client_list":
		sv := d.lookup(s, scanIntDefault(args))
		if sv == nil || sv.link == nil {
			return
		}
		if r, err := d.rpc(sv, emuwire.Msg{Op: emuwire.OpClients}); err == nil {
			for _, p := range r.PIDs {
				s.say("%d", p)
			}
		}
	case "terminate_client":
		d.cmdTerminateClient(s, args)
	case "set_default_active_thread_percentage":
		if !s.mayChangeDefaults() {
			return
		}
		if p, ok := parsePercent(args); ok {
			d.defaultSM = p
		} else {
			s.note(msgInvalidPercent)
		}
		s.say("%s", cstr.FormatPercent(d.defaultSM))
	case "get_default_active_thread_percentage":
		s.say("%s", cstr.FormatPercent(d.defaultSM))
	case "set_active_thread_percentage", "get_active_thread_percentage":
		d.cmdServerPercent(s, name, args)
	case "set_default_device_pinned_mem_limit":
		if !s.mayChangeDefaults() {
			return
		}
		var dev int32
		val := ""
		if v, rest, ok := cstr.ScanInt(args); ok {
			dev = v
			val, _, _ = cstr.ScanToken(rest)
		}
		if dev < 0 || dev >= maxDevices {
			s.note(msgInvalidOrdinal)
			return
		}
		d.defaultPinned[dev] = cstr.ParsePinnedLimit(val)
		if d.gen.EchoesPinnedDefault() {
			s.note("set_default_device_pinned_mem_limit %d %s.", dev, val)
		}
	case "get_default_device_pinned_mem_limit":
		dev := scanIntDefault(args)
		switch {
		case dev < 0 || dev >= maxDevices:
			s.note(msgInvalidOrdinal)
		case d.defaultPinned[dev] == 0:
			s.note(msgNoDefaultPinned)
		default:
			s.say("%s", cstr.FormatPinnedLimit(d.defaultPinned[dev]))
		}
	case "set_device_pinned_mem_limit", "get_device_pinned_mem_limit":
		d.cmdServerPinned(s, name, args)
	case "set_default_client_priority":
		if !s.mayChangeDefaults() {
			return
		}
		p := scanIntDefault(args)
		if p != 0 && p != 1 {
			s.say(msgInvalidPriority)
			return
		}
		d.priority = int(p)
	case "get_default_client_priority":
		s.say("%d", d.priority)
	case "get_device_client_list":
		pid := scanIntDefault(args)
		var targets []*srv
		if pid != 0 {
			sv := d.lookup(s, pid)
			if sv == nil {
				return
			}
			targets = []*srv{sv}
		} else {
			for _, sv := range d.sched.Servers() {
				targets = append(targets, srvOf(sv))
			}
		}
		for _, sv := range targets {
			if sv.link == nil {
				s.note(msgBusy, sv.PID)
				continue
			}
			if r, err := d.rpc(sv, emuwire.Msg{Op: emuwire.OpDeviceList}); err == nil {
				for _, p := range r.PIDs {
					s.say("%d", p)
				}
			}
		}
	case "quit":
		d.cmdQuit(s, args)
	default:
		s.say(msgUnknown, name)
	}
}

// lookup finds a running server by pid, or says it is not found.
func (d *Daemon) lookup(s session, pid int32) *srv {
	for _, sv := range d.sched.Servers() {
		if int32(sv.PID) == pid {
			return srvOf(sv)
		}
	}
	s.say(msgNotFound, pid)
	return nil
}

func (d *Daemon) status(sv *srv) string {
	if sv.link == nil {
		return "INITIALIZING"
	}
	r, err := d.rpc(sv, emuwire.Msg{Op: emuwire.OpStatus})
	if err != nil {
		return "INITIALIZING"
	}
	return r.Text
}

// live finds a running server that is ready, noting "<busy>" for one that
// is not (NVIDIA's daemon cannot ask a server that has not connected).
func (d *Daemon) live(s session, pid int32) *srv {
	sv := d.lookup(s, pid)
	if sv == nil {
		return nil
	}
	if sv.link == nil {
		s.note(msgBusy, sv.PID)
		return nil
	}
	return sv
}

func (d *Daemon) cmdStartServer(s session, args string) {
	flag, rest, _ := cstr.ScanToken(args)
	uid, _, ok := cstr.ScanInt(rest)
	if flag != "-uid" || !ok {
		s.say(msgUIDRequired)
		return
	}
	if !s.root() && uint32(uid) != s.uid {
		s.say("%s", d.gen.Insufficient(privStart, s.uid))
		return
	}
	d.sched.StartServer(uid)
}

func (d *Daemon) cmdShutdownServer(s session, args string) {
	pid, rest, ok := cstr.ScanInt(args)
	force := false
	if ok {
		tok, _, _ := cstr.ScanToken(rest)
		force = tok == "-f"
	}
	sv := d.lookup(s, pid)
	if sv == nil {
		return
	}
	if !s.root() && uint32(sv.UID) != s.uid {
		s.say("%s", d.gen.Insufficient(privShutdown, s.uid))
		return
	}
	if force {
		d.forceShutdownLocked(sv)
		return
	}
	// Seen on a GPU (docs/gpu-probe); NVIDIA's daemon logs nothing for a
	// server that never became ready, which it cannot ask.
	if sv.link != nil {
		d.logf("Try shutting down server %d, backoff is disabled", sv.PID)
	}
	d.askShutdownLocked(sv)
}

// forceShutdownLocked is shutdown_server -f and quit -t: SIGINT, never more.
func (d *Daemon) forceShutdownLocked(sv *srv) {
	if d.gen.LogsForceShutdown() {
		d.logf("Force shutting down server %d", sv.PID)
	}
	_ = sv.cmd.Process.Signal(syscall.SIGINT)
}

// askShutdownLocked asks a ready server to exit once its clients are gone.
// A server that never connected cannot be asked; NVIDIA's daemon waits.
func (d *Daemon) askShutdownLocked(sv *srv) { d.sched.AskShutdown(sv.Server) }

func (d *Daemon) cmdTerminateClient(s session, args string) {
	v, _, _ := scanInts(args, 2)
	spid, cpid := v[0], v[1]
	sv := d.lookup(s, spid)
	if sv != nil && sv.link == nil {
		s.note(msgBusy, sv.PID)
		sv = nil
	}
	if sv == nil {
		s.say(msgNotFoundBang, spid)
		s.say("1")
		return
	}
	if !s.root() && uint32(sv.UID) != s.uid {
		s.say("%s", d.gen.Insufficient(privTerminate, s.uid))
		s.say("1")
		return
	}
	if _, err := d.rpc(sv, emuwire.Msg{Op: emuwire.OpTerminate, PID: int(cpid)}); err != nil {
		s.note(msgInvalidProcess, cpid)
		s.say("1")
		return
	}
	s.say("0")
}

func (d *Daemon) cmdServerPercent(s session, name, args string) {
	pid, rest, _ := cstr.ScanInt(args)
	sv := d.live(s, pid)
	if sv == nil {
		return
	}
	if name == "get_active_thread_percentage" {
		if r, err := d.rpc(sv, emuwire.Msg{Op: emuwire.OpGetSM}); err == nil {
			s.say("%s", cstr.FormatPercent(r.SM))
		}
		return
	}
	if !s.root() && uint32(sv.UID) != s.uid {
		s.say("%s", d.gen.Insufficient(privServerSettings, s.uid))
		return
	}
	req := emuwire.Msg{Op: emuwire.OpGetSM}
	if p, ok := parsePercent(rest); ok {
		req = emuwire.Msg{Op: emuwire.OpSetSM, SM: p}
	} else {
		s.note(msgInvalidPercent)
	}
	if r, err := d.rpc(sv, req); err == nil {
		s.say("%s", cstr.FormatPercent(r.SM))
	}
}

func (d *Daemon) cmdServerPinned(s session, name, args string) {
	v, rest, ok := scanInts(args, 2)
	sv := d.live(s, v[0])
	if sv == nil {
		return
	}
	dev := v[1]
	if name == "set_device_pinned_mem_limit" && !s.root() && uint32(sv.UID) != s.uid {
		s.say("%s", d.gen.Insufficient(privServerSettings, s.uid))
		return
	}
	if dev < 0 || dev >= maxDevices {
		s.note(msgInvalidOrdinal)
		return
	}
	if name == "get_device_pinned_mem_limit" {
		r, err := d.rpc(sv, emuwire.Msg{Op: emuwire.OpGetPinned, Dev: int(dev)})
		switch {
		case err != nil:
			s.note(msgInvalidOrdinal)
		case r.Bytes != 0:
			s.say("%s", cstr.FormatPinnedLimit(r.Bytes))
		}
		return
	}
	val := ""
	if ok {
		val, _, _ = cstr.ScanToken(rest)
	}
	if _, err := d.rpc(sv, emuwire.Msg{Op: emuwire.OpSetPinned, Dev: int(dev), Bytes: cstr.ParsePinnedLimit(val)}); err != nil {
		s.note(msgInvalidOrdinal)
	}
}

// cmdQuit: stop taking new work, drop queued server starts, ask servers to
// exit (with -t T, SIGINT them after T seconds, and nothing stronger ever),
// and exit once none is left.
func (d *Daemon) cmdQuit(s session, args string) {
	if !s.root() && s.uid != d.uid {
		s.say(msgQuitPrivilege)
		return
	}
	var timeout uint32
	hasTimeout := false
	if tok, rest, ok := cstr.ScanToken(args); ok && tok == "-t" {
		timeout, _, hasTimeout = cstr.ScanUint(rest)
	}
	if hasTimeout {
		s.note("quit command issued with timeout of %d", timeout)
	}
	d.quitConns = append(d.quitConns, s.c)
	if !d.sched.Quitting() {
		d.exitsAtQuit = d.serverExits
		// The scheduler refuses every waiting client and asks every
		// ready server to exit.
		dropped, none := d.sched.Quit()
		for range dropped {
			s.note(msgRemovedShm)
		}
		if none {
			d.quitImmediate = true
			d.finishLocked()
			return
		}
	}
	if !hasTimeout {
		return
	}
	if d.quitTimer != nil {
		d.quitTimer.Stop()
	}
	if timeout == 0 {
		d.forceAllLocked()
		return
	}
	d.quitTimer = time.AfterFunc(time.Duration(timeout)*time.Second, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if !d.finished {
			d.forceAllLocked()
		}
	})
}

func (d *Daemon) forceAllLocked() {
	for _, sv := range d.sched.Servers() {
		d.forceShutdownLocked(srvOf(sv))
	}
}

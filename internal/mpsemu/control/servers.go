package control

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/emuwire"
	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
	"github.com/mpsd/mpsd/internal/mpsemu/mpssched"
)

// rpcTimeout bounds a request to a server; a server that does not answer
// is treated as not ready rather than hanging the daemon.
const rpcTimeout = 2 * time.Second

var errNoLink = errors.New("control: server not connected")

// rpc sends one request to a ready server and waits for its answer.
// d.mu is held: commands are handled one at a time, as by NVIDIA's daemon.
func (d *Daemon) rpc(sv *srv, m emuwire.Msg) (emuwire.Msg, error) {
	if sv.link == nil {
		return emuwire.Msg{}, errNoLink
	}
	sv.nextID++
	m.ID = sv.nextID
	if err := sv.link.Send(m); err != nil {
		return emuwire.Msg{}, err
	}
	t := time.NewTimer(rpcTimeout)
	defer t.Stop()
	for {
		select {
		case r := <-sv.replies:
			if r.ID != m.ID {
				continue // a late answer to a request that timed out
			}
			if r.Op == emuwire.OpError {
				return r, fmt.Errorf("control: server %d: %s (%d)", sv.PID, r.Text, r.Err)
			}
			return r, nil
		case <-sv.linkDone:
			return emuwire.Msg{}, errNoLink
		case <-t.C:
			return emuwire.Msg{}, fmt.Errorf("control: server %d did not answer %s", sv.PID, m.Op)
		}
	}
}

// lookPath finds name in the PATH of env (the daemon's own environment,
// which the servers inherit).
func lookPath(name string, env []string) (string, bool) {
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// schedHost carries out the scheduler's decisions (mpssched.Host); d.mu
// is held.
type schedHost struct{ d *Daemon }

func (h schedHost) StartServer(uid int32) *mpssched.Server {
	if sv := h.d.startServerLocked(uid); sv != nil {
		return sv.Server
	}
	return nil
}

func (h schedHost) AskShutdown(sv *mpssched.Server) {
	_, _ = h.d.rpc(srvOf(sv), emuwire.Msg{Op: emuwire.OpShutdown})
}

func (h schedHost) HandOver(c *mpssched.Client, sv *mpssched.Server) {
	conn := clientConn(c)
	_ = conn.Send(emuwire.Msg{Op: emuwire.OpReady, ServerPID: sv.PID})
	conn.Close()
}

// Refuse tells a waiting CUDA client that no server will come.
func (h schedHost) Refuse(c *mpssched.Client) {
	conn := clientConn(c)
	_ = conn.Send(emuwire.Msg{Op: emuwire.OpError, Err: 805, Text: "The MPS control daemon is shutting down"})
	conn.Close()
}

// startServerLocked runs nvidia-cuda-mps-server from PATH as uid with the
// daemon's environment, as NVIDIA's daemon does (setuid only; the group
// stays the daemon's). The scheduler adds it to its servers.
func (d *Daemon) startServerLocked(uid int32) *srv {
	var cmd *exec.Cmd
	if path, ok := lookPath(serverName, d.env); ok {
		cmd = exec.Command(path)
		cmd.Args = []string{serverName}
		cmd.Env = d.env
	} else {
		// NVIDIA's forked child exits 1 when execlp fails; so does this.
		cmd = exec.Command("/proc/self/exe")
		cmd.Args = []string{serverName}
		cmd.Env = append(append([]string{}, d.env...), execFailedEnv+"=1")
	}
	if uint32(uid) != d.uid {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{
			Uid: uint32(uid), Gid: uint32(os.Getegid()), Groups: []uint32{},
		}}
	}
	if err := d.start(cmd); err != nil {
		msg := strings.TrimPrefix(err.Error(), "fork/exec ")
		var errno syscall.Errno
		if errors.As(err, &errno) {
			msg = errno.Error()
		}
		if d.gen >= Gen555 {
			d.logf("Failed to start server using uid %d, error: %s", uid, msg)
		} else {
			d.logf("Failed to start server using uid %d. %s", uid, msg)
		}
		return nil
	}
	sv := &srv{
		Server: &mpssched.Server{PID: cmd.Process.Pid, UID: uid}, cmd: cmd,
		replies: make(chan emuwire.Msg, 1), linkDone: make(chan struct{}),
	}
	sv.Ref = sv
	rec := mpslog.Record{Kind: mpslog.Control, PID: d.gen.ServerStartLogPID(d.pid, sv.PID),
		Time: time.Now(), Msg: fmt.Sprintf("Starting new server %d for user %d", sv.PID, uid)}
	if d.deferred != nil && d.gen != Gen535 {
		*d.deferred = append(*d.deferred, rec)
	} else {
		d.record(rec)
	}
	go d.waitServer(sv)
	return sv
}

// waitServer reaps a server and does what NVIDIA's daemon does on SIGCHLD:
// log the exit (a server killed by a signal reports status 0, the
// WEXITSTATUS of a signalled process), remember the first failure as the
// daemon's exit status, and start the next queued server — at once, if
// clients were waiting for the one that died.
func (d *Daemon) waitServer(sv *srv) {
	_ = sv.cmd.Wait()
	status := 0
	if ws, ok := sv.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Exited() {
		status = ws.ExitStatus()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.logf("Server %d exited with status %d", sv.PID, status)
	d.logf(msgRemovedShm)
	d.serverExits++
	if status != 0 && d.exitStatus == 0 {
		d.exitStatus = status
	}
	if sv.link != nil {
		sv.link.Close()
		go d.reportServerGone(sv.PID)
	}
	if d.sched.Exited(sv.Server) {
		d.finishLocked()
	}
}

func (d *Daemon) acceptPrivate(l *net.UnixListener) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		// NVIDIA's daemon takes one connection at a time up to its
		// credentials, so its log lines stay in connection order. Emulated
		// peers send their hello at once; the deadline only bounds a peer
		// that connects and stalls.
		d.mu.Lock()
		d.logf("Accepting connection...")
		d.mu.Unlock()
		_ = c.SetReadDeadline(time.Now().Add(helloTimeout))
		conn := emuwire.NewConn(c)
		m, err := conn.Recv()
		_ = c.SetReadDeadline(time.Time{})
		if err != nil {
			// The CUDA driver's first connection sends nothing (docs/gpu-probe).
			d.mu.Lock()
			d.logf("User did not send valid credentials")
			d.mu.Unlock()
			conn.Close()
			continue
		}
		go d.servePrivate(conn, m)
	}
}

// helloTimeout bounds the wait for a private connection's first message.
const helloTimeout = time.Second

// servePrivate handles a connection from an emulated server or client whose
// first message was m.
func (d *Daemon) servePrivate(c *emuwire.Conn, m emuwire.Msg) {
	switch m.Op {
	case emuwire.OpServerHello:
		d.registerServer(c, m.PID)
	case emuwire.OpClientHello:
		d.clientRequest(c, m.PID)
	default:
		d.mu.Lock()
		d.logf("Unknown type of connection")
		d.mu.Unlock()
		c.Close()
	}
}

// registerServer: a server the daemon started reports ready. It gets the
// daemon's defaults, and the clients waiting for it are sent to it.
func (d *Daemon) registerServer(c *emuwire.Conn, pid int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var sv *srv
	for _, s := range d.sched.Servers() {
		if s.PID == pid && !s.Ready {
			sv = srvOf(s)
		}
	}
	// Only the server process itself: the socket is abstract, so anyone
	// could connect and claim a server's pid.
	if peer, err := c.PeerPID(); err != nil || peer != pid {
		sv = nil
	}
	if sv == nil {
		d.logf("NEW SERVER %d: Ignoring old connection request", pid)
		c.Close()
		return
	}
	pinned := make([]uint64, maxDevices)
	copy(pinned, d.defaultPinned[:])
	if err := c.Send(emuwire.Msg{Op: emuwire.OpConfig, SM: d.defaultSM, Pinned: pinned, Priority: d.priority, Multiuser: d.multiuser}); err != nil {
		c.Close()
		return
	}
	sv.link = c
	go func() {
		defer close(sv.linkDone)
		for {
			r, err := c.Recv()
			if err != nil {
				return
			}
			if r.Op == emuwire.OpXid {
				d.reportXid(r)
				continue
			}
			if r.Op == emuwire.OpProcs {
				d.reportProcs(sv.PID, r)
				continue
			}
			select {
			case sv.replies <- r:
			default: // nobody waits for it any more
			}
		}
	}()
	d.logf("NEW SERVER %d: Ready", pid)
	d.sched.Ready(sv.Server)
}

// clientRequest is a CUDA client asking for a server. One server runs at a
// time: a client of another user waits until the current server, asked to
// exit once idle, is gone (MPS documentation).
func (d *Daemon) clientRequest(c *emuwire.Conn, pid int) {
	peer, err := c.PeerUID()
	if err != nil {
		c.Close()
		return
	}
	uid := int32(peer)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sched.ServesAtOnce(uid) != nil {
		d.logf("NEW CLIENT %d from user %d: Server already exists", pid, uid)
	} else {
		d.logf("NEW CLIENT %d from user %d: Server is not ready, push client to pending list", pid, uid)
	}
	pc, _ := d.sched.Request(pid, uid, c)
	if pc.Done {
		return
	}
	// A client that gives up while it waits leaves the queue.
	go func() {
		_, _ = c.Recv()
		d.mu.Lock()
		pc.Done = true
		d.mu.Unlock()
	}()
}

// reportXid passes a fault a server of this daemon reports on to the
// simulated GPUs, as the driver reports an Xid to NVML: one line
// "<GPU UUID> <Xid>" to the unix socket MPSEMU_XID_SOCKET names (mpsd
// --simulate listens there, for root only). Only the daemon's own GPUs,
// and nothing when the variable is unset.
func (d *Daemon) reportXid(m emuwire.Msg) {
	if len(m.UUIDs) != 1 || m.Err <= 0 {
		return
	}
	d.sendSim(m.UUIDs[0], fmt.Sprintf("%s %d\n", m.UUIDs[0], m.Err))
}

// reportProcs passes the clients a server of this daemon reports on one
// of the daemon's GPUs on to the simulated GPUs, as the driver knows a
// device's processes: one line "procs <GPU UUID> <server pid>
// [<client pid>=<bytes> ...]" to the MPSEMU_XID_SOCKET socket. The server
// pid is the link's, checked when the server registered, never the
// message's.
func (d *Daemon) reportProcs(server int, m emuwire.Msg) {
	if len(m.UUIDs) != 1 || len(m.PIDs) != len(m.Mem) || len(m.PIDs) > maxReportedClients {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "procs %s %d", m.UUIDs[0], server)
	for i, pid := range m.PIDs {
		if pid <= 0 {
			return
		}
		fmt.Fprintf(&b, " %d=%d", pid, m.Mem[i])
	}
	b.WriteByte('\n')
	d.sendSim(m.UUIDs[0], b.String())
}

// maxReportedClients bounds one process report (MPS's 48 clients, with room).
const maxReportedClients = 64

// reportServerGone tells the simulated GPUs that a server of this daemon
// exited: "gone <GPU UUID> <server pid>" for each of the daemon's GPUs.
func (d *Daemon) reportServerGone(server int) {
	for _, uuid := range strings.Split(envValue(d.env, "CUDA_VISIBLE_DEVICES"), ",") {
		if uuid != "" {
			d.sendSim(uuid, fmt.Sprintf("gone %s %d\n", uuid, server))
		}
	}
}

// sendSim writes one report line about GPU uuid, one of the daemon's own,
// to the MPSEMU_XID_SOCKET socket; nothing when the variable is unset.
func (d *Daemon) sendSim(uuid, line string) {
	path := envValue(d.env, "MPSEMU_XID_SOCKET")
	if path == "" || !slices.Contains(strings.Split(envValue(d.env, "CUDA_VISIBLE_DEVICES"), ","), uuid) {
		return
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(c, line)
}

// envValue is the value of key in env, "" when unset.
func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

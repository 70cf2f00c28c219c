package gpu

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/internal/procstat"
)

// EnvXidSocket names, in the MPS emulator's control daemons' environment,
// the socket of ServeXidReports: a daemon passes the faults its servers
// report there, as a GPU's driver reports them to NVML as Xids.
const EnvXidSocket = "MPSEMU_XID_SOCKET"

// procsSaveDelay: how long after a process report the table is written
// (KeepMPSProcs), so that one write covers a burst of reports.
const procsSaveDelay = 20 * time.Millisecond

// xidReportMax bounds one report line (a process report of 64 clients
// fits).
const xidReportMax = 4096

// ServeXidReports listens on a unix socket at path for the Xids the MPS
// emulator's control daemons report for the faults of their servers'
// clients (one line "<GPU UUID> <Xid>" a connection), and raises each on
// the simulated GPU of that UUID with no pid, as NVML reports a client's
// fault on real hardware. Only peers of this process's uid are heard (the
// emulated daemons run as root, as mpsd does; their servers and clients,
// which run as the tenants, cannot report): a tenant cannot forge an Xid
// on a simulated GPU any more than on a real one. path's directory must
// be writable by this process only. stop closes the socket and waits for
// the goroutines.
func (s *Sim) ServeXidReports(path string, log *slog.Logger) (stop func(), err error) {
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("gpu: sim: listen for Xid reports: %w", err)
	}
	// The process table is written by a goroutine of its own, not by the
	// one that hears reports: a burst of reports (every client of a
	// server reconnecting) is one write, and no report waits on the disk.
	kick, done := make(chan struct{}, 1), make(chan struct{})
	s.mu.Lock()
	s.procsKick = kick
	s.mu.Unlock()
	var wg sync.WaitGroup
	var writer sync.WaitGroup
	writer.Go(func() {
		for {
			select {
			case <-kick:
			case <-done:
				select {
				case <-kick: // the last reports, written before stop returns
					s.saveMPSProcs()
				default:
				}
				return
			}
			// Reports come in bursts (a server's clients connecting, or
			// all leaving as it dies): one write, a moment after the
			// first, covers the burst.
			t := time.NewTimer(procsSaveDelay)
			select {
			case <-t.C:
			case <-done:
				t.Stop()
			}
			select {
			case <-kick: // heard before the save below: covered by it
			default:
			}
			s.saveMPSProcs()
		}
	})
	wg.Go(func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				log.Warn("sim: accept an Xid report", "err", err)
				time.Sleep(10 * time.Millisecond) // EMFILE: do not spin
				continue
			}
			s.xidReport(c, log)
		}
	})
	return func() {
		_ = ln.Close()
		wg.Wait()
		s.mu.Lock()
		s.procsKick = nil
		s.mu.Unlock()
		close(done)
		writer.Wait()
		_ = os.Remove(path)
	}, nil
}

// xidReport reads one report from c and raises it.
func (s *Sim) xidReport(c *net.UnixConn, log *slog.Logger) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if uid, err := peerUID(c); err != nil || uid != uint32(os.Geteuid()) {
		log.Warn("sim: Xid report from a stranger ignored", "uid", uid, "err", err)
		return
	}
	line, err := bufio.NewReader(io.LimitReader(c, xidReportMax)).ReadString('\n')
	if err != nil {
		return
	}
	if strings.HasPrefix(line, "procs ") || strings.HasPrefix(line, "gone ") {
		s.procReport(line, log)
		return
	}
	uuid, xid, err := ParseXidReport(line)
	if err != nil {
		log.Warn("sim: bad Xid report", "err", err)
		return
	}
	idx := -1
	s.mu.Lock()
	for _, d := range s.devs {
		if d.uuid == uuid {
			idx = d.index
		}
	}
	s.mu.Unlock()
	if idx < 0 {
		log.Warn("sim: Xid report for a GPU this host does not have", "uuid", uuid)
		return
	}
	if err := s.InjectXid(idx, xid, 0); err != nil {
		log.Warn("sim: raise a reported Xid", "gpu", idx, "xid", xid, "err", err)
	}
}

// procReport applies one process report of an emulated control daemon.
func (s *Sim) procReport(line string, log *slog.Logger) {
	r, err := ParseProcReport(line)
	if err != nil {
		log.Warn("sim: bad process report", "err", err)
		return
	}
	idx := s.indexOf(r.UUID)
	if idx < 0 {
		log.Warn("sim: process report for a GPU this host does not have", "uuid", r.UUID)
		return
	}
	if r.Gone {
		_ = s.RemoveMPSServer(idx, r.Server)
	} else {
		_ = s.SetMPSServer(idx, r.Server, r.Clients)
	}
	s.mu.Lock()
	kick := s.procsKick
	s.mu.Unlock()
	select {
	case kick <- struct{}{}: // ServeXidReports's writer saves the table
	default: // a save is already due: it will see this report too
	}
}

func (s *Sim) indexOf(uuid string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.devs {
		if d.uuid == uuid {
			return d.index
		}
	}
	return -1
}

// ProcReport is one process report of the MPS emulator's control daemons:
// "procs <GPU UUID> <server pid> [<client pid>=<bytes> ...]" (the server's
// clients on that GPU now) or "gone <GPU UUID> <server pid>" (it exited).
type ProcReport struct {
	UUID    string
	Server  int
	Clients map[int]uint64 // nil when Gone
	Gone    bool
}

// ParseProcReport parses one line of a process report, newline included.
func ParseProcReport(line string) (ProcReport, error) {
	bad := func(why string) (ProcReport, error) {
		return ProcReport{}, fmt.Errorf("gpu: sim: process report %.80q: %s", line, why)
	}
	if !strings.HasSuffix(line, "\n") {
		return bad("no newline")
	}
	f := strings.Fields(line)
	if len(f) < 3 || (f[0] != "procs" && f[0] != "gone") {
		return bad(`want "procs <GPU UUID> <pid> [<pid>=<bytes> ...]" or "gone <GPU UUID> <pid>"`)
	}
	if !strings.HasPrefix(f[1], "GPU-") {
		return bad("no GPU UUID")
	}
	server, err := parsePID(f[2])
	if err != nil {
		return bad(err.Error())
	}
	r := ProcReport{UUID: f[1], Server: server, Gone: f[0] == "gone"}
	if r.Gone {
		if len(f) != 3 {
			return bad("a gone report names one server")
		}
		return r, nil
	}
	r.Clients = map[int]uint64{}
	for _, kv := range f[3:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return bad("want <pid>=<bytes>")
		}
		pid, err := parsePID(k)
		if err != nil {
			return bad(err.Error())
		}
		b, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return bad("bad byte count " + strconv.Quote(v))
		}
		if _, dup := r.Clients[pid]; dup {
			return bad("client named twice")
		}
		r.Clients[pid] = b
	}
	return r, nil
}

func parsePID(s string) (int, error) {
	pid, err := strconv.ParseInt(s, 10, 32)
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad pid %q", s)
	}
	return int(pid), nil
}

// ParseXidReport parses one line "<GPU UUID> <Xid>\n" of the emulator's
// Xid reports.
func ParseXidReport(line string) (uuid string, xid uint64, err error) {
	f := strings.Fields(line)
	if len(f) != 2 || !strings.HasSuffix(line, "\n") {
		return "", 0, fmt.Errorf("gpu: sim: Xid report %q: want \"<GPU UUID> <Xid>\"", line)
	}
	if !strings.HasPrefix(f[0], "GPU-") {
		return "", 0, fmt.Errorf("gpu: sim: Xid report %q: %q is no GPU UUID", line, f[0])
	}
	xid, err = strconv.ParseUint(f[1], 10, 32)
	if err != nil || xid == 0 {
		return "", 0, fmt.Errorf("gpu: sim: Xid report %q: bad Xid %q", line, f[1])
	}
	return f[0], xid, nil
}

func peerUID(c *net.UnixConn) (uint32, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return cred.Uid, nil
}

// KeepMPSProcs makes the MPS process table (SetMPSServer, RemoveMPSServer)
// outlive this process, as a real driver's knowledge of a device's
// processes outlives mpsd: the table is read from file now (servers that
// have exited since are dropped, as the driver forgets them) and written
// there after the process reports of the emulated daemons (by
// ServeXidReports, off the path that hears them). A file that
// cannot be read is ignored (the table starts empty, as before).
func (s *Sim) KeepMPSProcs(file string) error {
	b, err := os.ReadFile(file)
	if err == nil {
		var saved savedProcs
		if json.Unmarshal(b, &saved) == nil {
			for uuid, servers := range saved.Servers {
				idx := s.indexOf(uuid)
				if idx < 0 {
					continue
				}
				for server, clients := range servers {
					// The same process, still running: not one that has
					// exited (a zombie included) or taken its pid since.
					if start, ok := runningSince(server); !ok || start != saved.Started[server] {
						continue
					}
					_ = s.SetMPSServer(idx, server, clients)
				}
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("gpu: sim: read the MPS process table: %w", err)
	}
	s.mu.Lock()
	s.procsFile = file
	s.mu.Unlock()
	return nil
}

// saveMPSProcs writes the MPS process table to the KeepMPSProcs file, if
// any (atomically: a file written elsewhere and renamed).
func (s *Sim) saveMPSProcs() {
	s.mu.Lock()
	file := s.procsFile
	table := savedProcs{Servers: map[string]map[int]map[int]uint64{}, Started: map[int]uint64{}}
	for _, d := range s.devs {
		if len(d.mps) > 0 {
			table.Servers[d.uuid] = map[int]map[int]uint64{}
			for server, clients := range d.mps {
				table.Servers[d.uuid][server] = maps.Clone(clients)
			}
		}
	}
	s.mu.Unlock()
	if file == "" {
		return
	}
	for _, servers := range table.Servers {
		for server := range servers {
			if start, ok := runningSince(server); ok {
				table.Started[server] = start
			}
		}
	}
	b, err := json.Marshal(table)
	if err != nil {
		return
	}
	tmp := file + ".tmp"
	if os.WriteFile(tmp, b, 0o600) == nil {
		_ = os.Rename(tmp, file)
	}
}

// savedProcs is the KeepMPSProcs file: GPU UUID → server → client →
// bytes, and each server's start time (clock ticks after boot), which the
// next reader checks so that a pid taken by another process since is not
// listed.
type savedProcs struct {
	Servers map[string]map[int]map[int]uint64 `json:"servers"`
	Started map[int]uint64                    `json:"started"`
}

// runningSince is the start time of process pid (field 22 of its stat, in
// clock ticks after boot), false when it has exited (a zombie included)
// or cannot be read.
func runningSince(pid int) (uint64, bool) {
	st, err := procstat.Read("/proc", pid)
	if err != nil || st.Exited() || !st.HasStart {
		return 0, false
	}
	return st.StartTime, true
}

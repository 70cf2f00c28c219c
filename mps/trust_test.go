package mps

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
	"github.com/mpsd/mpsd/internal/testrun"
)

// Attacker uids of this package's tests: real unprivileged users that
// write what any local user can write into a daemon's pipe directory.
const (
	uidForger  = 64100
	uidPidFile = 64101
	uidLocker  = 64102
)

// attackEnv runs the test binary as an attacker program (see attackMain).
const attackEnv = "MPS_TEST_ATTACK"

// attackMain is what an attacker process does, by attackEnv:
//
//	fifo:<path>:<hex records>  open the log FIFO O_WRONLY|O_NONBLOCK, write
//	write:<path>:<text>        overwrite a file (the pid file)
//	lock:<path>                take a POSIX write lock, print "locked",
//	                           hold it until stdin closes
func attackMain() int {
	verb, rest, _ := strings.Cut(os.Getenv(attackEnv), ":")
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "attacker:", err); return 1 }
	switch verb {
	case "fifo":
		path, hx, _ := strings.Cut(rest, ":")
		b, err := hex.DecodeString(hx)
		if err != nil {
			return fail(err)
		}
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("open %s: %w", path, err))
		}
		defer unix.Close(fd)
		if n, err := unix.Write(fd, b); err != nil || n != len(b) {
			return fail(fmt.Errorf("write %s: %d of %d bytes: %v", path, n, len(b), err))
		}
	case "write":
		path, text, _ := strings.Cut(rest, ":")
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			return fail(err)
		}
		if _, err := f.WriteString(text); err != nil {
			return fail(err)
		}
		if err := f.Close(); err != nil {
			return fail(err)
		}
	case "lock":
		f, err := os.OpenFile(rest, os.O_RDWR, 0)
		if err != nil {
			return fail(err)
		}
		lk := unix.Flock_t{Type: unix.F_WRLCK}
		if err := unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk); err != nil {
			return fail(fmt.Errorf("F_SETLK %s: %w", rest, err))
		}
		fmt.Println("locked")
		_, _ = io.Copy(io.Discard, os.Stdin)
	default:
		return fail(fmt.Errorf("unknown attack %q", verb))
	}
	return 0
}

// attackerBinary is a copy of this test binary that other users may run
// (the build directory is private to root).
func attackerBinary(t *testing.T) string {
	t.Helper()
	dir := shortTempDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	p := filepath.Join(dir, "attacker")
	dst, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// attacker is a command running the attacker binary as uid.
func attacker(bin string, uid uint32, attack string) *exec.Cmd {
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Dir = "/"
	cmd.Env = []string{attackEnv + "=" + attack, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	return cmd
}

func runAttacker(t *testing.T, bin string, uid uint32, attack string) {
	t.Helper()
	if out, err := attacker(bin, uid, attack).CombinedOutput(); err != nil {
		t.Fatalf("attacker uid %d (%.40s...): %v: %s", uid, attack, err, out)
	}
}

// openPipeDir lets other users reach cfg's pipe directory, as they can
// reach a production one (its parent is private to root in tests).
func openPipeDir(t *testing.T, cfg Config) {
	t.Helper()
	if err := os.Chmod(filepath.Dir(cfg.PipeDir), 0o755); err != nil {
		t.Fatal(err)
	}
}

// forge writes records into the daemon's log FIFO as uid, with the kind
// and pid the attacker chose.
func forge(t *testing.T, bin string, uid uint32, cfg Config, recs ...mpslog.Record) {
	t.Helper()
	var b []byte
	for _, r := range recs {
		if r.Time.IsZero() {
			r.Time = time.Now()
		}
		b = append(b, r.Encode()...)
	}
	runAttacker(t, bin, uid, "fifo:"+filepath.Join(cfg.PipeDir, "log")+":"+hex.EncodeToString(b))
}

func controlRec(msg string, pid int) mpslog.Record {
	return mpslog.Record{Kind: mpslog.Control, PID: pid, Msg: msg}
}

// victim starts a root process that no record may get killed.
func victim(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := testrun.Start(cmd); err != nil { // dies with the test process
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// alive reports whether pid is a live process (not a zombie).
func alive(t *testing.T, pid int) bool {
	t.Helper()
	st, err := readProcStat("/proc", pid)
	return err == nil && st.state != 'Z' && st.state != 'X'
}

// logHas waits (bounded) for a control.log or server.log line containing s:
// whether this daemon copies FIFO records into its logs at all.
func logHas(t *testing.T, cfg Config, name, s string) bool {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(cfg.LogDir, name))
		if strings.Contains(string(b), s) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// noEvent fails if the events read so far hold one matching pred.
func (in *instance) noEvent(t *testing.T, what string, pred func(Event) bool) {
	t.Helper()
	for len(in.events) > 0 {
		in.backlog = append(in.backlog, <-in.events)
	}
	for _, ev := range in.backlog {
		if pred(ev) {
			t.Errorf("%s: got %v", what, ev)
		}
	}
}

// TestForgedServerRecordsSignalNothing: a local user writes "Starting new
// server" records naming a root process and another group's daemon into
// the log FIFO, and a "Server exited" record for a real server. Neither
// is ever watched or signalled (Stop, killing the dead daemon's orphans,
// leaves them alive), the forged exit is no ServerExited, and each is
// reported as UnverifiedRecord.
func TestForgedServerRecordsSignalNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		bin := attackerBinary(t)
		cfg := newConfig(t, b)
		openPipeDir(t, cfg)
		in := start(t, cfg)
		other := start(t, newConfig(t, b))
		v, marker := victim(t), victim(t)
		server := in.startServer(t)

		forge(t, bin, uidForger, cfg,
			controlRec(fmt.Sprintf("Starting new server %d for user 0", v.Process.Pid), v.Process.Pid),
			controlRec(fmt.Sprintf("Starting new server %d for user 0", other.d.PID()), other.d.PID()),
			controlRec(fmt.Sprintf("NEW SERVER %d: Ready", v.Process.Pid), in.d.PID()),
			controlRec(fmt.Sprintf("Server %d exited with status 1", server), in.d.PID()),
			// A marker after the exit line: once it is reported, the exit
			// line before it has been read.
			controlRec(fmt.Sprintf("Server %d exited with status 0", marker.Process.Pid), in.d.PID()),
		)
		if !logHas(t, cfg, controlLog, fmt.Sprintf("Starting new server %d for user 0", v.Process.Pid)) {
			t.Fatalf("%s: the forged record never reached control.log", b.name)
		}
		in.waitEvent(t, "unverified start of the victim", kindPID(UnverifiedRecord, v.Process.Pid))
		in.waitEvent(t, "unverified start of another daemon", kindPID(UnverifiedRecord, other.d.PID()))
		in.waitEvent(t, "unverified ready of the victim", kindPID(UnverifiedRecord, v.Process.Pid))
		in.waitEvent(t, "unverified exit marker", kindPID(UnverifiedRecord, marker.Process.Pid))
		in.noEvent(t, "forged exit of a live server", kindPID(ServerExited, server))
		in.noEvent(t, "forged start", func(e Event) bool {
			return e.Kind == ServerStarted && (e.PID == v.Process.Pid || e.PID == other.d.PID())
		})
		if !alive(t, server) {
			t.Fatalf("server %d gone after a forged exit record", server)
		}

		// The daemon dies: Stop then SIGKILLs the servers it left (its
		// orphans), the verified one only.
		sigkill(t, in.d.PID())
		in.waitEvent(t, "daemon exited", kind(DaemonExited))
		rep, err := in.d.Stop(testCtx(t, 20*time.Second))
		if err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if slices.Contains(rep.KilledServers, v.Process.Pid) || slices.Contains(rep.KilledServers, other.d.PID()) {
			t.Errorf("Stop killed a process named only by a forged record: %+v", rep)
		}
		if !slices.Contains(rep.KilledServers, server) {
			t.Errorf("Stop after the daemon died = %+v; want its orphaned server %d killed", rep, server)
		}
		if !alive(t, v.Process.Pid) {
			t.Errorf("victim %d was killed", v.Process.Pid)
		}
		if err := other.d.Probe(testCtx(t, 5*time.Second)); err != nil || !alive(t, other.d.PID()) {
			t.Errorf("the other daemon %d after Stop of the first: %v", other.d.PID(), err)
		}
	})
}

// TestForgedFaultRecordIsUnverified: a forged "Server is handling a fatal
// GPU error." naming a pid that is no server of the daemon is an
// UnverifiedRecord, never a ServerFault; one naming the real server is a
// ServerFault with KnownServer (the caller then confirms it).
func TestForgedFaultRecordIsUnverified(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		bin := attackerBinary(t)
		cfg := newConfig(t, b)
		openPipeDir(t, cfg)
		in := start(t, cfg)
		v := victim(t)
		server := in.startServer(t)
		const fatal = "Server is handling a fatal GPU error."
		forge(t, bin, uidForger, cfg,
			mpslog.Record{Kind: mpslog.Server, PID: v.Process.Pid, Msg: fatal},
			mpslog.Record{Kind: mpslog.Server, PID: in.d.PID(), Msg: fatal},
			mpslog.Record{Kind: mpslog.Server, PID: server, Msg: fatal},
		)
		if !logHas(t, cfg, serverLog, fmt.Sprintf("Server %5d] %s", v.Process.Pid, fatal)) {
			t.Fatalf("%s: the forged record never reached server.log", b.name)
		}
		in.waitEvent(t, "unverified fault of the victim", kindPID(UnverifiedRecord, v.Process.Pid))
		in.waitEvent(t, "unverified fault of the daemon", kindPID(UnverifiedRecord, in.d.PID()))
		ev := in.waitEvent(t, "fault naming the real server", kindPID(ServerFault, server))
		if !ev.KnownServer {
			t.Errorf("fault of verified server %d: KnownServer false", server)
		}
		in.noEvent(t, "fault of no server", func(e Event) bool { return e.Kind == ServerFault && e.PID != server })
		if !alive(t, v.Process.Pid) {
			t.Errorf("victim %d was killed", v.Process.Pid)
		}
	})
}

// TestForgedPidFileAdoptsByLock: a local user overwrites the pid file
// (0666) with another group's daemon's pid. Adopt and Reclaim take the
// holder of control_lock, never the pid named; Expect with another start
// time is refused (ErrUnverifiedDaemon), and Reclaim leaves the other
// daemon alive.
func TestForgedPidFileAdoptsByLock(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		bin := attackerBinary(t)
		cfg := newConfig(t, b)
		openPipeDir(t, cfg)
		first := start(t, cfg)
		second := start(t, newConfig(t, b))
		pidFile := filepath.Join(cfg.PipeDir, pidFileName)
		if b.gen == "535" {
			// 535 writes none; the directory is not the attacker's to
			// create one in, so the lock alone is all there is.
			if _, err := os.Stat(pidFile); err == nil {
				t.Fatalf("535 wrote a pid file")
			}
		} else {
			runAttacker(t, bin, uidPidFile, "write:"+pidFile+":"+strconv.Itoa(second.d.PID()))
			if got, _ := os.ReadFile(pidFile); string(got) != strconv.Itoa(second.d.PID()) {
				t.Fatalf("pid file after the attacker: %q", got)
			}
		}
		d, err := Adopt(testCtx(t, 10*time.Second), cfg)
		if err != nil {
			t.Fatalf("Adopt: %v", err)
		}
		if d.PID() != first.d.PID() || d.Identity() != first.d.Identity() {
			t.Errorf("Adopt took %v, the lock holder is %v (pid file names %d)", d.Identity(), first.d.Identity(), second.d.PID())
		}
		d.Close()

		wrong := first.d.Identity()
		wrong.StartTime++
		bad := cfg
		bad.Expect = &wrong
		if _, err := Adopt(testCtx(t, 10*time.Second), bad); !errors.Is(err, ErrUnverifiedDaemon) || !errors.Is(err, ErrNoDaemon) {
			t.Errorf("Adopt expecting %v: %v, want ErrUnverifiedDaemon and ErrNoDaemon", wrong, err)
		}
		if _, err := Reclaim(testCtx(t, 10*time.Second), bad); !errors.Is(err, ErrUnverifiedDaemon) {
			t.Errorf("Reclaim expecting %v: %v, want ErrUnverifiedDaemon", wrong, err)
		}
		other := cfg
		otherID := second.d.Identity()
		other.Expect = &otherID
		if _, err := Adopt(testCtx(t, 10*time.Second), other); !errors.Is(err, ErrUnverifiedDaemon) {
			t.Errorf("Adopt expecting the other group's daemon %v: %v, want ErrUnverifiedDaemon", otherID, err)
		}
		good := cfg
		id := first.d.Identity()
		good.Expect = &id
		d, err = Adopt(testCtx(t, 10*time.Second), good)
		if err != nil {
			t.Fatalf("Adopt expecting %v: %v", id, err)
		}
		d.Close()

		rep, err := Reclaim(testCtx(t, 20*time.Second), good)
		if err != nil || rep.DaemonPID != first.d.PID() {
			t.Fatalf("Reclaim = %+v, %v; want daemon %d", rep, err, first.d.PID())
		}
		first.waitEvent(t, "reclaimed daemon exited", kindPID(DaemonExited, first.d.PID()))
		if err := second.d.Probe(testCtx(t, 5*time.Second)); err != nil || second.d.Exited() {
			t.Errorf("the daemon the pid file named: %v (exited %v)", err, second.d.Exited())
		}
	})
}

// holdLock starts the attacker binary as uid holding the POSIX lock on
// path, and returns once it holds it; the test's end releases it.
func holdLock(t *testing.T, bin string, uid uint32, path string) *exec.Cmd {
	t.Helper()
	locker := attacker(bin, uid, "lock:"+path)
	stdin, err := locker.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := locker.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	locker.Stderr = os.Stderr
	if err := testrun.Start(locker); err != nil { // dies with the test process
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = locker.Process.Kill(); _ = locker.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "locked\n" {
		t.Fatalf("locker: %q, %v", line, err)
	}
	return locker
}

// TestStartOverTenantHeldLock: after a daemon died, a local user takes
// the POSIX lock on its control_lock (0666). Start still starts a new
// daemon (the files are stale) and leaves that user's process alone.
func TestStartOverTenantHeldLock(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		bin := attackerBinary(t)
		cfg := newConfig(t, b)
		openPipeDir(t, cfg)
		first := start(t, cfg)
		sigkill(t, first.d.PID())
		first.waitEvent(t, "daemon exited", kind(DaemonExited))

		locker := holdLock(t, bin, uidLocker, filepath.Join(cfg.PipeDir, lockFileName))
		if holder, err := lockHolder(cfg.PipeDir); err != nil || holder != locker.Process.Pid {
			t.Fatalf("lock holder %d, %v; want the tenant %d", holder, err, locker.Process.Pid)
		}

		second := start(t, cfg)
		if second.d.PID() == locker.Process.Pid {
			t.Fatalf("Start took the tenant %d for its daemon", locker.Process.Pid)
		}
		if err := second.d.Probe(testCtx(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		if !alive(t, locker.Process.Pid) {
			t.Errorf("the tenant holding the stale lock was killed")
		}
		if _, err := second.d.Stop(testCtx(t, 20*time.Second)); err != nil {
			t.Fatal(err)
		}
		if !alive(t, locker.Process.Pid) {
			t.Errorf("Stop killed the tenant holding the stale lock")
		}
	})
}

// TestStartRefusesForeignRootLockHolder: a process of the daemons' own uid
// (root) that is not the control program holds control_lock. mpsd cannot
// know why, so Start refuses with ErrForeignLockHolder, touches none of
// the pipe directory's files and signals nothing; Adopt refuses too.
func TestStartRefusesForeignRootLockHolder(t *testing.T) {
	b := emuBackend(t, "550")
	bin := attackerBinary(t)
	cfg := newConfig(t, b)
	openPipeDir(t, cfg)
	first := start(t, cfg)
	sigkill(t, first.d.PID())
	first.waitEvent(t, "daemon exited", kind(DaemonExited))

	locker := holdLock(t, bin, 0, filepath.Join(cfg.PipeDir, lockFileName))
	before, err := os.ReadDir(cfg.PipeDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(testCtx(t, 5*time.Second), cfg); !errors.Is(err, ErrForeignLockHolder) {
		t.Fatalf("Start with root's foreign process holding the lock: %v; want ErrForeignLockHolder", err)
	}
	if _, err := Adopt(testCtx(t, 5*time.Second), cfg); !errors.Is(err, ErrForeignLockHolder) || errors.Is(err, ErrNoDaemon) {
		t.Fatalf("Adopt: %v; want ErrForeignLockHolder, not ErrNoDaemon", err)
	}
	after, err := os.ReadDir(cfg.PipeDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("pipe directory changed: %d entries, had %d", len(after), len(before))
	}
	if !alive(t, locker.Process.Pid) {
		t.Errorf("the lock holder was killed")
	}
}

// emfileEnv runs the test binary as a process that adopts a daemon and
// then runs out of file descriptors (see emfileMain).
const emfileEnv = "MPS_TEST_EMFILE"

// emfileMain adopts the daemon on control|pipe|log, lowers RLIMIT_NOFILE,
// fills every descriptor, and checks that Probe fails with
// ErrLocalResources and none of the errors that blame the daemon; with
// the descriptors back, Probe succeeds. It prints "ok" or what went wrong.
func emfileMain() int {
	parts := strings.Split(os.Getenv(emfileEnv), "|")
	if len(parts) != 3 {
		fmt.Println("want control|pipe|log")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := Adopt(ctx, Config{ControlPath: parts[0], PipeDir: parts[1], LogDir: parts[2], Env: setEnv(os.Environ(), emfileEnv, "")})
	if err != nil {
		fmt.Println("adopt:", err)
		return 1
	}
	defer d.Close()
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 256, Max: 256}); err != nil {
		fmt.Println("setrlimit:", err)
		return 1
	}
	var fill []int
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			if !errors.Is(err, unix.EMFILE) {
				fmt.Println("fill:", err)
				return 1
			}
			break
		}
		fill = append(fill, fd)
	}
	perr := d.Probe(ctx)
	_, serr := d.Command(ctx, "get_server_list")
	// The uid a verification reads (readVerified) is not taken for
	// unknown, which would make the daemon a stranger's.
	_, uerr := procUID("/proc", d.PID())
	for _, fd := range fill {
		unix.Close(fd)
	}
	for _, err := range []error{perr, serr, uerr} {
		if !errors.Is(err, ErrLocalResources) {
			fmt.Println("want ErrLocalResources, got:", err)
			return 1
		}
		for _, bad := range []error{ErrTimeout, ErrNoDaemon, ErrDaemonQuitting} {
			if errors.Is(err, bad) {
				fmt.Println("out of fds blamed on the daemon:", err)
				return 1
			}
		}
	}
	if err := d.Probe(ctx); err != nil {
		fmt.Println("probe with descriptors back:", err)
		return 1
	}
	fmt.Println("ok")
	return 0
}

// TestOutOfDescriptorsIsLocal: when this process has no descriptor left
// to start the control client, Probe and Command say ErrLocalResources,
// never ErrTimeout or ErrNoDaemon (which make a watchdog restart a
// healthy daemon). A re-executed test binary really runs out.
func TestOutOfDescriptorsIsLocal(t *testing.T) {
	b := emuBackend(t, "550")
	cfg := newConfig(t, b)
	start(t, cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = setEnv(cfg.Env, emfileEnv, strings.Join([]string{cfg.ControlPath, cfg.PipeDir, cfg.LogDir}, "|"))
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("out-of-descriptors child: %v: %s", err, out)
	}
}

// errRunner fails every start with err.
type errRunner struct{ err error }

func (r errRunner) Start(*exec.Cmd) error { return r.err }

func TestLocalResourceErrors(t *testing.T) {
	for _, errno := range []syscall.Errno{unix.EMFILE, unix.ENFILE, unix.EAGAIN, unix.ENOMEM} {
		t.Run(errno.Error(), func(t *testing.T) {
			d := &Daemon{cfg: Config{PipeDir: "/nonexistent", ControlPath: "/bin/false", Runner: errRunner{os.NewSyscallError("pipe2", errno)}}, stop: make(chan struct{})}
			// A dead deadline too: running out is still no timeout.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := d.Command(ctx, "get_server_list")
			var ce *CommandError
			if !errors.Is(err, ErrLocalResources) || errors.Is(err, ErrTimeout) || errors.Is(err, ErrNoDaemon) || !errors.As(err, &ce) {
				t.Fatalf("Command with %v: %v; want a *CommandError wrapping ErrLocalResources only", errno, err)
			}
		})
	}
	if err := localResources(os.ErrPermission); errors.Is(err, ErrLocalResources) {
		t.Errorf("EPERM taken for a local resource shortage: %v", err)
	}
}

// TestUnverifiedRecordFloodIsRateLimited: a local user floods the FIFO
// with forged records. They are reported at a bounded rate, every one is
// still counted (Suppressed), and a real server's start and exit are
// reported all the same.
func TestUnverifiedRecordFloodIsRateLimited(t *testing.T) {
	b := emuBackend(t, "550")
	bin := attackerBinary(t)
	cfg := newConfig(t, b)
	openPipeDir(t, cfg)
	in := start(t, cfg)
	v, marker := victim(t), victim(t)
	begin := time.Now()
	const writes, perWrite = 10, 40 // each write below PIPE_BUF
	for range writes {
		var recs []mpslog.Record
		for range perWrite {
			recs = append(recs, controlRec(fmt.Sprintf("Starting new server %d for user 0", v.Process.Pid), v.Process.Pid))
		}
		forge(t, bin, uidForger, cfg, recs...)
	}
	// A real server amid the flood is reported as ever.
	server := in.startServer(t)
	sigkill(t, server)
	in.waitEvent(t, "real server exited", kindPID(ServerExited, server))

	// Then one more record now and then, until it is reported (a token
	// is back) and carries the count of the ones dropped before it.
	sent := writes * perWrite
	deadline := time.Now().Add(10 * time.Second)
	var last Event
	for {
		forge(t, bin, uidForger, cfg, controlRec(fmt.Sprintf("Server %d exited with status 0", marker.Process.Pid), in.d.PID()))
		sent++
		ev, ok := in.waitEventFor(t, 100*time.Millisecond, kindPID(UnverifiedRecord, marker.Process.Pid))
		if ok {
			last = ev
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the marker record was never reported")
		}
	}
	elapsed := time.Since(begin)
	events, counted := 1, 1+last.Suppressed
	for len(in.events) > 0 {
		in.backlog = append(in.backlog, <-in.events)
	}
	for _, ev := range in.backlog {
		if ev.Kind == UnverifiedRecord {
			events++
			counted += 1 + ev.Suppressed
		}
	}
	if max := unverifiedBurst + int(elapsed.Seconds()*unverifiedRate) + 2; events > max {
		t.Errorf("%d UnverifiedRecord events in %v; the rate allows %d", events, elapsed, max)
	}
	t.Logf("%d records sent, %d events in %v", sent, events, elapsed)
	if counted != sent {
		t.Errorf("records counted %d (events plus Suppressed), sent %d", counted, sent)
	}
	if last.Suppressed == 0 && events <= unverifiedBurst {
		t.Errorf("%d records in %d events, none suppressed: the flood was not limited", sent, events)
	}
	if !alive(t, v.Process.Pid) {
		t.Errorf("victim %d was killed", v.Process.Pid)
	}
}

func TestReadSmall(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, []byte(strings.Repeat("7", 1<<20)), 0o666); err != nil {
		t.Fatal(err)
	}
	if b, err := readSmall(big, 32); err != nil || len(b) != 32 {
		t.Errorf("readSmall of a 1 MiB file: %d bytes, %v; want 32", len(b), err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(big, link); err != nil {
		t.Fatal(err)
	}
	if _, err := readSmall(link, 32); err == nil {
		t.Error("readSmall followed a symlink")
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := readSmall(fifo, 32); err == nil {
		t.Error("readSmall read a FIFO")
	}
}

package control

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/internal/mpsemu/ctlwire"
	"github.com/mpsd/mpsd/internal/mpsemu/emuwire"
	"github.com/mpsd/mpsd/internal/mpsemu/mpslog"
	"github.com/mpsd/mpsd/internal/mpsemu/mpssched"
)

// childEnv marks the re-executed daemon process (Go cannot fork): "1" with
// logs, "nolog" when the parent found the log directory unusable. The child
// removes it from its environment before anything inherits it.
const childEnv = "MPSEMU_DAEMON_CHILD"

// execFailedEnv makes the program exit 1 at once: the daemon runs itself
// with it when nvidia-cuda-mps-server is not on PATH, because NVIDIA's
// daemon forks a child that exits 1 after execlp fails, and logs that.
const execFailedEnv = "MPSEMU_EXEC_FAILED"

// File names in the pipe directory and the log directory.
const (
	lockName    = "control_lock"
	fifoName    = "log"
	pidFileName = "nvidia-cuda-mps-control.pid"
	serverName  = "nvidia-cuda-mps-server"
)

// Messages of daemon start-up, on stdout as NVIDIA prints them.
const (
	msgAlreadyRunning = "An instance of this daemon is already running\n"
	msgNoPipeDir      = "Cannot access CUDA_MPS_PIPE_DIRECTORY=%s\n"
	msgNoLogDir       = "Warning: Failed writing log files to directory [%s]. No logs will be available.\n"
)

// maxDevices is how many device ordinals the daemon's pinned-memory
// commands accept (0..31), whatever GPUs exist.
const maxDevices = 32

type dirs struct{ pipe, log string }

func dirsFrom(getenv func(string) string) dirs {
	d := dirs{pipe: getenv("CUDA_MPS_PIPE_DIRECTORY"), log: getenv("CUDA_MPS_LOG_DIRECTORY")}
	if d.pipe == "" {
		d.pipe = "/tmp/nvidia-mps"
	}
	if d.log == "" {
		d.log = "/var/log/nvidia-mps"
	}
	return d
}

// prepareLogDir creates the log directory (only its last element, 0700) and
// checks it is usable; if not it prints NVIDIA's warning and the daemon
// runs without log files.
func prepareLogDir(dir string, stdout io.Writer) bool {
	_ = os.Mkdir(dir, 0o700)
	if unix.Access(dir, unix.R_OK|unix.W_OK) != nil {
		fmt.Fprintf(stdout, msgNoLogDir, dir)
		return false
	}
	return true
}

// announce tells a daemon already running on the pipe directory, through
// its log FIFO, that another instance is starting: NVIDIA's daemon does
// this before it finds the lock taken, and the line lands in server.log.
// Its write blocks while the FIFO is full (a daemon whose logger stopped
// at a bad record, and whose own records then filled the FIFO), as
// NVIDIA's does.
func announce(d dirs) {
	_ = mpslog.WriteFIFO(filepath.Join(d.pipe, fifoName), mpslog.Record{
		Kind: mpslog.Other, PID: os.Getpid(), Time: time.Now(), Msg: "Using log directory: " + d.log,
	})
}

// runDaemonParent is `-d`: start the daemon as a new session in a re-executed
// copy of this program and exit 0 once it listens, or 1 if it could not
// start (it has printed why on our stdout).
func runDaemonParent(d dirs, stdout io.Writer) int {
	logs := prepareLogDir(d.log, stdout)
	if logs {
		announce(d)
	}
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(stdout, "nvidia-cuda-mps-control: %v\n", err)
		return 1
	}
	defer r.Close()
	mark := "1"
	if !logs {
		mark = "nolog"
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = os.Args
	cmd.Env = append(os.Environ(), childEnv+"="+mark)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		fmt.Fprintf(stdout, "nvidia-cuda-mps-control: start daemon: %v\n", err)
		return 1
	}
	w.Close()
	var b [1]byte
	if n, _ := r.Read(b[:]); n == 1 {
		_ = cmd.Process.Release()
		return 0
	}
	_ = cmd.Wait()
	return 1
}

// Daemon is the emulated control daemon.
type Daemon struct {
	gen        Generation
	dirs       dirs
	foreground bool
	multiuser  bool
	logs       bool
	pid        int
	uid        uint32
	env        []string
	stdout     io.Writer
	// start starts a server process; tests replace it so that no process
	// is started.
	start func(*exec.Cmd) error

	log      *mpslog.Sink
	lockFile *os.File // held for the daemon's life: the fcntl lock is the instance lock
	fifo     *os.File // the log FIFO's reading end, the logger's
	// logW is the log FIFO's writing end: the daemon's own records go
	// through the FIFO, behind whatever anyone wrote there before, as
	// NVIDIA's do. nil without a FIFO: lines go straight to the sink.
	logW *os.File
	// logEnd is closed when the logger stops (at the daemon's end of log,
	// at anyone's bad header, or overrun); nil without a FIFO.
	logEnd chan struct{}
	// crash ends the process as NVIDIA's daemon ends when a record's text
	// overruns its logger's buffer; tests replace it.
	crash func()

	mu            sync.Mutex
	defaultSM     float64
	defaultPinned [maxDevices]uint64
	priority      int
	// sched decides which server runs and which clients wait: MPS's
	// rules, shared with mpsd's simulation (internal/mpsemu/mpssched).
	sched         *mpssched.Sched
	exitStatus    int
	quitConns     []uiConn
	quitImmediate bool
	serverExits   int // servers reaped so far
	exitsAtQuit   int // ... when the first quit came
	quitTimer     *time.Timer
	listeners     []net.Listener
	finished      bool
	// deferred collects the "Starting new server" lines of the UI session
	// being served (550 and newer): there the forked server logs that line
	// itself, which in practice lands after the session's "UI closed".
	deferred *[]mpslog.Record
	done     chan int
}

// uiConn is the daemon's side of a control session (a *ctlwire.Conn).
type uiConn interface {
	WriteLine(string) error
	WriteStatus(uint32) error
	Close() error
}

var _ uiConn = (*ctlwire.Conn)(nil)

// srv is one server process the daemon started: its scheduling state
// (pid, uid, ready, stopping, waiting clients) is the embedded
// mpssched.Server, whose Ref is the srv.
type srv struct {
	*mpssched.Server
	cmd      *exec.Cmd
	link     *emuwire.Conn // nil while INITIALIZING (Server.Ready is false)
	replies  chan emuwire.Msg
	linkDone chan struct{}
	nextID   uint64
}

// srvOf is the srv of a scheduled server.
func srvOf(sv *mpssched.Server) *srv { return sv.Ref.(*srv) }

// A waiting CUDA client is an *mpssched.Client whose Ref is its
// *emuwire.Conn.
func clientConn(c *mpssched.Client) *emuwire.Conn { return c.Ref.(*emuwire.Conn) }

func newDaemon(gen Generation, d dirs, foreground, multiuser, logs bool, stdout io.Writer) *Daemon {
	env := os.Environ()
	dm := &Daemon{
		gen: gen, dirs: d, foreground: foreground, multiuser: multiuser, logs: logs,
		pid: os.Getpid(), uid: uint32(os.Geteuid()), env: env, stdout: stdout,
		defaultSM: 100, done: make(chan int, 1), start: (*exec.Cmd).Start, crash: crash,
	}
	// -multiuser-server: every user shares root's server.
	dm.sched = mpssched.New(schedHost{dm}, multiuser, 0)
	return dm
}

func (d *Daemon) path(name string) string { return filepath.Join(d.dirs.pipe, name) }

// logf writes a control.log line as the daemon.
func (d *Daemon) logf(format string, args ...any) {
	d.record(mpslog.Record{Kind: mpslog.Control, PID: d.pid, Time: time.Now(), Msg: fmt.Sprintf(format, args...)})
}

// record logs r as the daemon: into the log FIFO, whose logger writes the
// line (or swallows it, or has stopped), as NVIDIA's daemon logs. The
// write blocks while the FIFO is full, NVIDIA's too: a daemon whose logger
// stopped at a bad record hangs once its own records have filled the FIFO.
func (d *Daemon) record(r mpslog.Record) {
	if d.logW == nil {
		d.log.Write(r)
		return
	}
	_, _ = d.logW.Write(r.Encode())
}

func withUmask(mask int, f func() error) error {
	old := syscall.Umask(mask)
	defer syscall.Umask(old)
	return f()
}

// run starts the daemon in this process and serves until quit; it returns
// the exit status. ready, if not nil, gets one byte once the daemon listens.
func (d *Daemon) run(ready *os.File) int {
	if err := withUmask(0, func() error { return os.Mkdir(d.dirs.pipe, 0o777) }); err != nil && !errors.Is(err, os.ErrExist) {
		fmt.Fprintf(d.stdout, msgNoPipeDir, d.dirs.pipe)
		return 1
	}
	err := withUmask(0, func() error {
		f, err := os.OpenFile(d.path(lockName), os.O_WRONLY|os.O_CREATE, 0o666)
		d.lockFile = f
		return err
	})
	if err != nil {
		fmt.Fprintf(d.stdout, msgNoPipeDir, d.dirs.pipe)
		return 1
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0}
	if err := unix.FcntlFlock(d.lockFile.Fd(), unix.F_SETLK, &lk); err != nil {
		io.WriteString(d.stdout, msgAlreadyRunning)
		return 1
	}
	if !d.foreground {
		if null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0); err == nil {
			for fd := 0; fd <= 2; fd++ {
				_ = unix.Dup2(int(null.Fd()), fd)
			}
			null.Close()
		}
	}
	d.openLogs()
	d.logf("Starting control daemon using socket %s/%s", d.dirs.pipe, ctlwire.ControlSocket)
	d.logf("To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY=%s", d.dirs.pipe)
	if v := d.gen.BinaryVersion(); v != 0 {
		d.logf("CUDA MPS Control binary version: %d", v)
	}
	d.readEnvDefaults()

	priv, err := ctlwire.Listen(d.path(ctlwire.PrivilegedSocket))
	if err != nil {
		d.logf("Internal error")
		return 1
	}
	ctl, err := ctlwire.Listen(d.path(ctlwire.ControlSocket))
	if err != nil {
		d.logf("Internal error")
		return 1
	}
	_ = os.Chmod(d.path(ctlwire.ControlSocket), 0o666)
	d.listeners = []net.Listener{priv, ctl}
	// The emulator's own socket for its servers and clients. Without it the
	// daemon still works for the control interface.
	private, perr := emuwire.Listen(emuwire.DaemonSocket(d.dirs.pipe))
	if perr == nil {
		d.listeners = append(d.listeners, private)
	}
	if d.gen.HasPIDFile() {
		_ = withUmask(0, func() error {
			f, err := os.OpenFile(d.path(pidFileName), os.O_WRONLY|os.O_CREATE, 0o666)
			if err != nil {
				return err
			}
			defer f.Close()
			// No O_TRUNC, as NVIDIA's daemon: a longer stale pid leaves its tail.
			_, err = f.WriteAt([]byte(strconv.Itoa(d.pid)), 0)
			return err
		})
	}
	if ready != nil {
		_, _ = ready.Write([]byte{1})
		ready.Close()
	}
	go d.acceptUI(priv)
	go d.acceptUI(ctl)
	if perr == nil {
		go d.acceptPrivate(private)
	}
	return <-d.done
}

// openLogs sets up the sink: log files and the FIFO with -d, stdout with
// -f, nothing when the log directory is unusable.
func (d *Daemon) openLogs() {
	var control, server io.Writer
	switch {
	case d.foreground:
		control, server = d.stdout, d.stdout
	case d.logs:
		open := func(name string) io.Writer {
			f, err := os.OpenFile(filepath.Join(d.dirs.log, name), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o666)
			if err != nil {
				return nil
			}
			return f
		}
		control, server = open("control.log"), open("server.log")
	}
	d.log = mpslog.NewSink(control, server)
	if !d.logs {
		return
	}
	fifo := d.path(fifoName)
	if err := unix.Mkfifo(fifo, 0o777); err != nil && !errors.Is(err, unix.EEXIST) {
		return
	}
	_ = os.Chmod(fifo, 0o777)
	f, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		return
	}
	// The daemon's own writing end. It cannot block: the daemon reads.
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		f.Close()
		return
	}
	d.fifo, d.logW, d.logEnd = f, w, make(chan struct{})
	room := d.gen.LogRoom()
	go func() {
		defer close(d.logEnd)
		if err := d.log.Pump(f, room); errors.Is(err, mpslog.ErrOverrun) {
			d.crash()
		}
	}()
}

// endLog ends the log as NVIDIA's daemon does on its way out: its end-of-log
// header into the FIFO, then a wait for the logger to stop. A logger inside
// a record whose text has not all come (a forged header declaring 4 GiB)
// never stops: the daemon then waits for ever, still holding control_lock,
// as NVIDIA's does. d.mu is held, as NVIDIA's daemon's main thread is
// stuck: nothing else happens in the daemon either.
func (d *Daemon) endLog() {
	if d.logW == nil {
		return
	}
	_, _ = d.logW.Write(mpslog.End(d.pid, time.Now()))
	<-d.logEnd
	d.logW.Close()
	d.fifo.Close()
}

// readEnvDefaults takes the daemon's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
// CUDA_MPS_CLIENT_PRIORITY as its defaults, complaining as NVIDIA's does.
func (d *Daemon) readEnvDefaults() {
	if v, ok := os.LookupEnv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); ok {
		if p, ok := parsePercent(v); ok {
			d.defaultSM = p
		} else {
			d.logf("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE should be between (0.0, 100.0]")
		}
	}
	if v, ok := os.LookupEnv("CUDA_MPS_CLIENT_PRIORITY"); ok {
		p := scanIntDefault(v)
		if p == 0 || p == 1 {
			d.priority = int(p)
		} else {
			d.logf("CUDA_MPS_CLIENT_PRIORITY should be between [0,1]")
		}
	}
}

// finishLocked ends the daemon after quit in NVIDIA's order (strace of
// 550): remove the pid file, close the sockets (their files stay), answer
// the quit callers, log the exit, end the log and wait for the logger,
// remove the FIFO, exit. With a logger that never stops (endLog) the
// daemon goes no further than the wait: the pid file is gone and the
// callers answered, the FIFO stays and control_lock stays held.
func (d *Daemon) finishLocked() {
	if d.finished {
		return
	}
	d.finished = true
	if d.gen.HasPIDFile() {
		_ = os.Remove(d.path(pidFileName))
	}
	for _, l := range d.listeners {
		l.Close()
	}
	if d.quitTimer != nil {
		d.quitTimer.Stop()
	}
	for _, c := range d.quitConns {
		// After waiting for its servers NVIDIA's daemon answers the quit
		// callers only if no server had exited before the quit (seen with
		// 535, 550 and 555); otherwise they see a dropped connection.
		if d.quitImmediate || (d.exitStatus == 0 && d.exitsAtQuit == 0) {
			_ = c.WriteStatus(uint32(d.exitStatus))
		}
		c.Close()
	}
	d.logf("Exit with status %d", d.exitStatus)
	d.endLog()
	_ = os.Remove(d.path(fifoName))
	d.done <- d.exitStatus
}

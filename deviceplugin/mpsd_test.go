package deviceplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/testrun"
	"github.com/mpsd/mpsd/mps"
)

// mpsdProc is the real mpsd binary (bin/mpsd --simulate) on simulated GPUs
// with the MPS emulator's processes, in a temporary tree, run as the test
// user: its groups list the test's uid, and cgroups are off (the plugin's
// leases have no processes of their own).
type mpsdProc struct {
	t      *testing.T
	dir    string
	cfg    string
	socket string
	bin    string
	log    *os.File
	client *Client

	cmd  *exec.Cmd
	done chan error
	// unmount undoes, in cleanup, what a test mounted in dir, once mpsd
	// and its daemons are gone.
	unmount []func()
}

// testWatchdog quarantines an instance at its first fault, so one Xid
// shows the whole path.
const testWatchdog = `watchdog:
  probe_interval: 500ms
  probe_timeout: 400ms
  backoff_initial: 50ms
  backoff_max: 1s
  quarantine_after: 1
  quarantine_window: 1m
`

// newMPSD writes a config with the given groups (indented as under
// `groups:`, "UID" replaced by the test's uid) and starts mpsd on it with
// extra arguments, returning once every instance is ready.
func newMPSD(t *testing.T, groups string, args ...string) *mpsdProc {
	t.Helper()
	return newMPSDIn(t, groups, nil, args...)
}

// newMPSDIn is newMPSD with prepare run on m before mpsd starts (to mount
// a file system of the test's own for run_dir in m.dir).
func newMPSDIn(t *testing.T, groups string, prepare func(m *mpsdProc), args ...string) *mpsdProc {
	t.Helper()
	// Short: pipe directories hold a GPU UUID and must fit a sockaddr_un.
	dir, err := testrun.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	m := &mpsdProc{t: t, dir: dir, cfg: filepath.Join(dir, "mpsd.yaml"), socket: filepath.Join(dir, "mpsd.sock"), bin: emutest.CmdDir(t)}
	m.client = NewClient(m.socket)
	t.Cleanup(m.cleanup)
	if m.log, err = os.Create(filepath.Join(dir, "mpsd.log")); err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(m)
	}
	m.writeConfig(groups)
	m.start(args...)
	return m
}

// writeConfig writes mpsd's config with these groups (indented as under
// `groups:`; UID is the test's uid), atomically: a running mpsd reloads it.
func (m *mpsdProc) writeConfig(groups string) {
	m.t.Helper()
	dir := m.dir
	cfg := fmt.Sprintf(`version: 1
socket: %s
run_dir: %s/run
state_dir: %s/state
log_dir: %s/log
cgroup:
  enabled: false
metrics:
  listen: ""
%ssimulate:
  gpus: 2
  model: a100-40g
  emulator_dir: %s
groups:
%s`, m.socket, dir, dir, dir, testWatchdog, emutest.BinDir(m.t), strings.ReplaceAll(groups, "UID", fmt.Sprint(os.Getuid())))
	if err := os.WriteFile(m.cfg+".new", []byte(cfg), 0o644); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(m.cfg+".new", m.cfg); err != nil {
		m.t.Fatal(err)
	}
}

// start runs mpsd and waits until every instance is ready. It runs with
// --kubelet-device-plugin, as on a node whose pods use it, so every
// instance has the private /dev/shm Allocate mounts into pods; its own
// plugin's kubelet directory has no kubelet.sock (it never registers)
// unless args name another. start also waits for that plugin's first
// look at mpsd's status, when it adopts the leases of an earlier plugin:
// after it, the leases of the plugin a test runs are that plugin's alone.
func (m *mpsdProc) start(args ...string) {
	m.t.Helper()
	var logOff int64
	if fi, err := m.log.Stat(); err == nil {
		logOff = fi.Size()
	}
	m.cmd = exec.Command(filepath.Join(m.bin, "mpsd"), append([]string{"--config", m.cfg, "--simulate", "--log-level", "debug",
		"--kubelet-device-plugin", "--kubelet-dir", filepath.Join(m.dir, "kubelet-unused")}, args...)...)
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := testrun.Start(m.cmd); err != nil {
		m.t.Fatal(err)
	}
	m.done = make(chan error, 1)
	go func() { m.done <- m.cmd.Wait() }()
	m.waitStatus("every instance ready", func(st api.Status) bool {
		if len(st.Instances) == 0 {
			return false
		}
		for _, in := range st.Instances {
			if in.State != api.InstanceReady {
				return false
			}
		}
		return true
	})
	deadline := time.Now().Add(waitFor)
	for {
		b, _ := os.ReadFile(m.log.Name())
		if int64(len(b)) > logOff && strings.Contains(string(b[logOff:]), `msg="offering group to the kubelet" component=deviceplugin`) {
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("mpsd's own device plugin did not read mpsd's status within %s", waitFor)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop stops mpsd with SIGTERM, as systemd or the kubelet's pod stop
// would: the MPS daemons and the leases stay for the next mpsd.
func (m *mpsdProc) stop() {
	m.t.Helper()
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-m.done:
		if err != nil {
			m.t.Errorf("mpsd: %v", err)
		}
	case <-time.After(waitFor):
		_ = m.cmd.Process.Kill()
		<-m.done
		m.t.Errorf("mpsd did not stop within %s", waitFor)
	}
	m.cmd = nil
}

func (m *mpsdProc) cleanup() {
	m.stop()
	pipes, _ := filepath.Glob(filepath.Join(m.dir, "run", "*", "*", "pipe"))
	for _, p := range pipes {
		emutest.KillByPipeDir(p)
	}
	// The instances' private /dev/shm outlive mpsd, as on a host: the
	// test's own are unmounted here.
	shms, err := mps.ShmMountsUnder(m.dir)
	if err != nil {
		m.t.Errorf("cleanup: %v", err)
	}
	for _, shm := range shms {
		if _, err := mps.UnmountShm(shm, ""); err != nil {
			m.t.Errorf("cleanup: %v", err)
		}
	}
	for _, fn := range m.unmount {
		fn()
	}
	if m.log != nil {
		_ = m.log.Close()
		if m.t.Failed() {
			if b, err := os.ReadFile(m.log.Name()); err == nil {
				if len(b) > 20000 {
					b = b[len(b)-20000:]
				}
				m.t.Logf("mpsd log (tail):\n%s", b)
			}
		}
	}
	_ = os.RemoveAll(m.dir)
}

// waitStatus polls mpsd's status until cond holds (mpsd has no status
// stream), failing the test at the deadline with what it last saw.
func (m *mpsdProc) waitStatus(what string, cond func(api.Status) bool) api.Status {
	m.t.Helper()
	deadline := time.Now().Add(waitFor)
	var last api.Status
	var lastErr error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := m.client.Status(ctx)
		cancel()
		if err == nil && cond(st) {
			return st
		}
		last, lastErr = st, err
		select {
		case err := <-m.done:
			m.done <- err
			m.t.Fatalf("mpsd exited while waiting for %s: %v", what, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	m.t.Fatalf("waiting for %s: status %+v, err %v", what, last, lastErr)
	return api.Status{}
}

// admin posts an admin request and fails the test unless it succeeds.
func (m *mpsdProc) admin(path string, body any) {
	m.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		m.t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", m.socket)
	}, DisableKeepAlives: true}}
	resp, err := hc.Post("http://mpsd"+path, api.ContentTypeJSON, bytes.NewReader(b))
	if err != nil {
		m.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		m.t.Fatalf("POST %s: %v", path, api.DecodeError(resp.StatusCode, resp.Body))
	}
}

func leaseByJob(st api.Status, job string) (api.LeaseStatus, bool) {
	for _, l := range st.Leases {
		if l.JobID == job {
			return l, true
		}
	}
	return api.LeaseStatus{}, false
}

func hasLease(st api.Status, id string) bool {
	for _, l := range st.Leases {
		if l.ID == id {
			return true
		}
	}
	return false
}

// runPlugin runs a plugin against m with kubelet directory dir until the
// test ends, polling fast.
func runPlugin(t *testing.T, m *mpsdProc, dir string, groups ...string) (stop func()) {
	t.Helper()
	return runPluginWith(t, m, Options{KubeletDir: dir, Groups: groups})
}

// runPluginWith is runPlugin with more of the plugin's options.
func runPluginWith(t *testing.T, m *mpsdProc, opts Options) (stop func()) {
	t.Helper()
	var logBuf syncBuffer
	opts.MPSD, opts.PollInterval, opts.ReleaseWait = m.client, 50*time.Millisecond, 5*time.Second
	opts.Logger = slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Plugin.Run: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("plugin log:\n%s", logBuf.String())
		}
	})
	return stop
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/client"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor bounds every wait of these tests; reaching it fails the test.
const waitFor = 30 * time.Second

const oneGroup = `  inference:
    users: [root]
    memory: 20G
`

var envSeq atomic.Int64

// testEnv is a temporary tree with a config for the mpsd command on two
// simulated GPUs with the MPS emulator's real processes and real
// cgroups. The tests run the command, in this process (run) or as the
// built binary; cleanup kills the MPS daemons it leaves running (by
// design) and removes the cgroups and the tree.
type testEnv struct {
	t       testing.TB
	dir     string
	cfgPath string
	socket  string
	parent  string
	emu     string
	bin     string
	log     *os.File
}

// newEnv writes a config with the given groups section (indented as under
// `groups:`).
func newEnv(t testing.TB, groups string) *testEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the mpsd command's end-to-end tests need root: real cgroups and pipe directory ownership")
	}
	// Short: the socket path must fit a sockaddr_un.
	dir, err := os.MkdirTemp("", "mpsc")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e := &testEnv{
		t:       t,
		dir:     dir,
		cfgPath: filepath.Join(dir, "mpsd.yaml"),
		socket:  filepath.Join(dir, "mpsd.sock"),
		parent:  fmt.Sprintf("mpsd-test-cmd-%d-%d", os.Getpid(), envSeq.Add(1)),
		emu:     emutest.BinDir(t),
		bin:     emutest.CmdDir(t),
	}
	e.log, err = os.Create(filepath.Join(dir, "mpsd.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.cleanup)
	e.writeConfig(groups)
	return e
}

// writeConfig replaces the config file atomically; simulate.emulator_dir
// is e.emu.
func (e *testEnv) writeConfig(groups string) {
	e.t.Helper()
	cfg := fmt.Sprintf(`version: 1
socket: %s
run_dir: %s/run
state_dir: %s/state
log_dir: %s/log
cgroup:
  parent: %s
metrics:
  listen: ""
watchdog:
  backoff_initial: 50ms
  backoff_max: 1s
simulate:
  gpus: 2
  model: a100-40g
  emulator_dir: %s
groups:
%s`, e.socket, e.dir, e.dir, e.dir, e.parent, e.emu, groups)
	tmp := e.cfgPath + ".new"
	if err := os.WriteFile(tmp, []byte(cfg), 0o644); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Rename(tmp, e.cfgPath); err != nil {
		e.t.Fatal(err)
	}
}

func (e *testEnv) cleanup() {
	pipes, _ := filepath.Glob(filepath.Join(e.dir, "run", "*", "*", "pipe"))
	for _, p := range pipes {
		emutest.KillByPipeDir(p)
	}
	emutest.RemoveCgroupTree(e.parent)
	_ = e.log.Close()
	if e.t.Failed() {
		if b, err := os.ReadFile(e.log.Name()); err == nil {
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			e.t.Logf("mpsd log (tail):\n%s", b)
		}
	}
	_ = os.RemoveAll(e.dir)
}

// proc is a started command.
type proc struct {
	cmd  *exec.Cmd
	errb bytes.Buffer
	done chan struct{}
	err  error // Wait's, once done is closed
}

// startProc starts cmd, capturing its stderr unless it is already set;
// the test's end kills it.
func startProc(t testing.TB, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, done: make(chan struct{})}
	if cmd.Stderr == nil {
		cmd.Stderr = &p.errb
	}
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait waits for the end of the command, bounded by waitFor, and returns
// its exit status.
func (p *proc) wait(t testing.TB) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(waitFor):
		t.Fatalf("%v did not end within %s; stderr: %s", p.cmd.Args, waitFor, p.errb.String())
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("%v: %v", p.cmd.Args, p.err)
	return -1
}

// apiStatus asks the mpsd serving socket for its status.
func apiStatus(socket string) (api.Status, error) {
	st, _, err := client.New(socket).Status(context.Background())
	return st, err
}

func instancesUp(st api.Status, want int) bool {
	up := 0
	for _, in := range st.Instances {
		if in.State == api.InstanceReady && in.DaemonPID > 0 {
			up++
		}
	}
	return len(st.Instances) == want && up == want
}

// syncBuffer is a log destination tests read while goroutines write.
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

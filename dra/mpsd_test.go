package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/deviceplugin"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/testrun"
	"github.com/mpsd/mpsd/mps"
)

// realMPSD is the real mpsd binary (bin/mpsd --simulate) on simulated
// GPUs with the MPS emulator, in a temporary tree, with its own device
// plugin on (a kubelet directory without a kubelet) so that its
// instances have the private /dev/shm a claim's container gets.
type realMPSD struct {
	t      *testing.T
	dir    string
	socket string
	client *deviceplugin.Client
	log    *os.File
	cmd    *exec.Cmd
	done   chan error
}

func newRealMPSD(t *testing.T) *realMPSD {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mpsd mounts each instance's private /dev/shm")
	}
	dir, err := testrun.MkdirTemp("", "dra") // short: pipe directories must fit a sockaddr_un
	if err != nil {
		t.Fatal(err)
	}
	m := &realMPSD{t: t, dir: dir, socket: filepath.Join(dir, "mpsd.sock")}
	m.client = deviceplugin.NewClient(m.socket)
	t.Cleanup(m.cleanup)
	if m.log, err = os.Create(filepath.Join(dir, "mpsd.log")); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`version: 1
socket: %s
run_dir: %s/run
state_dir: %s/state
log_dir: %s/log
cgroup:
  enabled: false
metrics:
  listen: ""
simulate:
  gpus: 1
  model: a100-40g
  emulator_dir: %s
groups:
  inference:
    users: [%d]
    gpus: [all]
    sm_percent: 100
    memory: 16G
    max_sm: 50
    multiuser: true
`, m.socket, dir, dir, dir, emutest.BinDir(t), os.Getuid())
	if err := os.WriteFile(filepath.Join(dir, "mpsd.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	m.start()
	return m
}

// start runs mpsd and waits until its instance is ready.
func (m *realMPSD) start() {
	m.t.Helper()
	m.cmd = exec.Command(filepath.Join(emutest.CmdDir(m.t), "mpsd"), "--config", filepath.Join(m.dir, "mpsd.yaml"), "--simulate",
		"--kubelet-device-plugin", "--kubelet-dir", filepath.Join(m.dir, "kubelet-unused"))
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := testrun.Start(m.cmd); err != nil {
		m.t.Fatal(err)
	}
	m.done = make(chan error, 1)
	go func() { m.done <- m.cmd.Wait() }()
	m.waitStatus("its instance ready", func(st api.Status) bool {
		return len(st.Instances) == 1 && st.Instances[0].State == api.InstanceReady
	})
}

// stop stops mpsd with SIGTERM: the MPS daemons and the leases stay for
// the next mpsd.
func (m *realMPSD) stop() {
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
	case <-time.After(wait):
		_ = m.cmd.Process.Kill()
		<-m.done
		m.t.Errorf("mpsd did not stop within %s", wait)
	}
	m.cmd = nil
}

func (m *realMPSD) cleanup() {
	m.stop()
	pipes, _ := filepath.Glob(filepath.Join(m.dir, "run", "*", "*", "pipe"))
	for _, p := range pipes {
		emutest.KillByPipeDir(p)
	}
	shms, err := mps.ShmMountsUnder(m.dir)
	if err != nil {
		m.t.Errorf("cleanup: %v", err)
	}
	for _, shm := range shms {
		if _, err := mps.UnmountShm(shm, ""); err != nil {
			m.t.Errorf("cleanup: %v", err)
		}
	}
	_ = m.log.Close()
	if m.t.Failed() {
		if b, err := os.ReadFile(m.log.Name()); err == nil {
			m.t.Logf("mpsd log (tail):\n%s", b[max(0, len(b)-20000):])
		}
	}
	_ = os.RemoveAll(m.dir)
}

// waitStatus polls mpsd's status (it has no status stream) until cond
// holds.
func (m *realMPSD) waitStatus(what string, cond func(api.Status) bool) api.Status {
	m.t.Helper()
	deadline := time.Now().Add(wait)
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

// Against the real mpsd: two users' claims get leases of what they
// consumed and CDI specs with the instance's real pipe directory (FIFO
// and pid file masked) and private /dev/shm; a claim above the group's
// max_sm is refused with mpsd's own reason; after mpsd restarts, a new
// driver prepares a claim again on the lease mpsd kept; unprepare
// releases the leases.
func TestRealMPSD(t *testing.T) {
	m := newRealMPSD(t)
	dir := t.TempDir()
	newDriver := func() *Driver {
		d, err := New(Options{MPSD: m.client, NodeName: "node-a", CDIDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.stop)
		return d
	}
	d := newDriver()
	alice := allocated("alice", "infer", "uid-alice", "node-a", "inference-gpu0", 30, 8<<30)
	bob := allocated("bob", "train", "uid-bob", "node-a", "inference-gpu0", 20, 4<<30)
	carol := allocated("carol", "big", "uid-carol", "node-a", "inference-gpu0", 60, 1<<30)
	res := prepare(t, d, alice, bob, carol)
	for _, c := range []string{"uid-alice", "uid-bob"} {
		if err := res[k8stypes.UID(c)].Err; err != nil {
			t.Fatalf("claim %s: %v", c, err)
		}
	}
	if err := res["uid-carol"].Err; !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "max_sm 50") {
		t.Fatalf("claim above max_sm: %v, want mpsd's refusal naming max_sm 50", err)
	}
	st := m.waitStatus("two leases", func(st api.Status) bool { return len(st.Leases) == 2 })
	byJob := map[string]api.LeaseStatus{}
	for _, l := range st.Leases {
		byJob[l.JobID] = l
	}
	if a := byJob[JobID("uid-alice", 0)]; a.SM != 30 || a.MemBytes != 8<<30 || a.State != api.LeaseRunning {
		t.Errorf("alice's lease %+v, want running with sm 30, 8G", a)
	}
	if b := byJob[JobID("uid-bob", 0)]; b.SM != 20 || b.MemBytes != 4<<30 {
		t.Errorf("bob's lease %+v, want sm 20, 4G", b)
	}
	spec := readSpec(t, d, "uid-alice")
	e := spec.Devices[0].ContainerEdits
	pipe := ""
	for _, env := range e.Env {
		if v, ok := strings.CutPrefix(env, api.EnvPipeDirectory+"="); ok {
			pipe = v
		}
	}
	if pipe == "" || !slices.Contains(e.Env, api.EnvThreadPercentage+"=30") {
		t.Fatalf("alice's env %q, want her pipe directory and 30%%", e.Env)
	}
	mounts := map[string]string{}
	for _, mt := range e.Mounts {
		mounts[mt.ContainerPath] = mt.HostPath
	}
	for path, host := range map[string]string{pipe: pipe, pipe + "/log": "/dev/null", pipe + "/nvidia-cuda-mps-control.pid": "/dev/null", "/dev/shm": mps.ShmDirFor(pipe)} {
		if mounts[path] != host {
			t.Errorf("mount at %s from %q, want %q (mounts %v)", path, mounts[path], host, mounts)
		}
	}

	// mpsd restarts, and the driver with it: the leases are kept and
	// adopted.
	m.stop()
	d.stop()
	m.start()
	d2 := newDriver()
	again := prepare(t, d2, alice)["uid-alice"]
	if again.Err != nil || !slices.Equal(again.Devices[0].CDIDeviceIDs, res["uid-alice"].Devices[0].CDIDeviceIDs) {
		t.Fatalf("alice's claim after the restart: %+v, want the same CDI device", again)
	}
	st = m.waitStatus("alice's lease kept", func(st api.Status) bool { return len(st.Leases) == 2 })
	for _, l := range st.Leases {
		if l.JobID == JobID("uid-alice", 0) && l.ID != byJob[l.JobID].ID {
			t.Errorf("alice's lease %s after the restart, want %s resumed", l.ID, byJob[l.JobID].ID)
		}
	}
	if _, err := d2.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "uid-alice"}, {UID: "uid-bob"}}); err != nil {
		t.Fatal(err)
	}
	m.waitStatus("no lease", func(st api.Status) bool { return len(st.Leases) == 0 })
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("CDI dir holds %d entries after unprepare", len(entries))
	}
}

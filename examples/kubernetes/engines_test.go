package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/mps"
)

// engineWait bounds every wait on a real engine (mpsd, containerd, the
// kubelet) in these tests; the shared machines they run on are slow.
const engineWait = 90 * time.Second

// exampleMPSDConfig is the example ConfigMap's mpsd.yaml as a node would
// run it, with its paths moved under dir, no metrics listener, a simulate
// section of gpus simulated GPUs of the default model with the emulator
// in emu, and extraGroups (indented as under groups:) appended.
func exampleMPSDConfig(t *testing.T, dir, emu string, gpus int, extraGroups string) string {
	t.Helper()
	o, problems := decode(readExamples(t))
	if len(problems) > 0 {
		t.Fatalf("examples: %v", problems)
	}
	cm := o.configMaps["mpsd/mpsd-config"]
	if cm == nil || cm.Data["mpsd.yaml"] == "" {
		t.Fatal("examples: no ConfigMap mpsd/mpsd-config with mpsd.yaml")
	}
	cfg := cm.Data["mpsd.yaml"]
	for key, val := range map[string]string{
		"socket":    filepath.Join(dir, "mpsd.sock"),
		"run_dir":   filepath.Join(dir, "run"),
		"state_dir": filepath.Join(dir, "state"),
		"log_dir":   filepath.Join(dir, "log"),
		"  listen":  `""`,
	} {
		re := regexp.MustCompile(`(?m)^` + key + `: .*$`)
		if !re.MatchString(cfg) {
			t.Fatalf("example mpsd.yaml has no %q line", strings.TrimSpace(key))
		}
		cfg = re.ReplaceAllLiteralString(cfg, key+": "+val)
	}
	if !regexp.MustCompile(`(?m)^groups:\n(  .*\n|\s*\n)*\z`).MatchString(cfg) {
		t.Fatal("example mpsd.yaml does not end with its groups section")
	}
	return cfg + extraGroups + fmt.Sprintf("simulate:\n  gpus: %d\n  emulator_dir: %s\n", gpus, emu)
}

// mpsdProc is bin/mpsd run as the DaemonSet runs it, or with pod set
// mpsd from its image run by the kubelet as a static pod; mpsctl is
// always bin/'s, on the host.
type mpsdProc struct {
	t      *testing.T
	bin    string // mpsd's and mpsctl's directory
	pod    *mpsdPod
	cfg    string
	socket string
	log    string
	args   []string
	cmd    *exec.Cmd
	done   chan error
	// logStart is where the current run's log begins.
	logStart int64
}

// logLine reports whether a line of the current run's log has every one
// of parts.
func (m *mpsdProc) logLine(parts ...string) bool {
	b, err := os.ReadFile(m.log)
	if err != nil || int64(len(b)) < m.logStart {
		return false
	}
	for _, line := range strings.Split(string(b[m.logStart:]), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// start runs mpsd --simulate with args and waits until every instance is
// ready.
func (m *mpsdProc) start() {
	m.t.Helper()
	if m.pod != nil {
		m.pod.start(m)
		m.waitReady()
		return
	}
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		m.t.Fatal(err)
	}
	defer logf.Close()
	if fi, err := logf.Stat(); err == nil {
		m.logStart = fi.Size()
	}
	m.cmd = exec.Command(filepath.Join(m.bin, "mpsd"), append([]string{"--config", m.cfg, "--simulate", "--log-level", "debug"}, m.args...)...)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	if err := m.cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	m.done = make(chan error, 1)
	go func(c *exec.Cmd, done chan<- error) { done <- c.Wait() }(m.cmd, m.done)
	m.waitReady()
}

// waitReady waits until mpsd answers with every instance ready.
func (m *mpsdProc) waitReady() {
	m.t.Helper()
	m.waitStatus("every mpsd instance ready", func(st api.Status) bool {
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
}

// restart stops mpsd with SIGTERM and starts it again: as a process, its
// MPS daemons and the leases live on; as a static pod, its container
// restarts (the kubelet's restartPolicy: Always), which ends the MPS
// daemons too (its children, in its cgroup), the leases live on.
func (m *mpsdProc) restart() {
	m.t.Helper()
	if m.pod != nil {
		m.pod.restart(m)
		m.waitReady()
		return
	}
	m.stop()
	m.start()
}

// stop stops mpsd with SIGTERM: its MPS daemons and the leases live on.
// A static pod's mpsd is left to the end of the test's namespaces.
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
	case <-time.After(engineWait):
		_ = m.cmd.Process.Kill()
		<-m.done
		m.t.Errorf("mpsd did not stop within %s of SIGTERM", engineWait)
	}
	m.cmd = nil
}

// shutdown is `mpsctl shutdown`: mpsd revokes the leases, stops its MPS
// daemons (their instances stop for good) and exits.
func (m *mpsdProc) shutdown() {
	m.t.Helper()
	if m.pod != nil {
		m.pod.shutdown(m)
		return
	}
	if out, err := exec.Command(filepath.Join(m.bin, "mpsctl"), "--socket", m.socket, "shutdown").CombinedOutput(); err != nil {
		m.t.Fatalf("mpsctl shutdown: %v\n%s", err, out)
	}
	select {
	case err := <-m.done:
		if err != nil {
			m.t.Errorf("mpsd after mpsctl shutdown: %v", err)
		}
	case <-time.After(engineWait):
		_ = m.cmd.Process.Kill()
		<-m.done
		m.t.Errorf("mpsd did not exit within %s of mpsctl shutdown", engineWait)
	}
	m.cmd = nil
}

// status is `mpsctl status --json`.
func (m *mpsdProc) status() (api.Status, error) {
	var st api.Status
	cmd := exec.Command(filepath.Join(m.bin, "mpsctl"), "--socket", m.socket, "status", "--json")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return st, fmt.Errorf("mpsctl status: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("mpsctl status --json: %w", err)
	}
	return st, nil
}

// waitStatus polls mpsctl status until cond holds; mpsd stopping or the
// deadline fails the test with what it saw last.
func (m *mpsdProc) waitStatus(what string, cond func(api.Status) bool) api.Status {
	m.t.Helper()
	deadline := time.Now().Add(engineWait)
	for {
		st, err := m.status()
		if err == nil && cond(st) {
			return st
		}
		if err != nil && m.pod != nil {
			m.pod.check(m.t)
		}
		select {
		case werr := <-m.done:
			m.done <- werr
			m.t.Fatalf("waiting for %s: mpsd exited: %v\n%s", what, werr, tail(m.log, 4000))
		default:
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("waiting for %s: last status %+v, %v\nmpsd log:\n%s", what, st, err, tail(m.log, 4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tail is the end of a log file, for failure messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// killMPS ends the MPS daemons an mpsd left running under runDir (mpsd's
// stop keeps them, as on a node) and unmounts their private /dev/shm.
func killMPS(t *testing.T, runDir string) {
	pipes, _ := filepath.Glob(filepath.Join(runDir, "*", "*", "pipe"))
	for _, p := range pipes {
		emutest.KillByPipeDir(p)
	}
	shms, err := mps.ShmMountsUnder(runDir)
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	for _, shm := range shms {
		if _, err := mps.UnmountShm(shm, ""); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}

// The example's config runs under mpsd --simulate as the DaemonSet runs
// it (--kubelet-device-plugin): its group is multiuser, and the default
// simulated model's driver (570) takes -multiuser-server, so every
// instance comes up. An emulator imitating driver 550 whatever the model
// reports would leave them starting for ever.
func TestExampleConfigSimulated(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs mpsd as the DaemonSet does: root")
	}
	dir, err := os.MkdirTemp("", "k8sx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	m := &mpsdProc{t: t, bin: emutest.CmdDir(t), socket: filepath.Join(dir, "mpsd.sock"), cfg: filepath.Join(dir, "mpsd.yaml"), log: filepath.Join(dir, "mpsd.log")}
	if err := os.WriteFile(m.cfg, []byte(exampleMPSDConfig(t, dir, emutest.BinDir(t), 2, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	kdir := filepath.Join(dir, "kubelet")
	if err := os.Mkdir(kdir, 0o755); err != nil {
		t.Fatal(err)
	}
	m.args = []string{"--kubelet-device-plugin", "--kubelet-dir", kdir}
	t.Cleanup(func() { m.stop(); killMPS(t, filepath.Join(dir, "run")) })
	m.start()
	st, err := m.status()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Instances) != 2 {
		t.Fatalf("instances %+v; want the inference group on both simulated GPUs", st.Instances)
	}
	for _, in := range st.Instances {
		if in.Group != "inference" || in.State != api.InstanceReady || in.DaemonPID <= 0 {
			t.Errorf("instance %+v; want inference, ready, with a daemon", in)
		}
	}
}

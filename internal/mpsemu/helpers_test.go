package mpsemu_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// deadline bounds every wait in these tests; none of them waits on time.
const deadline = 15 * time.Second

// mps is one emulated MPS instance: a pipe and a log directory and the
// environment that selects them.
type mps struct {
	t    *testing.T
	bin  string
	dir  string
	pipe string
	logs string
	env  []string
}

// newMPS prepares an instance in dir (t.TempDir() unless given) for
// generation gen with extra environment. Every process that ends up with
// its pipe directory in its environment is killed when the test ends.
func newMPS(t *testing.T, gen string, dir string, extra ...string) *mps {
	t.Helper()
	bin := emutest.BinDir(t)
	if dir == "" {
		dir = t.TempDir()
	}
	m := &mps{t: t, bin: bin, dir: dir, pipe: filepath.Join(dir, "pipe"), logs: filepath.Join(dir, "log")}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "CUDA_") || strings.HasPrefix(k, "MPSEMU_") || k == "PATH" {
			continue
		}
		m.env = append(m.env, kv)
	}
	m.env = append(m.env, "PATH="+bin+":/usr/sbin:/usr/bin:/sbin:/bin",
		"CUDA_MPS_PIPE_DIRECTORY="+m.pipe, "CUDA_MPS_LOG_DIRECTORY="+m.logs, "MPSEMU_DRIVER="+gen)
	m.env = append(m.env, extra...)
	t.Cleanup(func() { emutest.KillByPipeDir(m.pipe) })
	return m
}

type result struct {
	stdout, stderr string
	code           int
	timedOut       bool
}

// run runs a program of the emulator to completion (or until timeout).
func (m *mps) run(timeout time.Duration, stdin string, prog string, args ...string) result {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(m.bin, prog), args...)
	cmd.Env = m.env
	cmd.Dir = m.dir
	cmd.Stdin = strings.NewReader(stdin)
	// Files, not pipes: a daemon inheriting them must not hold the call open.
	outF, errF := m.tempFile(), m.tempFile()
	cmd.Stdout, cmd.Stderr = outF, errF
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	var r result
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		r.timedOut = true
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		m.t.Fatalf("run %s %v: %v", prog, args, err)
	}
	r.stdout, r.stderr = readBack(m.t, outF), readBack(m.t, errF)
	return r
}

func (m *mps) tempFile() *os.File {
	m.t.Helper()
	f, err := os.CreateTemp(m.t.TempDir(), "out-")
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { f.Close() })
	return f
}

func readBack(t *testing.T, f *os.File) string {
	t.Helper()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// control runs nvidia-cuda-mps-control with stdin lines.
func (m *mps) control(stdin string, args ...string) result {
	m.t.Helper()
	return m.run(deadline, stdin, emutest.ControlName, args...)
}

// cmd sends one command and fails the test unless the daemon answered.
func (m *mps) cmd(line string) string {
	m.t.Helper()
	r := m.control(line + "\n")
	if r.code != 0 || r.timedOut || r.stderr != "" {
		m.t.Fatalf("%q: exit %d timedOut=%v stderr %q", line, r.code, r.timedOut, r.stderr)
	}
	return r.stdout
}

func (m *mps) startDaemon(args ...string) {
	m.t.Helper()
	if len(args) == 0 {
		args = []string{"-d"}
	}
	if r := m.control("", args...); r.code != 0 || r.stdout != "" {
		m.t.Fatalf("daemon %v: exit %d stdout %q stderr %q", args, r.code, r.stdout, r.stderr)
	}
}

// proc is a program running in the background.
type proc struct {
	cmd    *exec.Cmd
	stdout *bufio.Reader
	stderr bytes.Buffer
}

// start runs prog in the background with an optional uid; its stdout is
// read line by line by the test.
func (m *mps) start(uid int, prog string, args ...string) *proc {
	m.t.Helper()
	cmd := exec.Command(filepath.Join(m.bin, prog), args...)
	cmd.Env = m.env
	cmd.Dir = m.dir
	if uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		m.t.Fatal(err)
	}
	p := &proc{cmd: cmd, stdout: bufio.NewReader(out)}
	cmd.Stderr = &p.stderr
	if err := cmd.Start(); err != nil {
		m.t.Fatalf("start %s: %v", prog, err)
	}
	m.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return p
}

// line reads the program's next stdout line.
func (p *proc) line(t *testing.T) string {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := p.stdout.ReadString('\n')
		ch <- res{s, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("reading %s stdout: %v (stderr %q)", p.cmd.Path, r.err, p.stderr.String())
		}
		return strings.TrimSuffix(r.s, "\n")
	case <-time.After(deadline):
		t.Fatalf("no output from %s", p.cmd.Path)
	}
	return ""
}

// wait waits for the program to exit and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	ch := make(chan error, 1)
	go func() {
		_, _ = io.Copy(io.Discard, p.stdout)
		ch <- p.cmd.Wait()
	}()
	select {
	case err := <-ch:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("wait: %v", err)
		}
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(deadline):
		t.Fatalf("%s did not exit", p.cmd.Path)
	}
	return -1
}

// waitLog waits until control.log (or server.log) holds substr n times,
// woken by file-system events rather than polling.
func (m *mps) waitLog(name, substr string, n int) string {
	m.t.Helper()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		m.t.Fatal(err)
	}
	defer w.Close()
	if err := w.Add(m.logs); err != nil {
		m.t.Fatal(err)
	}
	path := filepath.Join(m.logs, name)
	timeout := time.After(deadline)
	for {
		b, _ := os.ReadFile(path)
		if strings.Count(string(b), substr) >= n {
			return string(b)
		}
		select {
		case <-w.Events:
		case err := <-w.Errors:
			m.t.Fatalf("watch %s: %v", m.logs, err)
		case <-timeout:
			m.t.Fatalf("%s never had %d× %q:\n%s", name, n, substr, b)
		}
	}
}

func (m *mps) daemonPID() int {
	m.t.Helper()
	b, err := os.ReadFile(filepath.Join(m.pipe, "nvidia-cuda-mps-control.pid"))
	if err != nil {
		m.t.Fatalf("pid file: %v", err)
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		m.t.Fatalf("pid file %q: %v", b, err)
	}
	return pid
}

// serverPID returns the only running server.
func (m *mps) serverPID() int {
	m.t.Helper()
	out := strings.Fields(m.cmd("get_server_list"))
	if len(out) != 1 {
		m.t.Fatalf("servers %q; want one", out)
	}
	pid, _ := strconv.Atoi(out[0])
	return pid
}

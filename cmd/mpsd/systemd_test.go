package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
	"github.com/mpsd/mpsd/internal/sdnotify/sdnotifytest"
)

// gatedEmulator is an emulator directory whose control daemon refuses to
// start until the file gate exists, so mpsd serves its API with its
// instances not yet up.
func gatedEmulator(t *testing.T, real, gate string) string {
	dir := filepath.Join(t.TempDir(), "emu")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nvidia-cuda-mps-server", "mpsemu-client"} {
		if err := os.Symlink(filepath.Join(real, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	script := fmt.Sprintf("#!/bin/sh\n[ -e %s ] || { echo 'test gate closed' >&2; exit 1; }\nexec %s \"$@\"\n",
		gate, filepath.Join(real, "nvidia-cuda-mps-control"))
	if err := os.WriteFile(filepath.Join(dir, "nvidia-cuda-mps-control"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

var summaryRE = regexp.MustCompile(`^STATUS=(no instances|instances: [a-z0-9, ]+); leases: \d+ running, \d+ queued$`)

// The mpsd command in this process (run), with NOTIFY_SOCKET and WATCHDOG_USEC
// as systemd sets them, on simulated GPUs whose MPS daemons cannot start
// until the test lets them: the API is served while they fail, STATUS=
// says so and READY=1 does not come; once both are up READY=1 comes with
// their summary, then watchdog pings; SIGTERM (ctx) brings STOPPING=1.
func TestNotifyMain(t *testing.T) {
	e := newEnv(t, oneGroup)
	gate := filepath.Join(e.dir, "gate")
	e.emu = gatedEmulator(t, e.emu, gate)
	e.writeConfig(oneGroup)
	sdnotifytest.ClearEnv(t)
	nl := sdnotifytest.New(t)
	t.Setenv("NOTIFY_SOCKET", nl.Path)
	t.Setenv("WATCHDOG_USEC", "400000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--config", e.cfgPath, "--simulate", "--log-level", "debug"}, e.log, runConfig{statusEvery: 20 * time.Millisecond})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(waitFor):
			t.Errorf("run did not return within %s", waitFor)
		}
	})

	// Served, instances failing to start.
	deadline := time.Now().Add(waitFor)
	for {
		st, err := apiStatus(e.socket)
		if err == nil && len(st.Instances) == 2 {
			if instancesUp(st, 1) || instancesUp(st, 2) || st.Instances[0].DaemonPID > 0 || st.Instances[1].DaemonPID > 0 {
				t.Fatalf("instances up with the gate closed: %+v", st.Instances)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mpsd not serving: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	nl.Wait(t, "STATUS=starting", 0, waitFor, sdnotifytest.Has("STATUS=starting"))
	i := nl.Wait(t, "STATUS= with a summary of instances not up", 0, waitFor, func(m string) bool {
		return summaryRE.MatchString(m) && !strings.Contains(m, "2 ready")
	})
	time.Sleep(300 * time.Millisecond)
	for _, m := range nl.All() {
		if sdnotifytest.Has("READY=1")(m) || sdnotifytest.Has("WATCHDOG=1")(m) {
			t.Fatalf("%q before the instances are up; received %q", m, nl.All())
		}
	}

	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := nl.Wait(t, "READY=1", i, waitFor, sdnotifytest.Has("READY=1"))
	st, err := apiStatus(e.socket)
	if err != nil || !instancesUp(st, 2) {
		t.Fatalf("READY=1 with instances not up: %+v, %v", st.Instances, err)
	}
	if got, want := nl.All()[r], "READY=1\nSTATUS=instances: 2 ready; leases: 0 running, 0 queued"; got != want {
		t.Errorf("ready message %q, want %q", got, want)
	}
	w := nl.Wait(t, "WATCHDOG=1", r+1, waitFor, sdnotifytest.Has("WATCHDOG=1"))
	nl.Wait(t, "a second WATCHDOG=1", w+1, waitFor, sdnotifytest.Has("WATCHDOG=1"))

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("run = %d after ctx ended", code)
		}
		done <- code // for the cleanup
	case <-time.After(waitFor):
		t.Fatalf("run did not return within %s", waitFor)
	}
	msgs := nl.All()
	s := nl.Wait(t, "STOPPING=1", r, time.Second, sdnotifytest.Has("STOPPING=1"))
	if c := nl.Count(0, sdnotifytest.Has("READY=1")); c != 1 {
		t.Errorf("READY=1 sent %d times", c)
	}
	for _, m := range msgs {
		if strings.HasPrefix(m, "STATUS=") && !summaryRE.MatchString(m) && m != "STATUS=starting" {
			t.Errorf("STATUS= line %q is not the summary", m)
		}
	}
	if b, err := os.ReadFile(e.log.Name()); err != nil || !strings.Contains(string(b), "systemd watchdog enabled") {
		t.Errorf("log does not say the watchdog is on (%v)", err)
	}
	t.Logf("%d notifications; READY=1 at %d, STOPPING=1 at %d", len(msgs), r, s)
}

// mpsdUnderSystemd starts the mpsd binary as systemd starts a socket-
// activated service: the sockets are fds 3.., LISTEN_FDS counts them and
// LISTEN_PID (and WATCHDOG_PID) name the process itself, which only the
// child knows: sh sets them and execs mpsd in the same process. The test
// binary cannot take them itself (the Go runtime already holds fds 3-4).
func mpsdUnderSystemd(bin string, files []*os.File, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command("/bin/sh", append([]string{"-c", `LISTEN_PID=$$ WATCHDOG_PID=$$ exec "$0" "$@"`, bin}, args...)...)
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES":
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "LISTEN_FDS="+strconv.Itoa(len(files)))
	cmd.Env = append(cmd.Env, env...)
	cmd.ExtraFiles = files
	return cmd
}

// The mpsd binary socket-activated with a listener the test made (not the
// config's socket), and NOTIFY_SOCKET/WATCHDOG_USEC: it serves the API on
// that socket, says so, reports READY=1 and pings; after SIGTERM it says
// STOPPING=1, exits 0 and leaves the socket, which is systemd's, in place.
func TestActivationBinary(t *testing.T) {
	e := newEnv(t, oneGroup)
	nl := sdnotifytest.New(t)
	sock := filepath.Join(e.dir, "act.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	defer func() { _ = ln.Close() }()
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()

	cmd := mpsdUnderSystemd(filepath.Join(e.bin, "mpsd"), []*os.File{f},
		[]string{"LISTEN_FDNAMES=mpsd.socket", "NOTIFY_SOCKET=" + nl.Path, "WATCHDOG_USEC=1000000"},
		"--config", e.cfgPath, "--simulate")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	p := startProc(t, cmd)

	r := nl.Wait(t, "READY=1", 0, waitFor, sdnotifytest.Has("READY=1"))
	st, err := apiStatus(sock)
	if err != nil || !instancesUp(st, 2) {
		t.Fatalf("API on the passed-in socket: %+v, %v", st, err)
	}
	if _, err := os.Stat(e.socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mpsd made the config's socket %s though systemd passed one: %v", e.socket, err)
	}
	nl.Wait(t, "WATCHDOG=1", r+1, waitFor, sdnotifytest.Has("WATCHDOG=1"))
	if !strings.Contains(stderr.String(), "API socket from systemd") || !strings.Contains(stderr.String(), sock) {
		t.Errorf("mpsd does not log where its socket came from:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "not the config's socket") {
		t.Errorf("mpsd does not warn that the passed socket is not the config's %s:\n%s", e.socket, stderr.String())
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("mpsd exit %d after SIGTERM:\n%s", code, stderr.String())
	}
	nl.Wait(t, "STOPPING=1", r, time.Second, sdnotifytest.Has("STOPPING=1"))
	// The socket is systemd's: still there, still taking connections
	// (queued for the next mpsd).
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		t.Fatalf("socket gone after mpsd stopped: %v", err)
	}
	_ = c.Close()
	_, _ = e.log.WriteString(stderr.String())
}

// What systemd passes must be exactly one listening unix stream socket;
// anything else stops mpsd at once (before it reads its config) with a
// message that says what was passed.
func TestActivationErrors(t *testing.T) {
	bin := filepath.Join(emutest.CmdDir(t), "mpsd")
	dir, err := os.MkdirTemp("", "sda")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	unixListener := func(name string) *os.File {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, name), Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ln.Close() }()
		f, err := ln.File()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	tcp := func() *os.File {
		ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ln.Close() }()
		f, err := ln.File()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	gram := func() *os.File {
		c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "gram"), Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		f, err := c.File()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	unlistened := func() *os.File {
		fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: filepath.Join(dir, "idle")}); err != nil {
			t.Fatal(err)
		}
		return os.NewFile(uintptr(fd), "idle")
	}
	plain := func() *os.File {
		f, err := os.Open("/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, tc := range []struct {
		name  string
		files func() []*os.File
		want  string
	}{
		{"two sockets", func() []*os.File { return []*os.File{unixListener("a"), unixListener("b")} }, "systemd passed 2 sockets"},
		{"tcp", func() []*os.File { return []*os.File{tcp()} }, "systemd passed a tcp socket"},
		{"datagram", func() []*os.File { return []*os.File{gram()} }, "systemd passed a unixgram socket"},
		{"not listening", func() []*os.File { return []*os.File{unlistened()} }, "does not listen"},
		{"not a socket", func() []*os.File { return []*os.File{plain()} }, "not a listening stream socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := tc.files()
			defer func() {
				for _, f := range files {
					_ = f.Close()
				}
			}()
			nl := sdnotifytest.New(t)
			cmd := mpsdUnderSystemd(bin, files, []string{"NOTIFY_SOCKET=" + nl.Path}, "--config", filepath.Join(dir, "absent.yaml"))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), tc.want) || strings.Contains(stderr.String(), "absent.yaml") {
				t.Errorf("mpsd: %v, stderr %q; want exit 1 and %q (before the config is read)", err, stderr.String(), tc.want)
			}
			// systemctl status shows why.
			nl.Wait(t, "STATUS=mpsd cannot start", 0, waitFor, func(m string) bool {
				return strings.HasPrefix(m, "STATUS=mpsd cannot start: socket activation: ") && strings.Contains(m, tc.want)
			})
		})
	}
}

// unitKeys reads a unit file's assignments, section.Key → values.
func unitKeys(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	keys := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "["):
			section = strings.Trim(l, "[]")
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				t.Fatalf("%s: line %q", path, l)
			}
			keys[section+"."+k] = append(keys[section+"."+k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// The shipped units say what docs/architecture.md#metrics-and-systemd and the deployment need, and
// systemd-analyze verify accepts them without a word. verify also checks
// that ExecStart's program exists, so the test verifies copies whose
// ExecStart names the built bin/mpsd instead of /usr/bin/mpsd (the
// only change), with the man page Documentation= names where man finds
// it; a copy with a typo must draw a complaint, or verify would prove
// nothing here.
func TestUnitsVerify(t *testing.T) {
	src := filepath.Join("..", "..", "examples", "systemd")
	svc := unitKeys(t, filepath.Join(src, "mpsd.service"))
	sock := unitKeys(t, filepath.Join(src, "mpsd.socket"))
	for k, want := range map[string]string{
		"Service.Type":            "notify",
		"Service.NotifyAccess":    "main",
		"Service.ExecStart":       "/usr/bin/mpsd --config " + defaultConfigPath,
		"Service.KillMode":        "process",
		"Service.Delegate":        "yes",
		"Service.WatchdogSec":     "30s",
		"Service.Restart":         "on-failure",
		"Service.TimeoutStartSec": "5min",
		"Unit.Requires":           "mpsd.socket",
		"Socket.ListenStream":     api.DefaultSocket,
		"Socket.SocketMode":       "0666",
	} {
		m := svc
		if strings.HasPrefix(k, "Socket.") {
			m = sock
		}
		if got := m[k]; len(got) != 1 || got[0] != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	// Documentation= points at what the package installs.
	for name, m := range map[string]map[string][]string{"mpsd.service": svc, "mpsd.socket": sock} {
		if got, want := strings.Join(m["Unit.Documentation"], " "), "man:mpsd(8) file:///usr/share/doc/mpsd/architecture.md"; got != want {
			t.Errorf("%s: Documentation=%q, want %q", name, got, want)
		}
	}
	if !strings.Contains(strings.Join(svc["Unit.After"], " "), "mpsd.socket") {
		t.Errorf("Unit.After = %q, want mpsd.socket in it", svc["Unit.After"])
	}
	// Sandboxing that would cut mpsd off /dev/nvidia*, /dev/shm, cgroups
	// or the clients' /tmp and IPC.
	for _, k := range []string{"PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "ProtectKernelTunables", "ProtectControlGroups", "PrivateTmp", "PrivateIPC", "MemoryDenyWriteExecute", "RuntimeDirectory", "ProtectProc", "ProcSubset"} {
		if v, ok := svc["Service."+k]; ok {
			t.Errorf("mpsd.service sets %s=%s, which breaks MPS or cgroups", k, v)
		}
	}
	if v := svc["Service.ProtectSystem"]; len(v) == 1 && v[0] == "strict" {
		t.Errorf("ProtectSystem=strict makes /sys/fs/cgroup's neighbours and MPS's files read-only")
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skipf("systemd-analyze not installed (%v): unit files checked for their settings only", err)
	}
	bin, err := filepath.Abs(filepath.Join(emutest.CmdDir(t), "mpsd"))
	if err != nil {
		t.Fatal(err)
	}
	verify := func(t *testing.T, edit func(service string) string) string {
		dir := t.TempDir()
		for _, name := range []string{"mpsd.service", "mpsd.socket"} {
			b, err := os.ReadFile(filepath.Join(src, name))
			if err != nil {
				t.Fatal(err)
			}
			s := string(b)
			if name == "mpsd.service" {
				s = strings.Replace(s, "ExecStart=/usr/bin/mpsd ", "ExecStart="+bin+" ", 1)
				s = edit(s)
			}
			if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// Documentation=man:mpsd(8): verify runs man for it, which
		// finds the page where the package puts it (MANPATH alone).
		man := filepath.Join(dir, "man")
		if err := os.MkdirAll(filepath.Join(man, "man8"), 0o755); err != nil {
			t.Fatal(err)
		}
		page, err := os.ReadFile(filepath.Join("..", "..", "docs", "man", "mpsd.8"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(man, "man8", "mpsd.8"), page, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(analyze, "verify", filepath.Join(dir, "mpsd.socket"), filepath.Join(dir, "mpsd.service"))
		cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0", "MANPATH="+man)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Sprintf("%v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if out := verify(t, func(s string) string { return s }); out != "" {
		t.Errorf("systemd-analyze verify:\n%s", out)
	}
	if out := verify(t, func(s string) string { return strings.Replace(s, "\nKillMode=process\n", "\nKillMode=proces\n", 1) }); !strings.Contains(out, "proces") {
		t.Errorf("systemd-analyze verify accepts KillMode=proces (%q): the check proves nothing here", out)
	}
}

package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
)

// TestCallerFDs: descriptors 3 to 9 that the caller passes (as a shell's
// "3<file" does) reach the program at their numbers, each the same open
// file, and the program has no others than the caller's. The trampoline
// once put its own pipes at 3 and 4, closing the caller's.
func TestCallerFDs(t *testing.T) {
	fake := apitest.New(t, apitest.Grant)
	dir := t.TempDir()
	cmd := exec.Command(bin, "--", "sh", "-c",
		`for i in 3 4 5 6 7 8 9; do read -r line <&$i && echo "$i: $line"; done; echo $$; read line; exit 0`)
	cmd.Env = []string{"PATH=/usr/bin:/bin", api.EnvSocket + "=" + fake.Socket}
	for fd := 3; fd <= 9; fd++ {
		name := filepath.Join(dir, strconv.Itoa(fd))
		if err := os.WriteFile(name, []byte("file "+strconv.Itoa(fd)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, f) // at 3 + its index
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = in.Close() // read ends, and so does the program
		if err := cmd.Wait(); err != nil {
			t.Errorf("mps-launch: %v", err)
		}
	}()
	r := bufio.NewReader(out)
	for fd := 3; fd <= 9; fd++ {
		line, err := r.ReadString('\n')
		if want := fmt.Sprintf("%d: file %d\n", fd, fd); line != want {
			_ = cmd.Process.Kill()
			t.Fatalf("the program read %q, %v; want %q", line, err, want)
		}
	}
	line, err := r.ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("command printed %q, %v", line, err)
	}
	// The caller's: 0 to 9 here, and what this process passes on
	// without close-on-exec (cmd inherits that too).
	got, inherited := apitest.ProgramFDs(t, pid)
	want := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	for _, fd := range inherited {
		if !slices.Contains(want, fd) {
			want = append(want, fd)
		}
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the program has descriptors %v, want %v", got, want)
	}
}

// listenerChildEnv makes the test binary serveListener: a program started
// the way systemd starts a socket-activated server.
const listenerChildEnv = "MPS_LAUNCH_TEST_LISTENER"

// serveListener accepts one connection on the listening socket at fd 3
// (LISTEN_FDS=1) and writes a line to it.
func serveListener() int {
	if os.Getenv("LISTEN_FDS") != "1" {
		fmt.Fprintln(os.Stderr, "serveListener: LISTEN_FDS is not 1")
		return 1
	}
	l, err := net.FileListener(os.NewFile(3, "LISTEN_FDS 3"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "serveListener: fd 3: %v\n", err)
		return 1
	}
	defer l.Close()
	c, err := l.Accept()
	if err != nil {
		fmt.Fprintf(os.Stderr, "serveListener: accept: %v\n", err)
		return 1
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "accepted by %d\n", os.Getpid()); err != nil {
		fmt.Fprintf(os.Stderr, "serveListener: %v\n", err)
		return 1
	}
	return 0
}

// TestSocketActivated: a listening socket passed at fd 3 (as systemd's
// socket activation passes it, LISTEN_FDS=1) reaches the program through
// mps-launch, and the program accepts a connection on it.
func TestSocketActivated(t *testing.T) {
	fake := apitest.New(t, apitest.Grant)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addr := filepath.Join(t.TempDir(), "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false) // the program listens on it from here on
	lf, err := l.File()
	_ = l.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	cmd := exec.Command(bin, "--", self)
	cmd.Env = []string{"PATH=/usr/bin:/bin", api.EnvSocket + "=" + fake.Socket, "LISTEN_FDS=1", listenerChildEnv + "=1"}
	cmd.ExtraFiles = []*os.File{lf}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = lf.Close() // only the program holds the socket now
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// A connection waits in the socket's backlog until the program,
	// started once the lease is granted, accepts it.
	c, err := net.Dial("unix", addr)
	if err != nil {
		_ = cmd.Process.Kill()
		<-done
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetReadDeadline(time.Now().Add(apitest.Wait)); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if !strings.HasPrefix(line, "accepted by ") {
		t.Errorf("the program wrote %q, %v on the connection", line, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("mps-launch: %v; stderr %q", err, stderr.String())
		}
	case <-time.After(apitest.Wait):
		_ = cmd.Process.Kill()
		<-done
		t.Errorf("mps-launch did not end; stderr %q", stderr.String())
	}
}

// TestSignalsIgnoredAtStart: under nohup (SIGHUP ignored) the command
// starts with SIGHUP ignored too, and a hangup that reaches mps-launch is
// not passed on; the signals mps-launch was not started ignoring still are.
func TestSignalsIgnoredAtStart(t *testing.T) {
	fake := apitest.New(t, apitest.Grant)
	// The shell ignores SIGHUP and execs mps-launch with it ignored, as
	// nohup does.
	cmd := exec.Command("/bin/sh", "-c", `trap '' HUP; exec "$0" "$@"`, bin, "--", "/bin/sh", "-c",
		`grep '^SigIgn:' /proc/$$/status; trap 'echo term; exit 7' TERM; echo ready; read line`)
	cmd.Env = []string{"PATH=/usr/bin:/bin", api.EnvSocket + "=" + fake.Socket}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe() // open and empty: read waits
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(out)
	ign, err := r.ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("command printed %q, %v", ign, err)
	}
	mask, perr := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(ign, "SigIgn:")), 16, 64)
	if perr != nil || mask&(1<<(syscall.SIGHUP-1)) == 0 {
		t.Errorf("the command's %q, %v: SIGHUP is not ignored", strings.TrimSpace(ign), perr)
	}
	if line, err := r.ReadString('\n'); line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("command printed %q, %v", line, err)
	}
	// Forwarded, a SIGHUP would come before the SIGTERM.
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, _ := r.ReadString('\n')
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 7 || rest != "term\n" {
		t.Errorf("exit %d, output %q; want the TERM trap's 7 and \"term\"", code, rest)
	}
}

// TestLimitsInherited: the command gets the caller's resource limits,
// although the Go runtime raises RLIMIT_NOFILE's soft limit to the hard
// one in mps-launch and in its trampoline (both restore it for what they
// exec), and a program that relies on select(2) must not see more than
// the 1024 it was started with.
func TestLimitsInherited(t *testing.T) {
	fake := apitest.New(t, apitest.Grant)
	cmd := exec.Command("/bin/sh", "-c", `ulimit -S -n 200 && exec "$0" "$@"`, bin, "--", "/bin/sh", "-c", `ulimit -S -n`)
	cmd.Env = []string{"PATH=/usr/bin:/bin", api.EnvSocket + "=" + fake.Socket}
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "200\n" {
		t.Errorf("the command's soft RLIMIT_NOFILE: %q, %v; want the caller's 200", out, err)
	}
}

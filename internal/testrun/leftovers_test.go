package testrun

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

// Helper modes of the test binary, selected by the environment.
const (
	// spawnerEnv: start a long sleep with Start, end many threads, print
	// the sleep's pid, then wait to be killed.
	spawnerEnv = "TESTRUN_TEST_SPAWNER"
)

func TestMain(m *testing.M) {
	if os.Getenv(spawnerEnv) != "" {
		os.Exit(spawner())
	}
	goleak.VerifyTestMain(m)
}

func spawner() int {
	cmd := exec.Command("sleep", "1000")
	if err := Start(cmd); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Threads that end (a goroutine locked to its thread returns, as
	// package mps does on purpose) must not take the sleep with them.
	for range 50 {
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends
			close(done)
		}()
		<-done
	}
	fmt.Println(cmd.Process.Pid)
	_ = cmd.Wait()
	return 0
}

// alive reports whether pid runs (a zombie has ended).
func alive(pid int) bool {
	st, err := readStat(pid)
	return err == nil && st.state != 'Z'
}

// TestStartDiesWithParent: a process started with Start outlives the
// threads its parent ends, and dies when its parent is killed.
func TestStartDiesWithParent(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), spawnerEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		t.Fatalf("spawner printed %q, %v", line, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if !alive(pid) {
		t.Fatalf("the process %d died with a thread of its parent", pid)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if !waitGone(pid) {
		t.Errorf("process %d outlived its killed parent", pid)
	}
}

// sleeper starts a sleep in dir with env (nil: none) that the test kills
// when it ends.
func sleeper(t *testing.T, dir string, env []string) int {
	t.Helper()
	cmd := exec.Command("sleep", "1000")
	cmd.Dir, cmd.Env = dir, env
	if env == nil {
		cmd.Env = []string{}
	}
	if err := Start(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd.Process.Pid
}

// TestCheckOnlyTheRun: the check finds the processes, directories and
// cgroups tied to its run, by each of the ties, and nothing else (here,
// processes just like them that belong to no run or another run); Clean
// removes what it found and nothing else.
func TestCheckOnlyTheRun(t *testing.T) {
	run, err := Begin(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	other, err := Begin(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvRun, run)
	left := t.TempDir() // stands for a test's directory, never removed
	if err := record(kindDir, left); err != nil {
		t.Fatal(err)
	}
	if err := RecordUser("mpsdt-no-such-user"); err != nil {
		t.Fatal(err)
	}
	removed, err := MkdirTemp(t.TempDir(), "gone")
	if err != nil || os.Remove(removed) != nil {
		t.Fatalf("MkdirTemp: %q, %v", removed, err)
	}
	foreignDir := t.TempDir()
	// Start records a process in the ledger of the run its process is
	// in: that alone ties the first sleep, whose environment and directory
	// say nothing.
	ours := map[int]string{sleeper(t, foreignDir, []string{"X=1"}): "started by a test"}
	markers := Env(nil)
	t.Setenv(EnvRun, "")
	ours[sleeper(t, foreignDir, markers[:1])] = "environment: " + EnvRun + "=" + run
	ours[sleeper(t, foreignDir, markers[1:])] = "environment: " + EnvEmuRun + "=" + run
	ours[sleeper(t, left, nil)] = "working directory in " + left
	ours[sleeper(t, foreignDir, []string{"CUDA_MPS_PIPE_DIRECTORY=" + left + "/p"})] = "environment names " + left
	foreign := []int{
		sleeper(t, foreignDir, nil),
		sleeper(t, foreignDir, []string{EnvRun + "=" + other}),
		sleeper(t, foreignDir, []string{"CUDA_MPS_PIPE_DIRECTORY=" + left + "-other/p"}),
	}
	got, err := Check(run)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, p := range got.Procs {
		pid, _ := strconv.Atoi(strings.Fields(p)[0])
		pids = append(pids, pid)
		why, ok := ours[pid]
		if !ok {
			t.Errorf("the check took %s for the run's", p)
		} else if !strings.HasSuffix(p, "("+why+")") {
			t.Errorf("%s: want the reason %q", p, why)
		}
	}
	for pid := range ours {
		if !slices.Contains(pids, pid) {
			t.Errorf("the check missed %d", pid)
		}
	}
	if !slices.Equal(got.Dirs, []string{left}) {
		t.Errorf("directories %q, want %q", got.Dirs, left)
	}
	if len(got.Users)+len(got.Cgroups)+len(got.Default) != 0 {
		t.Errorf("users %q, cgroups %q, default directories %q: want none", got.Users, got.Cgroups, got.Default)
	}
	if errs := got.Clean(); len(errs) > 0 {
		t.Errorf("Clean: %v", errs)
	}
	for pid := range ours {
		if alive(pid) {
			t.Errorf("Clean left %d running", pid)
		}
	}
	for _, pid := range foreign {
		if !alive(pid) {
			t.Errorf("Clean killed %d, a process of no run or another", pid)
		}
	}
	if _, err := os.Stat(left); err == nil {
		t.Errorf("Clean left %s", left)
	}
	after, err := Check(run)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Empty() {
		t.Errorf("after Clean:\n%s", after)
	}
}

// TestCheckCgroups: a cgroup named for the run is the run's, with the
// processes in it; one named for another run is not.
func TestCheckCgroups(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates cgroups in the host's cgroupfs")
	}
	// A hierarchy to make them in: v2's root, a hybrid host's unified
	// tree, or a v1 controller's.
	var root string
	for _, r := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/pids"} {
		if _, err := os.Stat(filepath.Join(r, "cgroup.procs")); err == nil {
			root = r
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup hierarchy mounted under /sys/fs/cgroup")
	}
	run, err := Begin(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvRun, run)
	mine := filepath.Join(root, CgroupName(fmt.Sprintf("testrun-%d", os.Getpid())))
	t.Setenv(EnvRun, "")
	theirs := filepath.Join(root, CgroupName(fmt.Sprintf("testrun-%d", os.Getpid())))
	for _, d := range []string{mine, theirs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(d) })
	}
	pid := sleeper(t, t.TempDir(), nil)
	if err := os.WriteFile(filepath.Join(mine, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatal(err)
	}
	got, err := Check(run)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Cgroups, []string{mine}) {
		t.Errorf("cgroups %q, want %q", got.Cgroups, mine)
	}
	if len(got.Procs) != 1 || !strings.HasPrefix(got.Procs[0], strconv.Itoa(pid)+" ") || !strings.HasSuffix(got.Procs[0], "(in cgroup "+mine+")") {
		t.Errorf("processes %q, want %d in %s", got.Procs, pid, mine)
	}
	if errs := got.Clean(); len(errs) > 0 {
		t.Errorf("Clean: %v", errs)
	}
	if _, err := os.Stat(mine); err == nil {
		t.Errorf("Clean left %s", mine)
	}
	if _, err := os.Stat(theirs); err != nil {
		t.Errorf("Clean removed %s, another run's: %v", theirs, err)
	}
}

func TestParseStat(t *testing.T) {
	st, err := parseStat("42 (a (b) c) S 7 42 42 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 12345 1000 10 18446744073709551615")
	if err != nil || st != (procStat{state: 'S', ppid: 7, startTime: "12345"}) {
		t.Errorf("parseStat = %+v, %v", st, err)
	}
	for _, bad := range []string{"", "42 (x", "42 (x) S", "42 (x) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20", "42 (x) S y 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"} {
		if _, err := parseStat(bad); err == nil {
			t.Errorf("parseStat(%q) took it", bad)
		}
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add("1 (init) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 9 10 11")
	f.Add("2 ()) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20")
	f.Fuzz(func(t *testing.T, s string) {
		st, err := parseStat(s)
		if err == nil && (st.startTime == "" || st.state == 0) {
			t.Fatalf("parseStat(%q) = %+v", s, st)
		}
	})
}

func TestMentions(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"/tmp/mpst1", true},
		{"/tmp/mpst1/run/x", true},
		{"--config=/tmp/mpst1/mpsd.yaml", true},
		{"/tmp/mpst12", false},
		{"/tmp/mpst1-x", false},
		{"/tmp/mpst12 /tmp/mpst1", true},
		{"a:/tmp/mpst1:b", true},
		{"", false},
	} {
		if got := mentions(tc.s, "/tmp/mpst1"); got != tc.want {
			t.Errorf("mentions(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
}

func TestTagAndNames(t *testing.T) {
	run, err := Begin(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvRun, run)
	tag, _ := tagOf(run)
	if Tag() != tag || CgroupName("x") != CgroupPrefix+tag+"-x" {
		t.Errorf("Tag %q, CgroupName %q; want the run's tag %q", Tag(), CgroupName("x"), tag)
	}
	if env := Env([]string{"A=1"}); !slices.Equal(env, []string{"A=1", EnvRun + "=" + run, EnvEmuRun + "=" + run}) {
		t.Errorf("Env = %q", env)
	}
	t.Setenv(EnvRun, "")
	if Tag() == tag || !strings.HasPrefix(Tag(), "p") {
		t.Errorf("outside the run, Tag %q", Tag())
	}
	if env := Env([]string{"A=1"}); !slices.Equal(env, []string{"A=1"}) {
		t.Errorf("outside the run, Env = %q", env)
	}
	if _, err := Check(t.TempDir()); err == nil {
		t.Error("Check took a directory that is not a run's")
	}
}

// TestBeginRecordsDefaults: MPS's default directories that exist before
// the run are not the run's.
func TestBeginRecordsDefaults(t *testing.T) {
	dir := t.TempDir()
	pre, fresh := filepath.Join(dir, "nvidia-mps"), filepath.Join(dir, "nvidia-mps-log")
	saved := DefaultMPSDirs
	DefaultMPSDirs = []string{pre, fresh}
	t.Cleanup(func() { DefaultMPSDirs = saved })
	if err := os.Mkdir(pre, 0o755); err != nil {
		t.Fatal(err)
	}
	run, err := Begin(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(fresh, 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := Check(run)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Default, []string{fresh}) {
		t.Errorf("default directories %q, want only %q (made during the run)", got.Default, fresh)
	}
}

// TestLedgerMustBeOwn: the check kills and removes what the ledger names,
// so it refuses a ledger others may write.
func TestLedgerMustBeOwn(t *testing.T) {
	run, err := Begin(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(run, ledgerFile), 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := Check(run); err == nil || !strings.Contains(err.Error(), "not a ledger to act on") {
		t.Errorf("Check with a world-writable ledger: %v", err)
	}
	if err := os.Chmod(filepath.Join(run, ledgerFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(run, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := Check(run); err == nil {
		t.Error("Check took a ledger in a world-writable directory")
	}
	if err := os.Chmod(run, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Check(run); err != nil {
		t.Errorf("Check of a ledger of its own: %v", err)
	}
}

// A private /dev/shm mount (tmpfs, source mpsd-shm) a test left under the
// run's parent is a leftover, and Clean unmounts it; one there before the
// run, or a tmpfs of another source, is none of the run's.
func TestCheckShmMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	parent := t.TempDir()
	mount := func(name, source string) string {
		t.Helper()
		p := filepath.Join(parent, name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount(source, p, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(p, 0) })
		return p
	}
	before := mount("before", "mpsd-shm")
	run, err := Begin(parent)
	if err != nil {
		t.Fatal(err)
	}
	left := mount("left", "mpsd-shm")
	mount("other", "tmpfs")
	got, err := Check(run)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Mounts, []string{left}) || got.Empty() {
		t.Fatalf("mounts left: %q; want only %s", got.Mounts, left)
	}
	if !strings.Contains(got.String(), "private /dev/shm mounts left by the tests:\n  "+left) {
		t.Errorf("report %q does not name it", got.String())
	}
	if errs := got.Clean(); len(errs) > 0 {
		t.Fatal(errs)
	}
	if m := shmMounts(parent); !slices.Equal(m, []string{before}) {
		t.Errorf("after Clean: %q mounted; want only %s, which was there before", m, before)
	}
}

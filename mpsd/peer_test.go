package mpsd

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/policy"
)

// unixPeer reads uid, gid and the supplementary groups from the socket
// itself (SO_PEERCRED, SO_PEERGROUPS): here this process is both ends.
func TestUnixPeerGroupsFromSocket(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := unixPeer(s)
	if err != nil {
		t.Fatal(err)
	}
	if p.pid != os.Getpid() || p.uid != uint32(os.Getuid()) || p.gid != uint32(os.Getgid()) {
		t.Errorf("peer %+v, want pid %d uid %d gid %d", p, os.Getpid(), os.Getuid(), os.Getgid())
	}
	want, err := unix.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	got := make([]int, len(p.groups))
	for i, g := range p.groups {
		got[i] = int(g)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("SO_PEERGROUPS %v, want this process's groups %v", got, want)
	}
	if p.groups == nil {
		t.Error("groups nil; want a (possibly empty) list read from the socket")
	}
}

// Another process's groups, more than the first buffer holds (the
// ERANGE path), are read in full, as it had them when it connected.
func TestPeerGroupsOfAnotherProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a helper with 100 groups")
	}
	// Not t.TempDir: its parent is closed to the helper's uid.
	dir, err := os.MkdirTemp("", "mpsdpeer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(dir, "connflood")
	if b, err := exec.Command("go", "build", "-o", helper, "./testdata/connflood").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chmod(filepath.Join(dir, "s"), 0o666); err != nil {
		t.Fatal(err)
	}
	var groups []uint32
	for g := uint32(64100); g < 64200; g++ {
		groups = append(groups, g)
	}
	cmd := exec.Command(helper, "-socket", filepath.Join(dir, "s"), "-n", "1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 64163, Gid: 64163, Groups: groups}}
	cmd.Stdin = strings.NewReader("") // it lets go as soon as it has reported
	p := startProc(t, cmd)
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pr, err := unixPeer(s)
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Sorted(slices.Values(pr.groups))
	if pr.uid != 64163 || pr.gid != 64163 || pr.pid != p.pid() || !slices.Equal(got, groups) {
		t.Errorf("peer uid %d gid %d pid %d groups %v; want 64163, 64163, %d and the 100 groups it connected with", pr.uid, pr.gid, pr.pid, got, p.pid())
	}
	_ = p.wait(t)
}

func TestParseStatStart(t *testing.T) {
	line := []byte("4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 18446744073709551615\n")
	if v, err := parseStatStart(line); err != nil || v != 987654 {
		t.Errorf("parseStatStart = %d, %v; want 987654", v, err)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 x"} {
		if _, err := parseStatStart([]byte(bad)); err == nil {
			t.Errorf("parseStatStart(%q) accepted", bad)
		}
	}
}

func TestCgroupMounts(t *testing.T) {
	dir := t.TempDir()
	mi := filepath.Join(dir, "mountinfo")
	content := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:38 /sub /mnt/sub\040dir rw,relatime - cgroup2 cgroup2 rw
`
	if err := os.WriteFile(mi, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := cgroupMounts(mi)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"": "/sys/fs/cgroup/unified", "cpu,cpuacct": "/sys/fs/cgroup/cpu,cpuacct", "freezer": "/sys/fs/cgroup/freezer", "name=systemd": "/sys/fs/cgroup/systemd"}
	if len(got) != len(want) {
		t.Errorf("cgroupMounts = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("cgroupMounts[%q] = %q, want %q", k, got[k], v)
		}
	}
}

// The connection caps are fitted below the open-file limit, leaving the
// reserve and root's room, and never above what the config says.
func TestConnCapsFitOpenFiles(t *testing.T) {
	lim := policy.LimitsConfig{Connections: 1024, ConnectionsPerUser: 128, QueuedPerUser: 64, MetricsConnections: 32, MetricsConnectionsPerUser: 8}
	for _, tc := range []struct {
		nofile int
		want   connCaps
	}{
		{1 << 20, connCaps{total: 1024, perUser: 128, metrics: 32, metricsPerUser: 8}},
		{4096, connCaps{total: 1024, perUser: 128, metrics: 32, metricsPerUser: 8}},
		// 1024 files: 256 reserved, metrics 768/8 = 96 stays 32, the rest
		// less root's 16 is 720.
		{1024, connCaps{total: 720, perUser: 128, metrics: 32, metricsPerUser: 8}},
		// 300 files: 44 left; metrics 5, total 23, per user at most that.
		{300, connCaps{total: 23, perUser: 23, metrics: 5, metricsPerUser: 5}},
	} {
		r := &resources{log: slog.New(slog.DiscardHandler), nofile: tc.nofile}
		r.apply(lim)
		got := *r.caps.Load()
		if got != tc.want {
			t.Errorf("open files %d: caps %+v, want %+v", tc.nofile, got, tc.want)
		}
		if got.total+got.metrics+rootExtraConnections > tc.nofile-fdReserve(tc.nofile) {
			t.Errorf("open files %d: caps %+v leave less than the reserve", tc.nofile, got)
		}
	}
}

// FuzzParseStatStart: the command name in /proc/PID/stat is the process's
// to choose (prctl PR_SET_NAME, up to 15 bytes, parentheses and spaces
// included); whatever it is, the start time read is the kernel's.
func FuzzParseStatStart(f *testing.F) {
	for _, seed := range []string{"sleep", "a) S 1 2 3", ") ) )", "x\ny", ""} {
		f.Add(seed, uint64(987654))
	}
	f.Fuzz(func(t *testing.T, comm string, start uint64) {
		if len(comm) > 15 {
			comm = comm[:15]
		}
		line := fmt.Sprintf("4242 (%s) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 %d 1000 10 18446744073709551615\n", comm, start)
		got, err := parseStatStart([]byte(line))
		if err != nil || got != start {
			t.Fatalf("comm %q: start %d, %v; want %d", comm, got, err, start)
		}
	})
}

// bootTicks counts on the clock of /proc's start times: a process started
// between two readings has a start time between them, so reconciliation
// can tell a process that took a listed pid after the listing.
func TestBootTicksIsProcStartClock(t *testing.T) {
	for range 20 {
		before, err := bootTicks()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("sleep", "10")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		start, err := procStartTime("/proc", cmd.Process.Pid)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if err != nil {
			t.Fatal(err)
		}
		after, err := bootTicks()
		if err != nil {
			t.Fatal(err)
		}
		if start < before || start > after {
			t.Fatalf("a child's start time %d is not within the readings before (%d) and after (%d) it", start, before, after)
		}
	}
}

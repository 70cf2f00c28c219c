package systemdtest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// waitFor bounds every wait of these tests; reaching it fails the test.
const waitFor = 30 * time.Second

// requireEnv makes a missing prerequisite a failure instead of a skip.
const requireEnv = "MPSD_REQUIRE_SYSTEMD"

// Prefixes of what the tests leave on the host while they run: the
// temporary directory (in os.TempDir()) and the cgroup under the cgroup2
// root. Each is followed by the test process's pid, so that a later run
// can remove what a killed one left (pruneStale); hack/check-leftovers.sh
// looks for them.
const (
	dirPrefix    = "mpsd-systemd-"
	cgroupPrefix = "mpsd-test-systemd-"
)

// The manager's programs, Debian's paths (the systemd package).
const (
	systemdBin  = "/lib/systemd/systemd"
	journaldBin = "/lib/systemd/systemd-journald"
)

// hostPrograms are the other programs the machine needs, looked up on
// PATH: util-linux's unshare, nsenter, mount, systemd's clients, and
// dpkg and deb-systemd-helper, which install the package.
var hostPrograms = []string{"unshare", "nsenter", "mount", "mknod", "systemctl", "journalctl", "ss", "dpkg", "dpkg-deb", "deb-systemd-helper"}

// missing skips the test because of why, or fails it under
// MPSD_REQUIRE_SYSTEMD=1.
func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(requireEnv) == "1" {
		t.Fatalf("%s (%s=1 requires it)", why, requireEnv)
	}
	t.Skipf("skipping: %s", why)
}

// machine is a systemd 252 running as PID 1 of private pid, mount, UTS,
// network and cgroup namespaces, booted straight into a target of the
// test's (see doc.go for what keeps it off the host).
type machine struct {
	t    testing.TB
	dir  string // the test's directory: units, config, gates, logs
	path string // PATH of the commands run inside
	// cgroup is the host path of the cgroup2 cgroup that is the
	// namespace's cgroup root; cgroupName is its name under the cgroup2
	// mount.
	cgroup, cgroupName string
	// clientsFD is the cgroup in which the test's commands start, inside
	// the namespace's tree (so that mpsd may move them into leases even
	// where namespaces are delegation boundaries).
	clientsFD int
	nsenter   string
	unshare   *exec.Cmd
	unshareRc chan error
	pid       int // systemd's pid on the host
	procs     []*proc
	down      bool // shutdown ran
}

var machineSeq atomic.Int64

// cgroup2Mount returns where the unified hierarchy is mounted on this
// host: /sys/fs/cgroup (cgroup v2) or /sys/fs/cgroup/unified (hybrid).
func cgroup2Mount() (string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, pf := strings.Fields(pre), strings.Fields(post)
		if len(f) >= 5 && len(pf) >= 1 && pf[0] == "cgroup2" && f[3] == "/" {
			return f[4], nil
		}
	}
	return "", errors.New("no cgroup2 hierarchy mounted (the namespace's systemd needs one)")
}

// hostState is what the machine must leave as it found it on the host:
// the mount table and the sysctls a systemd as PID 1 would change were
// /proc/sys writable.
// Mounts under the temporary directory are left out: other tests mount
// and unmount there.
func hostState() string {
	var b strings.Builder
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	tmp := filepath.Clean(os.TempDir()) + "/"
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) >= 5 && !strings.HasPrefix(f[4], tmp) {
			b.WriteString(line + "\n")
		}
	}
	for _, k := range []string{"fs/file-max", "fs/nr_open", "kernel/core_pattern", "kernel/hostname"} {
		v, _ := os.ReadFile("/proc/sys/" + k)
		fmt.Fprintf(&b, "%s=%s", k, v)
	}
	return b.String()
}

// pruneStale removes what an earlier test process that was killed left:
// its directory and its (empty: its processes died with their
// namespace) cgroups. A process that still runs keeps its own.
func pruneStale(cg2 string) {
	gone := func(name, prefix string) bool {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			return false
		}
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil || pid == os.Getpid() {
			return false
		}
		_, err = os.Stat(fmt.Sprintf("/proc/%d", pid))
		return errors.Is(err, fs.ErrNotExist)
	}
	ents, _ := os.ReadDir(os.TempDir())
	for _, e := range ents {
		if gone(e.Name(), dirPrefix) {
			_ = os.RemoveAll(filepath.Join(os.TempDir(), e.Name()))
		}
	}
	ents, _ = os.ReadDir(cg2)
	for _, e := range ents {
		if gone(e.Name(), cgroupPrefix) {
			rmdirTree(filepath.Join(cg2, e.Name()))
		}
	}
}

// rmdirTree removes a cgroup and its descendants, deepest first; a
// cgroup that still has processes stays (rmdir fails).
func rmdirTree(top string) {
	var dirs []string
	_ = filepath.WalkDir(top, func(p string, de fs.DirEntry, err error) error {
		if err == nil && de.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Remove(dirs[i])
	}
}

// insideScript runs as PID 1 of the new namespaces (unshare --fork
// --mount-proc has made the mounts private and mounted a fresh /proc),
// prepares the filesystems and execs systemd. $1 is the test's directory.
//
// Safety, in order (see doc.go): the root mount becomes read-only in this
// namespace only (remount,bind changes this mount, never the filesystem),
// the test's directory alone stays writable; /usr, /etc and /var are
// overlays whose upper directories are on a tmpfs of the namespace's
// (dpkg installs there: the host's files and dpkg database stay as they
// are); /lib/systemd/system and /etc/systemd/system are the test's own
// directories, so that systemd sees the test's units and the package's,
// never the host's; /run and /dev are private tmpfs; /sys is a fresh
// read-only sysfs (of the new network namespace); /sys/fs/cgroup a
// cgroup2 mount made inside the new cgroup namespace, so its root is the
// test's cgroup and its mount options change nothing outside; /proc/sys
// is read-only. systemd runs with container= (so a shutdown would not
// remount anything read-only), a unit path of those two directories and
// /run/systemd/system only (no sysinit.target.wants, no tmpfiles, no
// timers) and no generators.
const insideScript = `set -eu
d=$1
mount -o remount,bind,ro /
mount --bind "$d" "$d"
mount -o remount,bind,rw "$d"
mount -t tmpfs -o mode=0755 tmpfs "$d/overlay"
for p in usr etc var; do
	mkdir "$d/overlay/$p" "$d/overlay/$p/upper" "$d/overlay/$p/work"
	mount -t overlay overlay -o "lowerdir=/$p,upperdir=$d/overlay/$p/upper,workdir=$d/overlay/$p/work" "/$p"
done
mount --bind "$d/lib-units" /usr/lib/systemd/system
mount --bind "$d/etc-units" /etc/systemd/system
# man-db's dpkg trigger would rebuild the whole man database at each install.
rm -f /var/lib/man-db/auto-update
# A container image's policy-rc.d (Docker's exits 101) forbids maintainer
# scripts to start or restart services; the machine is a booted host.
rm -f /usr/sbin/policy-rc.d
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
mkdir -p /run/systemd/journald.conf.d
printf '[Journal]\nStorage=volatile\n' >/run/systemd/journald.conf.d/mpsd-test.conf
mount -t tmpfs -o mode=0755,nosuid tmpfs /dev
mknod -m 666 /dev/null c 1 3
mknod -m 666 /dev/zero c 1 5
mknod -m 666 /dev/full c 1 7
mknod -m 666 /dev/random c 1 8
mknod -m 666 /dev/urandom c 1 9
mknod -m 666 /dev/tty c 5 0
mkdir -m 1777 /dev/shm
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs /sys
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
exec env -i container=mpsd-test PATH=/usr/sbin:/usr/bin:/sbin:/bin \
	SYSTEMD_UNIT_PATH=/etc/systemd/system:/run/systemd/system:/lib/systemd/system \
	SYSTEMD_GENERATOR_PATH="$d/empty" SYSTEMD_ENVIRONMENT_GENERATOR_PATH="$d/empty" \
	` + systemdBin + ` --system --unit=mpsd-test.target --show-status=no
`

// baseUnits are the units the test's systemd knows besides the
// package's, in its /lib/systemd/system: the targets that default
// dependencies name, empty, and (journaldUnits) journald's units, copies
// of Debian's own.
var baseUnits = map[string]string{
	"sysinit.target":  "[Unit]\nDescription=System Initialization (empty: mpsd test)\n",
	"basic.target":    "[Unit]\nDescription=Basic System (mpsd test)\nRequires=sysinit.target\nAfter=sysinit.target\n",
	"sockets.target":  "[Unit]\nDescription=Sockets (mpsd test)\n",
	"shutdown.target": "[Unit]\nDescription=Shutdown (mpsd test)\nDefaultDependencies=no\n",
	"mpsd-test.target": "[Unit]\nDescription=mpsd test\n" +
		"Wants=systemd-journald.socket systemd-journald-dev-log.socket systemd-journald.service mpsd.socket\n" +
		"After=systemd-journald.service mpsd.socket\n",
}

var journaldUnits = []string{"systemd-journald.service", "systemd-journald.socket", "systemd-journald-dev-log.socket"}

// boot checks the prerequisites, writes the unit directories (baseUnits)
// and boots the machine; it returns once mpsd-test.target is active. Cleanup kills the machine's systemd, which
// ends every process of the namespace, and removes the cgroups and the
// directory.
func boot(t *testing.T, path string) *machine {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "the systemd test runs systemd as PID 1 of new namespaces, which needs root")
	}
	var absent []string
	for _, p := range []string{systemdBin, journaldBin} {
		if _, err := os.Stat(p); err != nil {
			absent = append(absent, p)
		}
	}
	progs := map[string]string{}
	for _, p := range hostPrograms {
		if path, err := exec.LookPath(p); err == nil {
			progs[p] = path
		} else if _, err := os.Stat("/usr/sbin/" + p); err == nil {
			progs[p] = "/usr/sbin/" + p
		} else {
			absent = append(absent, p)
		}
	}
	if len(absent) > 0 {
		missing(t, fmt.Sprintf("systemd or util-linux programs missing: %s (apt-get install systemd util-linux mount iproute2)", strings.Join(absent, ", ")))
	}
	// Without a machine id systemd counts the boot as a first boot and
	// applies presets, writing under /etc.
	if id, err := os.ReadFile("/etc/machine-id"); err != nil || !regexp.MustCompile(`^[0-9a-f]{32}\n?$`).Match(id) {
		t.Fatalf("/etc/machine-id holds no machine id (%v): a systemd booted on this host's /etc would treat it as a first boot; refusing", err)
	}
	cg2, err := cgroup2Mount()
	if err != nil {
		missing(t, err.Error())
	}
	pruneStale(cg2)

	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", dirPrefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := &machine{t: t, dir: dir, path: path, clientsFD: -1, nsenter: progs["nsenter"]}
	m.cgroupName = fmt.Sprintf("%s%d-%d", cgroupPrefix, os.Getpid(), machineSeq.Add(1))
	m.cgroup = filepath.Join(cg2, m.cgroupName)
	for _, d := range []string{"lib-units", "etc-units", "empty", "overlay"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	units := maps.Clone(baseUnits)
	for _, u := range journaldUnits {
		b, err := os.ReadFile(filepath.Join("/lib/systemd/system", u))
		if err != nil {
			missing(t, fmt.Sprintf("journald's unit: %v", err))
		}
		units[u] = string(b)
	}
	for name, body := range units {
		if err := os.WriteFile(filepath.Join(dir, "lib-units", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := filepath.Join(dir, "inside.sh")
	if err := os.WriteFile(script, []byte(insideScript), 0o755); err != nil {
		t.Fatal(err)
	}

	if err := os.Mkdir(m.cgroup, 0o755); err != nil {
		t.Fatalf("create the namespace's cgroup: %v", err)
	}
	before := hostState()
	t.Cleanup(func() {
		m.shutdown()
		if after := hostState(); after != before {
			t.Errorf("the host's mounts or sysctls changed while the machine ran:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
	nsRoot, err := os.Open(m.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer nsRoot.Close()

	out, err := os.Create(filepath.Join(dir, "systemd.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	m.unshare = exec.Command(progs["unshare"], "--pid", "--fork", "--kill-child=SIGKILL", "--mount", "--uts", "--net",
		"--cgroup", "--mount-proc", "--propagation", "private", "/bin/sh", script, dir)
	m.unshare.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	m.unshare.Stdout, m.unshare.Stderr = out, out
	// Pdeathsig: should this test process die, unshare dies and takes the
	// namespace's systemd with it (--kill-child), and systemd, PID 1 there,
	// every process of the namespace. The signal comes when the thread
	// that started unshare ends, so that thread stays locked to the
	// goroutine that waits for unshare.
	m.unshare.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL, UseCgroupFD: true, CgroupFD: int(nsRoot.Fd())}
	started := make(chan error, 1)
	m.unshareRc = make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := m.unshare.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		m.unshareRc <- m.unshare.Wait()
	}()
	if err := <-started; err != nil {
		m.unshare = nil
		t.Fatalf("start unshare: %v", err)
	}

	// systemd is unshare's only child; it runs once the script has
	// exec'd it.
	m.waitUntil("systemd running as PID 1 of the namespace", func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", m.unshare.Process.Pid, m.unshare.Process.Pid))
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return false
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if exe != systemdBin && exe != "/usr"+systemdBin {
			return false
		}
		m.pid = pid
		return true
	})
	// systemctl reaches the manager through its private socket.
	m.waitUntil("systemd's private socket", func() bool {
		_, err := os.Stat(m.root("/run/systemd/private"))
		return err == nil
	})
	clients := filepath.Join(m.cgroup, "test-clients")
	if err := os.Mkdir(clients, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Open(clients, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	m.clientsFD = fd
	m.waitUntil("mpsd-test.target active", func() bool {
		return m.show("mpsd-test.target", "ActiveState")["ActiveState"] == "active"
	})
	return m
}

// writeUnit writes a unit file (or a drop-in: "x.service.d/y.conf") into
// the machine's /etc/systemd/system; systemctl daemon-reload makes a
// running manager read it.
func (m *machine) writeUnit(name, body string) {
	m.t.Helper()
	p := m.etcUnit(name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		m.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		m.t.Fatal(err)
	}
}

// etcUnit is the host's path of a file in the machine's
// /etc/systemd/system.
func (m *machine) etcUnit(name string) string { return filepath.Join(m.dir, "etc-units", name) }

// libUnit is the host's path of a file in the machine's
// /lib/systemd/system, where the package's units are installed.
func (m *machine) libUnit(name string) string { return filepath.Join(m.dir, "lib-units", name) }

// root is path inside the namespace, seen from the host (systemd's
// root: the namespace's mounts, its /proc among them).
func (m *machine) root(path string) string {
	return fmt.Sprintf("/proc/%d/root%s", m.pid, path)
}

// shutdown tears the machine down: SIGKILL to its systemd (never a
// poweroff: see doc.go), which ends every process of the pid namespace;
// then the cgroups go, deepest first. The pid is systemd's for sure:
// unshare, our child, has not reaped it.
func (m *machine) shutdown() {
	if m.down {
		return
	}
	m.down = true
	if m.unshare != nil {
		m.stop()
	}
	// Nothing can be left in the cgroups (the pid namespace is gone);
	// RemoveCgroupTree would kill it and fail the test if something were.
	var left []string
	_ = filepath.WalkDir(m.cgroup, func(p string, de fs.DirEntry, err error) error {
		if err == nil && de.IsDir() {
			if b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs")); len(bytes.TrimSpace(b)) > 0 {
				left = append(left, p+": "+strings.Join(strings.Fields(string(b)), " "))
			}
		}
		return nil
	})
	if len(left) > 0 {
		m.t.Errorf("processes left in the machine's cgroups after its end: %v", left)
	}
	emutest.RemoveCgroupTree(m.cgroupName)
	if _, err := os.Stat(m.cgroup); err == nil {
		m.t.Errorf("cgroup %s could not be removed", m.cgroup)
	}
}

// stop kills the machine (see shutdown) and waits for every command the
// test started.
func (m *machine) stop() {
	if m.t.Failed() && m.pid != 0 {
		// systemd's own messages, then the last lines of everything (a
		// watchdog kill puts mpsd's goroutine dump there).
		if out, err := m.run("journalctl", "--no-pager", "-b", "-o", "short-monotonic", "_PID=1"); err == nil {
			m.t.Logf("the machine's systemd said:\n%s", out)
		}
		if out, err := m.run("journalctl", "--no-pager", "-b", "-o", "short-monotonic", "-n", "150"); err == nil {
			m.t.Logf("the machine's journal (tail):\n%s", out)
		}
	}
	if m.pid != 0 {
		_ = syscall.Kill(m.pid, syscall.SIGKILL)
	} else {
		_ = m.unshare.Process.Kill()
	}
	select {
	case <-m.unshareRc:
	case <-time.After(waitFor):
		m.t.Errorf("unshare did not end within %s of SIGKILL to the namespace's systemd", waitFor)
	}
	for _, p := range m.procs {
		if p.waitQuiet(waitFor).code == -1 {
			m.t.Errorf("%v outlived the namespace", p.cmd.Args)
		}
	}
	if m.clientsFD >= 0 {
		_ = syscall.Close(m.clientsFD)
	}
	if b, _ := os.ReadFile(filepath.Join(m.dir, "systemd.out")); len(bytes.TrimSpace(b)) > 0 && m.t.Failed() {
		m.t.Logf("unshare and the namespace's PID 1 said:\n%s", b)
	}
}

// command prepares argv to run inside the namespace (nsenter into
// systemd's namespaces), started in the test's clients cgroup there.
func (m *machine) command(argv ...string) *exec.Cmd {
	return m.commandAs(nil, argv...)
}

// user is a test user commands run as.
type user struct {
	name     string
	uid, gid int
}

// commandAs is command run as u (nsenter's --setuid and --setgid, which
// drop the supplementary groups); nil is root.
func (m *machine) commandAs(u *user, argv ...string) *exec.Cmd {
	args := []string{"-t", strconv.Itoa(m.pid), "-m", "-p", "-u", "-n", "-C"}
	if u != nil {
		args = append(args, "-S", strconv.Itoa(u.uid), "-G", strconv.Itoa(u.gid))
	}
	cmd := exec.Command(m.nsenter, append(append(args, "--"), argv...)...)
	cmd.Env = []string{"PATH=" + m.path, "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "MPSD_SOCKET=" + mpsdSocket, "DEBIAN_FRONTEND=noninteractive"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: m.clientsFD}
	return cmd
}

// run runs argv inside and returns its output (stdout and stderr).
func (m *machine) run(argv ...string) (string, error) {
	return m.runFor(waitFor, argv...)
}

// runFor is run with its own time limit (dpkg -i restarts mpsd, which
// may take longer than a plain request).
func (m *machine) runFor(limit time.Duration, argv ...string) (string, error) {
	p := m.start(m.command(argv...))
	r := p.waitQuiet(limit)
	if r.code != 0 {
		return r.stdout + r.stderr, fmt.Errorf("%v: exit status %d: %s", argv, r.code, strings.TrimSpace(r.stdout+r.stderr))
	}
	return r.stdout + r.stderr, nil
}

// must is run that fails the test on error.
func (m *machine) must(argv ...string) string {
	m.t.Helper()
	out, err := m.run(argv...)
	if err != nil {
		m.t.Fatal(err)
	}
	return out
}

// show returns properties of a unit (systemctl show -p).
func (m *machine) show(unit string, props ...string) map[string]string {
	m.t.Helper()
	argv := []string{"systemctl", "show", unit}
	for _, p := range props {
		argv = append(argv, "-p", p)
	}
	out, err := m.run(argv...)
	if err != nil {
		m.t.Fatalf("systemctl show: %v", err)
	}
	got := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			got[k] = v
		}
	}
	return got
}

// waitUntil polls cond until it holds, failing the test after waitFor.
func (m *machine) waitUntil(what string, cond func() bool) {
	m.t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			m.t.Fatalf("no %s within %s", what, waitFor)
		}
		if len(m.unshareRc) > 0 {
			m.t.Fatalf("the machine ended while waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// proc is a started command.
type proc struct {
	cmd       *exec.Cmd
	out, errb bytes.Buffer
	done      chan struct{}
	err       error
}

// start starts cmd, capturing its output unless Stdout or Stderr is
// set; the machine's shutdown waits for it.
func (m *machine) start(cmd *exec.Cmd) *proc {
	m.t.Helper()
	p := &proc{cmd: cmd, done: make(chan struct{})}
	if cmd.Stdout == nil {
		cmd.Stdout = &p.out
	}
	if cmd.Stderr == nil {
		cmd.Stderr = &p.errb
	}
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		m.t.Fatalf("start %v: %v", cmd.Args, err)
	}
	m.procs = append(m.procs, p)
	go func() {
		defer close(p.done)
		p.err = cmd.Wait()
	}()
	return p
}

type result struct {
	code           int
	stdout, stderr string
}

// waitQuiet waits at most limit for the command's end; one still running
// then, or one that could not be waited for, is reported with code -1
// (and left to the machine's end). A command killed by signal N has code
// 128+N.
func (p *proc) waitQuiet(limit time.Duration) result {
	select {
	case <-p.done:
	case <-time.After(limit):
		return result{code: -1}
	}
	r := result{stdout: p.out.String(), stderr: p.errb.String()}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
	case errors.As(p.err, &ee):
		r.code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.code = 128 + int(ws.Signal())
		}
	default:
		r.code = -1
	}
	return r
}

// wait is waitQuiet bounded by waitFor, failing the test on timeout.
func (p *proc) wait(t testing.TB) result {
	t.Helper()
	r := p.waitQuiet(waitFor)
	if r.code == -1 {
		t.Fatalf("%v did not end within %s", p.cmd.Args, waitFor)
	}
	return r
}

// running reports whether the command has not ended yet.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

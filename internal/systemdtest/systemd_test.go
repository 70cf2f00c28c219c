package systemdtest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/debpkg"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// mpsdSocket is mpsd.socket's ListenStream=, the default socket: the
// installed units run unchanged.
const mpsdSocket = api.DefaultSocket

// leaseParent is cgroup.parent: below the service's delegated cgroup.
const leaseParent = "system.slice/mpsd.service/leases"

// The test's drop-ins for the installed mpsd.service. test.conf is all
// that differs from the package's units for most of the test: the
// package's mpsd with --simulate, on the config the test wrote in place
// of the package's (the operator's edit of a conffile), and a shorter
// watchdog and restart delay. gate.conf, for one check, holds every start
// back until the test opens a gate.
const (
	dropIn     = "mpsd.service.d/test.conf"
	gateDropIn = "mpsd.service.d/gate.conf"
)

// distEnv names the directory where make package-deb wrote the package.
const distEnv = "MPSD_DIST_DIR"

// distDeb is the package make package-deb built: the one mpsd_*.deb of
// $MPSD_DIST_DIR. Without it the test skips, or fails under
// MPSD_REQUIRE_SYSTEMD=1.
func distDeb(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(distEnv)
	if dir == "" {
		missing(t, distEnv+" is not set: the test installs the package make package-deb builds (make test sets it; or run make package-deb and set it to dist/)")
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "mpsd_*.deb"))
	if len(debs) != 1 {
		missing(t, fmt.Sprintf("%s=%s holds %d mpsd_*.deb, want one: run make package-deb", distEnv, dir, len(debs)))
	}
	abs, err := filepath.Abs(debs[0])
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// testEnv is the machine with the package installed and mpsd's config.
type testEnv struct {
	*machine
	emu string
	// gates the test opens: MPS may start; mpsd may start (with
	// gate.conf).
	gateMPS, gateStart string
	config             string // what the test wrote to /etc/mpsd/mpsd.yaml
}

// setup boots a machine, installs deb with dpkg -i (its maintainer
// scripts talk to the machine's systemd), checks what it installed
// (checkInstalled), writes mpsd's config over the package's
// /etc/mpsd/mpsd.yaml (the members: root and users) and test.conf, and
// starts mpsd.socket as a boot would (sockets.target wants it once
// enabled). Nothing starts mpsd until the first connection.
func setup(t *testing.T, deb string, users ...string) *testEnv {
	t.Helper()
	emu, err := filepath.Abs(emutest.BinDir(t))
	if err != nil {
		t.Fatal(err)
	}
	m := boot(t, emu+":/usr/sbin:/usr/bin:/sbin:/bin")
	e := &testEnv{machine: m, emu: emu,
		gateMPS:   filepath.Join(m.dir, "gate-mps"),
		gateStart: filepath.Join(m.dir, "gate-start")}

	// The emulator's programs, with a control program that refuses to
	// start a daemon (-d) until the test opens gateMPS: until then no
	// instance comes up, so readiness can be seen to wait for them. It
	// execs the emulator's, so a daemon's program is the emulator's.
	ed := filepath.Join(m.dir, "emu")
	if err := os.Mkdir(ed, 0o755); err != nil {
		t.Fatal(err)
	}
	wrapper := fmt.Sprintf(`#!/bin/sh
for a; do
	if [ "$a" = -d ] && [ ! -e %s ]; then
		echo "mpsd test: MPS held back until the test opens its gate" >&2
		exit 1
	fi
done
exec %s "$@"
`, e.gateMPS, filepath.Join(emu, emutest.ControlName))
	if err := os.WriteFile(filepath.Join(ed, emutest.ControlName), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{emutest.ServerName, emutest.ClientName} {
		if err := os.Symlink(filepath.Join(emu, p), filepath.Join(ed, p)); err != nil {
			t.Fatal(err)
		}
	}

	e.install(deb)
	e.checkInstalled(deb)

	members := strings.Join(append([]string{"root"}, users...), ", ")
	e.config = fmt.Sprintf(`# The mpsd test's config, written over the package's (an operator's edit).
version: 1
socket: %[1]s
run_dir: %[2]s
state_dir: /var/lib/mpsd
log_dir: /var/log/mpsd
cgroup:
  parent: %[3]s
metrics:
  listen: ""
watchdog:
  backoff_initial: 50ms
  backoff_max: 500ms
  # The held-back daemons fail to start until the gate opens; they must
  # not be quarantined for it.
  quarantine_after: 1000
simulate:
  gpus: 2
  model: a100-40g
  emulator_dir: %[4]s
groups:
  sdtest:
    users: [%[5]s]
    sm_percent: 100
    memory: 8G
`, mpsdSocket, filepath.Dir(mpsdSocket), leaseParent, ed, members)
	if err := os.WriteFile(e.root(debpkg.ConfigFile), []byte(e.config), 0o644); err != nil {
		t.Fatal(err)
	}
	m.writeUnit(dropIn, fmt.Sprintf(`# The only changes to the package's mpsd.service for the test.
[Service]
ExecStart=
ExecStart=%s --config %s --simulate
WatchdogSec=6s
RestartSec=1s
`, path.Join(debpkg.BinDir, "mpsd"), debpkg.ConfigFile))
	m.must("systemctl", "daemon-reload")
	m.must("systemctl", "start", "mpsd.socket")
	return e
}

// install installs a package with dpkg -i inside the machine.
func (e *testEnv) install(deb string) string {
	e.t.Helper()
	out, err := e.runFor(3*time.Minute, "dpkg", "-i", deb)
	if err != nil {
		e.t.Fatalf("dpkg -i %s: %v", filepath.Base(deb), err)
	}
	return out
}

// checkInstalled checks what dpkg installed from deb against the package
// itself, file by file, and what the maintainer scripts did: the
// directories mpsd's checks want, both units enabled and neither started.
func (e *testEnv) checkInstalled(deb string) {
	e.t.Helper()
	x := e.t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-x", deb, x).CombinedOutput(); err != nil {
		e.t.Fatalf("dpkg-deb -x: %v: %s", err, out)
	}
	// What the package must hold, where the contract puts it (literal
	// paths, not debpkg's: a path moved there fails here).
	for _, p := range []string{
		"/usr/bin/mpsd", "/usr/bin/mpsctl", "/usr/bin/mps-launch",
		"/lib/systemd/system/mpsd.service", "/lib/systemd/system/mpsd.socket",
		"/etc/mpsd/mpsd.yaml", "/etc/logrotate.d/mpsd",
		"/usr/share/man/man8/mpsd.8.gz", "/usr/share/man/man8/mpsctl.8.gz",
		"/usr/share/man/man1/mps-launch.1.gz", "/usr/share/man/man5/mpsd.yaml.5.gz",
		"/usr/share/bash-completion/completions/mpsctl", "/usr/share/bash-completion/completions/mps-launch",
		"/usr/share/bash-completion/completions/mpsd",
		"/usr/share/zsh/vendor-completions/_mpsctl", "/usr/share/zsh/vendor-completions/_mps_launch",
		"/usr/share/zsh/vendor-completions/_mpsd",
		"/usr/share/doc/mpsd/architecture.md", "/usr/share/doc/mpsd/alerts.md", "/usr/share/doc/mpsd/install.md",
		"/usr/share/doc/mpsd/examples/mpsd.yaml", "/usr/share/doc/mpsd/examples/prometheus/mpsd-alerts.yml",
	} {
		if _, err := os.Stat(filepath.Join(x, p)); err != nil {
			e.t.Errorf("the package lacks %s: %v", p, err)
		}
		if _, err := os.Stat(e.root(p)); err != nil {
			e.t.Errorf("dpkg -i installed no %s: %v", p, err)
		}
	}
	// Every file of the package is where the machine's programs look,
	// with the package's bytes.
	n := 0
	err := filepath.WalkDir(x, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return err
		}
		rel := strings.TrimPrefix(p, x)
		want, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		got, err := os.ReadFile(e.root(rel))
		if err != nil {
			e.t.Errorf("installed %s: %v", rel, err)
		} else if !bytes.Equal(got, want) {
			e.t.Errorf("installed %s differs from the package's", rel)
		}
		n++
		return nil
	})
	if err != nil || n == 0 {
		e.t.Fatalf("walk the package's files: %d, %v", n, err)
	}
	// The units systemd reads are the package's, in the machine's
	// /lib/systemd/system.
	for _, u := range []string{"mpsd.service", "mpsd.socket"} {
		want, _ := os.ReadFile(filepath.Join(x, debpkg.UnitDir, u))
		if got, err := os.ReadFile(e.libUnit(u)); err != nil || !bytes.Equal(got, want) {
			e.t.Errorf("%s in the machine's unit directory: %v (or not the package's)", u, err)
		}
		if p := e.show(u, "FragmentPath")["FragmentPath"]; p != path.Join(debpkg.UnitDir, u) {
			e.t.Errorf("%s: systemd loaded %q, want the package's %s", u, p, path.Join(debpkg.UnitDir, u))
		}
	}
	if out, err := e.run("dpkg", "--verify", debpkg.Name); err != nil || strings.TrimSpace(out) != "" {
		e.t.Errorf("dpkg --verify mpsd: %v: %s", err, out)
	}
	// The directories mpsd's checks want (policy.CheckDirs, the daemon's
	// makeDirs): root's, 0700 for the state, 0755 for the logs.
	for dir, mode := range map[string]fs.FileMode{"/var/lib/mpsd": 0o700, "/var/log/mpsd": 0o755} {
		fi, err := os.Lstat(e.root(dir))
		if err != nil {
			e.t.Errorf("postinst made no %s: %v", dir, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || fi.Mode().Perm() != mode || st.Uid != 0 || st.Gid != 0 {
			e.t.Errorf("%s: %v uid %d gid %d, want a directory %04o of root's", dir, fi.Mode(), st.Uid, st.Gid, mode)
		}
	}
	// Enabled, as a fresh install does, and not started: the operator
	// edits the config first.
	for _, u := range []string{"mpsd.socket", "mpsd.service"} {
		if out, _ := e.run("systemctl", "is-enabled", u); strings.TrimSpace(out) != "enabled" {
			e.t.Errorf("%s after dpkg -i: %q, want enabled", u, strings.TrimSpace(out))
		}
		if p := e.show(u, "ActiveState"); p["ActiveState"] != "inactive" {
			e.t.Errorf("%s after dpkg -i: %v, want inactive (the postinst starts nothing)", u, p)
		}
	}
	if _, err := os.Lstat(e.etcUnit("sockets.target.wants/mpsd.socket")); err != nil {
		e.t.Errorf("mpsd.socket is not wanted by sockets.target: %v", err)
	}
	if e.t.Failed() {
		e.t.FailNow()
	}
}

// checkExe checks that the service's main process runs the package's
// /usr/bin/mpsd.
func (e *testEnv) checkExe(t *testing.T, pid int) {
	t.Helper()
	if exe := strings.TrimSpace(e.must("readlink", fmt.Sprintf("/proc/%d/exe", pid))); exe != path.Join(debpkg.BinDir, "mpsd") {
		t.Errorf("mpsd.service's main process runs %s, want %s", exe, path.Join(debpkg.BinDir, "mpsd"))
	}
	got, err := os.ReadFile(e.root(fmt.Sprintf("/proc/%d/exe", pid)))
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(e.root(path.Join(debpkg.BinDir, "mpsd")))
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("mpsd.service's main process is not the installed /usr/bin/mpsd (%v)", err)
	}
}

// open creates a gate file.
func (e *testEnv) open(gate string) {
	e.t.Helper()
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// status runs mpsctl status --json inside and decodes it.
func (e *testEnv) status() api.Status {
	e.t.Helper()
	return decodeStatus(e.t, e.must("mpsctl", "status", "--json"))
}

func decodeStatus(t testing.TB, out string) api.Status {
	t.Helper()
	var st api.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("mpsctl status --json: %v\n%s", err, out)
	}
	return st
}

// service is mpsd.service's state as systemd has it.
type service struct {
	active, sub, status string
	mainPID, restarts   int
}

func (e *testEnv) service() service {
	e.t.Helper()
	p := e.show("mpsd.service", "ActiveState", "SubState", "StatusText", "MainPID", "NRestarts")
	s := service{active: p["ActiveState"], sub: p["SubState"], status: p["StatusText"]}
	s.mainPID, _ = strconv.Atoi(p["MainPID"])
	s.restarts, _ = strconv.Atoi(p["NRestarts"])
	return s
}

// waitActive waits until mpsd.service is active with a main pid other
// than old, and returns its state.
func (e *testEnv) waitActive(old int) service {
	e.t.Helper()
	var s service
	e.waitUntil(fmt.Sprintf("mpsd.service active with a main pid other than %d", old), func() bool {
		s = e.service()
		return s.active == "active" && s.mainPID != 0 && s.mainPID != old
	})
	return s
}

// procState is the state letter of the namespace's pid (seen through its
// /proc), "" when it is gone.
func (e *testEnv) procState(pid int) string {
	b, err := os.ReadFile(e.root(fmt.Sprintf("/proc/%d/stat", pid)))
	if err != nil {
		return ""
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	st, _, _ := strings.Cut(rest, " ")
	return st
}

// alive reports whether the namespace's pid runs (or is stopped).
func (e *testEnv) alive(pid int) bool {
	st := e.procState(pid)
	return st != "" && st != "Z"
}

// cgroupOf is the namespace's pid's cgroup v2 path, relative to the
// namespace's cgroup root. The kernel shows it relative to the reader's
// cgroup namespace, so this, on the host, reads the machine's cgroup
// first: the pid must be inside it.
func (e *testEnv) cgroupOf(pid int) string {
	e.t.Helper()
	b, err := os.ReadFile(e.root(fmt.Sprintf("/proc/%d/cgroup", pid)))
	if err != nil {
		e.t.Fatalf("cgroup of pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			rel, ok := strings.CutPrefix(p, "/"+e.cgroupName+"/")
			if !ok {
				e.t.Fatalf("pid %d is in cgroup %s, outside the machine's (/%s)", pid, p, e.cgroupName)
			}
			return "/" + rel
		}
	}
	e.t.Fatalf("pid %d has no cgroup v2 line: %q", pid, b)
	return ""
}

// mpsSnapshot is what must outlive an mpsd restart: the MPS daemons and
// servers and the running leases with their processes.
type mpsSnapshot struct {
	daemons []string // group@gpu=daemon pid/server pids
	leases  []string // id=pids
}

func snapshot(st api.Status) mpsSnapshot {
	var s mpsSnapshot
	for _, in := range st.Instances {
		s.daemons = append(s.daemons, fmt.Sprintf("%s@%d=%d/%v", in.Group, in.GPUIndex, in.DaemonPID, in.ServerPIDs))
	}
	for _, l := range st.Leases {
		s.leases = append(s.leases, fmt.Sprintf("%s=%v/%s", l.ID, l.PIDs, l.State))
	}
	slices.Sort(s.daemons)
	slices.Sort(s.leases)
	return s
}

func (s mpsSnapshot) String() string {
	return fmt.Sprintf("daemons %v, leases %v", s.daemons, s.leases)
}

// kept reports whether after has the same MPS daemons and servers as s
// and every lease of s, unchanged (after may have more).
func (s mpsSnapshot) kept(after mpsSnapshot) bool {
	if !slices.Equal(s.daemons, after.daemons) {
		return false
	}
	for _, l := range s.leases {
		if !slices.Contains(after.leases, l) {
			return false
		}
	}
	return true
}

// client is a workload under mps-launch: mpsemu-client connects to its
// MPS server once, the workload (a shell, which forks nothing while it
// waits, so the lease's processes stay the same) waits on its gate, a
// FIFO, then connects again and exits 0.
type client struct {
	p    *proc
	out  string // its stdout file
	gate string // its FIFO
}

func (e *testEnv) startClient(name string) *client {
	return e.startClientAs(nil, name)
}

// startClientAs is startClient run as u (nil: root).
func (e *testEnv) startClientAs(u *user, name string) *client {
	e.t.Helper()
	c := &client{out: filepath.Join(e.dir, name+".out"), gate: filepath.Join(e.dir, name+".gate")}
	if err := syscall.Mkfifo(c.gate, 0o600); err != nil {
		e.t.Fatal(err)
	}
	if u != nil {
		if err := os.Chown(c.gate, u.uid, u.gid); err != nil {
			e.t.Fatal(err)
		}
	}
	f, err := os.Create(c.out)
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	script := fmt.Sprintf("%[1]s && { read -r go <%[2]s || true; } && exec %[1]s", emutest.ClientName, c.gate)
	cmd := e.commandAs(u, "mps-launch", "--sm", "20", "--mem", "1G", "--", "/bin/sh", "-c", script)
	cmd.Stdout = f
	c.p = e.start(cmd)
	return c
}

// release opens the client's gate. The shell opens the FIFO for reading
// once its first mpsemu-client is done, and blocks until a writer comes;
// until then opening it for writing without blocking fails with ENXIO.
func (c *client) release(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		f, err := os.OpenFile(c.gate, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			_, err = f.WriteString("go\n")
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			return
		}
		if !errors.Is(err, syscall.ENXIO) {
			t.Fatal(err)
		}
		if !c.p.running() || time.Now().After(deadline) {
			t.Fatalf("client %v is not waiting on its gate (running: %v)", c.p.cmd.Args, c.p.running())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var clientLine = regexp.MustCompile(`mpsemu-client: pid=\d+ server=(\d+) `)

// servers returns the server pids of the client's mpsemu-client lines.
func (c *client) servers() []string {
	b, _ := os.ReadFile(c.out)
	var s []string
	for _, m := range clientLine.FindAllStringSubmatch(string(b), -1) {
		s = append(s, m[1])
	}
	return s
}

// journal is the unit's journal.
func (e *testEnv) journal(unit string) string {
	e.t.Helper()
	return e.must("journalctl", "--no-pager", "-b", "-u", unit, "-o", "cat")
}

// TestMpsdUnderSystemd installs the package make package-deb built with
// dpkg -i in a real systemd's machine (PID 1 of private namespaces, /usr,
// /etc and /var overlays; see doc.go), checks what it installed and what
// its postinst did (checkInstalled), and runs its mpsd.socket and
// mpsd.service, unchanged but for test.conf, with mpsd --simulate. It
// checks what the units promise: socket activation, READY only when every
// instance is up, the watchdog's kill and restart and a plain restart
// keeping MPS and the clients, requests queueing in the socket while mpsd
// is down, and leases under the service's delegated cgroup. The steps
// build on each other: a failed step ends the test.
func TestMpsdUnderSystemd(t *testing.T) {
	e := setup(t, distDeb(t))
	var clients []*client
	var before mpsSnapshot

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"FirstConnectionActivates", func(t *testing.T) {
			if s := e.service(); s.active != "inactive" || s.mainPID != 0 {
				t.Fatalf("mpsd.service before any connection: %+v, want inactive without a main pid", s)
			}
			if p := e.show("mpsd.socket", "ActiveState", "SubState"); p["ActiveState"] != "active" || p["SubState"] != "listening" {
				t.Fatalf("mpsd.socket: %v, want active/listening", p)
			}
			// The first connection starts mpsd, which answers it once every
			// instance had a first try. MPS is held back: none is up.
			st := e.status()
			if len(st.Instances) != 2 {
				t.Fatalf("status has %d instances, want 2 (one per simulated GPU): %+v", len(st.Instances), st.Instances)
			}
			for _, in := range st.Instances {
				if in.State == api.InstanceReady {
					t.Errorf("instance %s@%d is ready though its MPS daemon cannot start", in.Group, in.GPUIndex)
				}
			}
		}},
		{"ReadyWhenInstancesUp", func(t *testing.T) {
			// mpsd serves, but no instance is up: no READY=1, so the
			// service is still starting, and STATUS= (refreshed every 5 s)
			// comes to show the instances by state.
			byState := regexp.MustCompile(`^instances: .*(starting|recovering).*; leases: 0 running, 0 queued$`)
			var s service
			e.waitUntil("STATUS= with the instances by state, or READY=1", func() bool {
				s = e.service()
				return s.active != "activating" || byState.MatchString(s.status)
			})
			if s.active != "activating" || s.sub != "start" {
				t.Fatalf("mpsd.service while no instance is up: %s/%s (status %q), want activating/start: READY=1 came early", s.active, s.sub, s.status)
			}
			if strings.Contains(s.status, "ready") {
				t.Errorf("StatusText while no instance is up = %q, want none ready", s.status)
			}
			e.open(e.gateMPS)
			s = e.waitActive(0)
			if s.status != "instances: 2 ready; leases: 0 running, 0 queued" {
				t.Errorf("StatusText once active = %q, want \"instances: 2 ready; leases: 0 running, 0 queued\"", s.status)
			}
			for _, in := range e.status().Instances {
				if in.State != api.InstanceReady || in.DaemonPID == 0 {
					t.Errorf("instance %s@%d is %s (daemon %d) after READY=1", in.Group, in.GPUIndex, in.State, in.DaemonPID)
				}
			}
		}},
		{"LeasesInDelegatedCgroup", func(t *testing.T) {
			for i := range 2 {
				clients = append(clients, e.startClient(fmt.Sprintf("client%d", i)))
			}
			for _, c := range clients {
				e.waitUntil("the client's first MPS connection", func() bool { return len(c.servers()) == 1 || !c.p.running() })
				if !c.p.running() {
					r := c.p.wait(t)
					t.Fatalf("client ended early: exit %d: %s", r.code, r.stderr)
				}
			}
			st := e.status()
			if len(st.Leases) != 2 {
				t.Fatalf("%d leases, want 2: %+v", len(st.Leases), st.Leases)
			}
			s := e.service()
			e.checkExe(t, s.mainPID)
			if cg := e.cgroupOf(s.mainPID); cg != "/system.slice/mpsd.service" {
				t.Errorf("mpsd (pid %d) is in %s, want /system.slice/mpsd.service", s.mainPID, cg)
			}
			// Delegate=yes: systemd hands the subtree to mpsd and marks it
			// so (the trusted.delegate attribute, which systemd and its
			// tools honour: they leave a delegated subtree to its owner).
			svc := filepath.Join(e.cgroup, "system.slice", "mpsd.service")
			buf := make([]byte, 16)
			if n, err := syscall.Getxattr(svc, "trusted.delegate", buf); err != nil || string(buf[:n]) != "1" {
				t.Errorf("mpsd.service's cgroup is not delegated: trusted.delegate %q, %v", buf[:max(n, 0)], err)
			}
			for _, l := range st.Leases {
				if l.State != api.LeaseRunning || len(l.PIDs) == 0 {
					t.Fatalf("lease %s: %s with pids %v, want running with its workload", l.ID, l.State, l.PIDs)
				}
				checked := 0
				for _, pid := range l.PIDs {
					if _, err := os.Stat(e.root(fmt.Sprintf("/proc/%d", pid))); err != nil {
						// The workload's first client connects and exits
						// (then the shell waits): status may list it still.
						continue
					}
					checked++
					cg := e.cgroupOf(pid)
					if !strings.HasPrefix(cg, "/"+leaseParent+"/") || !strings.HasSuffix(cg, "/"+l.ID) {
						t.Errorf("lease %s's pid %d is in %s, want /%s/<instance>/<group>/%s", l.ID, pid, cg, leaseParent, l.ID)
					}
				}
				if checked == 0 {
					t.Errorf("lease %s: none of its pids %v is alive to check", l.ID, l.PIDs)
				}
			}
			before = snapshot(st)
		}},
		{"WatchdogRestart", func(t *testing.T) {
			old := e.service()
			e.must("kill", "-STOP", strconv.Itoa(old.mainPID))
			e.waitUntil("mpsd stopped", func() bool { return e.procState(old.mainPID) == "T" })
			// A request to the wedged mpsd: it waits in the socket's
			// backlog, and the mpsd that systemd starts after the watchdog
			// kill answers it.
			req := e.start(e.command("mpsctl", "status", "--json"))
			r := req.wait(t)
			if r.code != 0 {
				t.Fatalf("mpsctl status during the wedge: exit %d: %s", r.code, r.stderr)
			}
			if e.alive(old.mainPID) {
				t.Errorf("the wedged mpsd (pid %d) still runs after its request was answered", old.mainPID)
			}
			s := e.waitActive(old.mainPID)
			if s.restarts != old.restarts+1 {
				t.Errorf("NRestarts %d after the watchdog kill, want %d", s.restarts, old.restarts+1)
			}
			j := e.journal("mpsd.service")
			for _, want := range []string{"Watchdog timeout", "SIGABRT"} {
				if !strings.Contains(j, want) {
					t.Errorf("mpsd.service's journal has no %q", want)
				}
			}
			after := snapshot(decodeStatus(t, r.stdout))
			if after.String() != before.String() {
				t.Errorf("after the watchdog restart: %s\nbefore: %s", after, before)
			}
			for _, c := range clients {
				if !c.p.running() {
					t.Errorf("client %v ended during the watchdog restart", c.p.cmd.Args)
				}
			}
		}},
		{"SystemctlRestart", func(t *testing.T) {
			old := e.service()
			e.must("systemctl", "restart", "mpsd.service")
			s := e.waitActive(old.mainPID)
			if s.restarts != 0 {
				t.Errorf("NRestarts %d after systemctl restart, want 0 (a manual restart resets it)", s.restarts)
			}
			if after := snapshot(e.status()); after.String() != before.String() {
				t.Errorf("after systemctl restart: %s\nbefore: %s", after, before)
			}
			for _, c := range clients {
				if !c.p.running() {
					t.Errorf("client %v ended during systemctl restart", c.p.cmd.Args)
				}
			}
		}},
		{"RequestsWaitWhileDown", func(t *testing.T) {
			e.writeUnit(gateDropIn, fmt.Sprintf("# Holds every start of mpsd back until the test opens a gate.\n[Service]\nExecStartPre=/bin/sh -c 'while [ ! -e %s ]; do sleep 0.05; done'\n", e.gateStart))
			e.must("systemctl", "daemon-reload")
			old := e.service()
			e.must("systemctl", "restart", "--no-block", "mpsd.service")
			e.waitUntil("mpsd.service held in start-pre", func() bool {
				s := e.service()
				return s.active == "activating" && s.sub == "start-pre"
			})
			if e.alive(old.mainPID) {
				t.Fatalf("the old mpsd (pid %d) still runs", old.mainPID)
			}
			launch := e.start(e.command("mps-launch", "--sm", "10", "--", emutest.ClientName))
			stat := e.start(e.command("mpsctl", "status", "--json"))
			// Both are connected, in the backlog of the socket that systemd
			// holds, with no mpsd to accept them.
			e.waitUntil("two connections waiting in mpsd.socket's backlog", func() bool {
				return backlog(e.must("ss", "-xlnH", "src", mpsdSocket)) >= 2
			})
			if !launch.running() || !stat.running() {
				t.Fatalf("a request ended while mpsd was down")
			}
			e.open(e.gateStart)
			e.waitActive(old.mainPID)
			if r := stat.wait(t); r.code != 0 {
				t.Errorf("mpsctl status made while mpsd was down: exit %d: %s", r.code, r.stderr)
			} else if after := snapshot(decodeStatus(t, r.stdout)); !before.kept(after) {
				t.Errorf("status answered after the restart: %s\nbefore: %s", after, before)
			}
			if r := launch.wait(t); r.code != 0 || !clientLine.MatchString(r.stdout) {
				t.Errorf("mps-launch made while mpsd was down: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
			}
			if err := os.Remove(e.etcUnit(gateDropIn)); err != nil {
				t.Fatal(err)
			}
			e.must("systemctl", "daemon-reload")
		}},
		{"ClientsExitZero", func(t *testing.T) {
			for _, c := range clients {
				c.release(t)
				r := c.p.wait(t)
				if r.code != 0 {
					t.Errorf("client %v: exit %d: %s", c.p.cmd.Args, r.code, r.stderr)
				}
				// Both connections reached the same MPS server: it lived
				// through the three restarts of mpsd.
				if s := c.servers(); len(s) != 2 || s[0] != s[1] {
					t.Errorf("client's MPS servers %v, want the same one twice", s)
				}
			}
			e.waitUntil("no leases left", func() bool { return len(e.status().Leases) == 0 })
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			return
		}
	}
}

// backlog is the Recv-Q of ss's line for a listening unix socket: the
// connections waiting to be accepted.
func backlog(ss string) int {
	for _, line := range strings.Split(ss, "\n") {
		f := strings.Fields(line)
		// Netid State Recv-Q Send-Q Local ...
		if len(f) >= 4 && f[1] == "LISTEN" {
			n, _ := strconv.Atoi(f[2])
			return n
		}
	}
	return 0
}

// The older build the upgrade test installs first: the same programs,
// stamped as a commit older than any build (a Debian version before every
// other).
const (
	oldStamp      = "000000000000" // hack/ldflags.sh abbreviates to 12 hex digits
	oldCommit     = "0000000000000000000000000000000000000000"
	oldCommitTime = "2000-01-01T00:00:00Z"
	// Test users' uids (emutest.User), unused elsewhere.
	upgradeUIDAlice = 64731
	upgradeUIDBob   = 64732
)

// oldDeb builds the programs stamped as the older build into a temporary
// bin directory, as make build does, and packages them with this
// repository's files as debpkg does for make package-deb.
func oldDeb(t *testing.T) (deb, version string) {
	t.Helper()
	goCmd := cmp.Or(os.Getenv("GO"), "go")
	bin := t.TempDir()
	const pkg = "github.com/mpsd/mpsd/internal/buildinfo"
	ldflags := fmt.Sprintf("-X %[1]s.version=%s -X %[1]s.commit=%s -X %[1]s.commitTime=%s", pkg, oldStamp, oldCommit, oldCommitTime)
	root := filepath.Join("..", "..")
	for _, b := range []struct {
		cgo  string
		pkgs []string
	}{{"1", []string{"./cmd/mpsd", "./cmd/mpsctl"}}, {"0", []string{"./cmd/mps-launch"}}} {
		cmd := exec.Command(goCmd, append([]string{"build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", bin + "/"}, b.pkgs...)...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build the older programs: %v\n%s", err, out)
		}
	}
	ct, err := time.Parse(time.RFC3339, oldCommitTime)
	if err != nil {
		t.Fatal(err)
	}
	version, err = debpkg.DebVersion(oldStamp, ct)
	if err != nil {
		t.Fatal(err)
	}
	deb, err = debpkg.WriteDist(debpkg.Spec{Root: root, Bin: bin, Version: version, Arch: debArch(t), MTime: ct}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return deb, version
}

func debArch(t *testing.T) string {
	t.Helper()
	a, err := debpkg.DebArch(runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestDebUpgradeKeepsLeases installs an older build of the package, runs
// a lease for each of two users, edits the conffile /etc/mpsd/mpsd.yaml
// (the test's config), and installs the package make package-deb built
// over it with dpkg -i. The new postinst restarts mpsd.service (the old
// one was running), and: the same leases run, with the same processes,
// on the same MPS daemons and servers; mpsctl status shows them; the
// running mpsd is the new /usr/bin/mpsd and mpsctl version says so; the
// operator's config is kept (dpkg's conffile handling); the clients run
// on and exit 0, their MPS server the same before and after.
func TestDebUpgradeKeepsLeases(t *testing.T) {
	newDeb := distDeb(t)
	newVersion := strings.TrimSpace(mustOut(t, "dpkg-deb", "--field", newDeb, "Version"))
	alice := &user{name: emutest.User(t, upgradeUIDAlice), uid: upgradeUIDAlice, gid: upgradeUIDAlice}
	bob := &user{name: emutest.User(t, upgradeUIDBob), uid: upgradeUIDBob, gid: upgradeUIDBob}
	deb, oldVersion := oldDeb(t)
	if out, err := exec.Command("dpkg", "--compare-versions", oldVersion, "lt", newVersion).CombinedOutput(); err != nil {
		t.Fatalf("the older build's version %s does not sort before the package's %s: %v %s", oldVersion, newVersion, err, out)
	}

	e := setup(t, deb, alice.name, bob.name)
	e.open(e.gateMPS)
	var clients []*client
	for _, u := range []*user{alice, bob} {
		clients = append(clients, e.startClientAs(u, u.name))
	}
	for _, c := range clients {
		e.waitUntil("the client's first MPS connection", func() bool { return len(c.servers()) == 1 || !c.p.running() })
		if !c.p.running() {
			r := c.p.wait(t)
			t.Fatalf("client ended early: exit %d: %s", r.code, r.stderr)
		}
	}
	old := e.waitActive(0)
	st := e.status()
	if len(st.Leases) != 2 {
		t.Fatalf("%d leases, want 2: %+v", len(st.Leases), st.Leases)
	}
	owners := map[uint32]bool{}
	for _, l := range st.Leases {
		if l.State != api.LeaseRunning {
			t.Fatalf("lease %s is %s, want running", l.ID, l.State)
		}
		owners[l.UID] = true
	}
	if !owners[upgradeUIDAlice] || !owners[upgradeUIDBob] {
		t.Fatalf("leases' uids %v, want %d and %d", owners, upgradeUIDAlice, upgradeUIDBob)
	}
	before := snapshot(st)
	if v := e.must("mpsctl", "version"); !strings.Contains(v, "mpsd "+oldStamp+" commit") {
		t.Fatalf("mpsctl version before the upgrade:\n%s\nwant mpsd %s", v, oldStamp)
	}

	sockSince := e.show("mpsd.socket", "ActiveEnterTimestampMonotonic")["ActiveEnterTimestampMonotonic"]
	out := e.install(newDeb)
	if s := strings.TrimSpace(e.must("dpkg-query", "-W", "-f", "${Version} ${Status}", debpkg.Name)); s != newVersion+" install ok installed" {
		t.Errorf("dpkg-query after the upgrade: %q, want %q", s, newVersion+" install ok installed")
	}
	s := e.waitActive(old.mainPID)
	if e.alive(old.mainPID) {
		t.Errorf("the old mpsd (pid %d) still runs after the upgrade", old.mainPID)
	}
	if s.restarts != 0 {
		t.Errorf("NRestarts %d after the upgrade, want 0: the postinst restarts mpsd, no failure does", s.restarts)
	}
	e.checkExe(t, s.mainPID)
	// Never stopped: running (handed to the running mpsd), as before.
	if p := e.show("mpsd.socket", "ActiveState", "SubState"); p["ActiveState"] != "active" || p["SubState"] != "running" {
		t.Errorf("mpsd.socket after the upgrade: %v, want active/running", p)
	}
	if since := e.show("mpsd.socket", "ActiveEnterTimestampMonotonic")["ActiveEnterTimestampMonotonic"]; since != sockSince {
		t.Errorf("mpsd.socket was restarted by the upgrade (active since %s, before %s)", since, sockSince)
	}
	if n := e.show("mpsd.socket", "NRefused")["NRefused"]; n != "0" {
		t.Errorf("mpsd.socket refused %s connections during the upgrade", n)
	}

	after := e.status()
	if a := snapshot(after); a.String() != before.String() {
		t.Errorf("after the upgrade: %s\nbefore: %s", a, before)
	}
	human := e.must("mpsctl", "status")
	for _, l := range st.Leases {
		if !strings.Contains(human, l.ID) {
			t.Errorf("mpsctl status after the upgrade does not show lease %s:\n%s", l.ID, human)
		}
	}
	for _, c := range clients {
		if !c.p.running() {
			t.Errorf("client %v ended during the upgrade", c.p.cmd.Args)
		}
	}
	// The new programs: mpsd's version as it says itself, and as mpsctl
	// version gets it from the running mpsd.
	newStamp := strings.Fields(e.must(path.Join(debpkg.BinDir, "mpsd"), "--version"))
	if len(newStamp) < 2 || newStamp[1] == oldStamp {
		t.Fatalf("/usr/bin/mpsd --version after the upgrade: %v", newStamp)
	}
	if v := e.must("mpsctl", "version"); !strings.Contains(v, "mpsd "+newStamp[1]+" commit") || strings.Contains(v, oldStamp+" ") {
		t.Errorf("mpsctl version after the upgrade:\n%s\nwant mpsd %s (and no %s)", v, newStamp[1], oldStamp)
	}
	// The conffile keeps the operator's edit, silently: the package's
	// version of it did not change.
	if b, err := os.ReadFile(e.root(debpkg.ConfigFile)); err != nil || string(b) != e.config {
		t.Errorf("%s after the upgrade is not the operator's (%v):\n%s", debpkg.ConfigFile, err, b)
	}
	for _, suf := range []string{".dpkg-dist", ".dpkg-new", ".dpkg-old"} {
		if _, err := os.Lstat(e.root(debpkg.ConfigFile + suf)); err == nil {
			t.Errorf("dpkg left %s%s: it treated the edited conffile as changed", debpkg.ConfigFile, suf)
		}
	}
	if t.Failed() {
		t.Logf("dpkg -i of the upgrade said:\n%s", out)
	}

	for _, c := range clients {
		c.release(t)
		r := c.p.wait(t)
		if r.code != 0 {
			t.Errorf("client %v: exit %d: %s", c.p.cmd.Args, r.code, r.stderr)
		}
		if s := c.servers(); len(s) != 2 || s[0] != s[1] {
			t.Errorf("client's MPS servers %v, want the same one twice (before and after the upgrade)", s)
		}
	}
	e.waitUntil("no leases left", func() bool { return len(e.status().Leases) == 0 })
}

// mustOut runs a program on the host and returns its output.
func mustOut(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v: %s", argv, err, out)
	}
	return string(out)
}

// stateFiles are mpsd's state file and its journal, whose last whole
// line is the state when it has one.
var stateFiles = []string{"/var/lib/mpsd/state.json", "/var/lib/mpsd/state.json.journal"}

// TestDebRemoveKeepsWorkloads checks what removing the package does to a
// host that serves a lease (docs/install.md, "Install the package"):
// dpkg -r stops nothing (mpsd, its socket and the lease run on, served by
// the mpsd whose program was removed); dpkg --purge keeps /var/lib/mpsd
// and /var/log/mpsd while an mpsd holds the state and says so; once mpsd
// is stopped with no lease left, a purge removes them.
func TestDebRemoveKeepsWorkloads(t *testing.T) {
	e := setup(t, distDeb(t))
	e.open(e.gateMPS)
	c := e.startClient("client")
	e.waitUntil("the client's first MPS connection", func() bool { return len(c.servers()) == 1 || !c.p.running() })
	if !c.p.running() {
		r := c.p.wait(t)
		t.Fatalf("client ended early: exit %d: %s", r.code, r.stderr)
	}
	svc := e.waitActive(0)
	st := e.status()
	if len(st.Leases) != 1 {
		t.Fatalf("%d leases, want 1: %+v", len(st.Leases), st.Leases)
	}
	before := snapshot(st)

	e.must("dpkg", "-r", debpkg.Name)
	if _, err := os.Stat(e.root("/usr/bin/mpsd")); err == nil {
		t.Fatalf("dpkg -r left /usr/bin/mpsd")
	}
	if s := e.service(); s.active != "active" || s.mainPID != svc.mainPID {
		t.Errorf("mpsd.service after dpkg -r: %+v, want still active with pid %d", s, svc.mainPID)
	}
	if p := e.show("mpsd.socket", "ActiveState"); p["ActiveState"] != "active" {
		t.Errorf("mpsd.socket after dpkg -r: %v, want active", p)
	}
	// The package's mpsctl is gone; the one the package holds asks.
	x := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-x", distDeb(t), x).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x: %v: %s", err, out)
	}
	if err := os.Chmod(x, 0o755); err != nil {
		t.Fatal(err)
	}
	mpsctl := filepath.Join(x, "usr", "bin", "mpsctl")
	if after := snapshot(decodeStatus(t, e.must(mpsctl, "status", "--json"))); after.String() != before.String() {
		t.Errorf("after dpkg -r: %s\nbefore: %s", after, before)
	}

	// The state as the running mpsd saved it, with the lease: state.json
	// and the journal that follows it.
	saved := map[string][]byte{}
	for _, f := range stateFiles {
		if b, err := os.ReadFile(e.root(f)); err == nil {
			saved[f] = b
		}
	}
	if id := st.Leases[0].ID; !bytes.Contains(saved[stateFiles[0]], []byte(id)) && !bytes.Contains(saved[stateFiles[1]], []byte(id)) {
		t.Fatalf("neither %v names the running lease %s", stateFiles, id)
	}

	out := e.must("dpkg", "--purge", debpkg.Name)
	if !strings.Contains(out, "keeping /var/lib/mpsd and /var/log/mpsd") {
		t.Errorf("dpkg --purge while mpsd runs said %q, want why it keeps the state", out)
	}
	for _, d := range []string{"/var/lib/mpsd/state.json", "/var/log/mpsd"} {
		if _, err := os.Stat(e.root(d)); err != nil {
			t.Errorf("dpkg --purge while mpsd serves a lease removed %s: %v", d, err)
		}
	}
	c.release(t)
	if r := c.p.wait(t); r.code != 0 {
		t.Errorf("client after dpkg -r and --purge: exit %d: %s", r.code, r.stderr)
	}
	e.waitUntil("no leases left", func() bool { return len(decodeStatus(t, e.must(mpsctl, "status", "--json")).Leases) == 0 })

	// Stopped, with a lease in the saved state (an mpsd stopped while it
	// served one, to be re-adopted by the next): a purge keeps the state
	// and says why. The lease is in the journal's last line, state.json
	// being what the mpsd wrote at its start.
	e.must("systemctl", "stop", "mpsd.socket", "mpsd.service")
	e.install(distDeb(t))
	for f, b := range saved {
		if err := os.WriteFile(e.root(f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out = e.must("dpkg", "--purge", debpkg.Name)
	if !strings.Contains(out, "keeping /var/lib/mpsd and /var/log/mpsd: /var/lib/mpsd's saved state lists leases") {
		t.Errorf("dpkg --purge of a stopped mpsd whose state lists a lease said %q, want why it keeps the state", out)
	}
	if _, err := os.Stat(e.root(stateFiles[0])); err != nil {
		t.Errorf("dpkg --purge of a stopped mpsd whose state lists a lease removed it: %v", err)
	}
	for _, f := range stateFiles {
		if err := os.Remove(e.root(f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}

	// Stopped, with no lease: a purge of the package installed again
	// removes the state.
	e.install(distDeb(t))
	e.must("dpkg", "--purge", debpkg.Name)
	for _, d := range []string{"/var/lib/mpsd", "/var/log/mpsd", debpkg.ConfigFile} {
		if _, err := os.Lstat(e.root(d)); err == nil {
			t.Errorf("dpkg --purge of a stopped mpsd without leases left %s", d)
		}
	}
	for _, w := range []string{"sockets.target.wants/mpsd.socket", "multi-user.target.wants/mpsd.service", "mpsd.service", "mpsd.socket"} {
		if _, err := os.Lstat(e.etcUnit(w)); err == nil {
			t.Errorf("dpkg --purge left /etc/systemd/system/%s", w)
		}
	}
}

// TestDebUpgradeRestart checks when the postinst of an upgrade (here dpkg
// -i of the installed version again, which runs it the same way:
// configure with the old version) restarts mpsd.service:
//   - an mpsd still starting (activating: its instances are held back,
//     so no READY=1 yet) is restarted, and dpkg waits until the new one is
//     ready;
//   - an mpsd whose config the new mpsctl check-config refuses is left
//     running, and the postinst says why and how to restart it.
func TestDebUpgradeRestart(t *testing.T) {
	deb := distDeb(t)
	e := setup(t, deb)
	e.must("systemctl", "start", "--no-block", "mpsd.service")
	var old service
	e.waitUntil("mpsd.service activating", func() bool {
		old = e.service()
		return old.active == "activating" && old.sub == "start" && old.mainPID != 0
	})

	dpkg := e.start(e.command("dpkg", "-i", deb))
	e.waitUntil("mpsd restarted by the postinst", func() bool {
		s := e.service()
		return (s.mainPID != 0 && s.mainPID != old.mainPID) || !dpkg.running()
	})
	if !dpkg.running() {
		r := dpkg.wait(t)
		t.Fatalf("dpkg -i ended before mpsd was ready, without restarting the starting mpsd (pid %d): exit %d: %s%s", old.mainPID, r.code, r.stdout, r.stderr)
	}
	e.open(e.gateMPS)
	if r := dpkg.wait(t); r.code != 0 {
		t.Fatalf("dpkg -i: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	// dpkg waited for READY=1: the new mpsd is active when it ends.
	s := e.service()
	if s.active != "active" || s.mainPID == old.mainPID {
		t.Fatalf("mpsd.service when dpkg -i ended: %+v, want active with a pid other than %d", s, old.mainPID)
	}
	if e.alive(old.mainPID) {
		t.Errorf("the starting mpsd (pid %d) still runs after the upgrade", old.mainPID)
	}
	e.checkExe(t, s.mainPID)

	// A config the new mpsctl refuses: the running mpsd is kept.
	refused := e.config + "no_such_key: true\n"
	if err := os.WriteFile(e.root(debpkg.ConfigFile), []byte(refused), 0o644); err != nil {
		t.Fatal(err)
	}
	out := e.install(deb)
	for _, w := range []string{"no_such_key", "not restarting mpsd.service", "systemctl restart mpsd"} {
		if !strings.Contains(out, w) {
			t.Errorf("dpkg -i with a refused config said:\n%s\nwant %q", out, w)
		}
	}
	if after := e.service(); after.active != "active" || after.mainPID != s.mainPID {
		t.Errorf("mpsd.service after dpkg -i with a refused config: %+v, want still active with pid %d", after, s.mainPID)
	}
	if err := os.WriteFile(e.root(debpkg.ConfigFile), []byte(e.config), 0o644); err != nil {
		t.Fatal(err)
	}
}

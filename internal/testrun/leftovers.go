package testrun

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mpsd/mpsd/internal/mountinfo"
)

// DefaultMPSDirs are MPS's default pipe and log directories: tests always
// pass their own, so one that appears during a run is a test's mistake.
var DefaultMPSDirs = []string{"/tmp/nvidia-mps", "/var/log/nvidia-mps"}

// cgroupRoots are where the check looks for a run's cgroups: the
// hierarchies under them, and their direct children (a parent a test
// nests under an existing cgroup).
var cgroupRoots = []string{"/sys/fs/cgroup"}

// Begin makes a run's directory under parent ("" for the system's
// temporary directory) and records what already exists that the check
// would otherwise take for the run's (MPS's default directories).
func Begin(parent string) (string, error) {
	if parent == "" {
		parent = os.TempDir()
	}
	for range 100 {
		dir := filepath.Join(parent, dirPrefix+randomHex(3))
		err := os.Mkdir(dir, 0o755)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("testrun: run directory: %w", err)
		}
		var lines strings.Builder
		for _, d := range DefaultMPSDirs {
			if _, err := os.Lstat(d); err == nil {
				lines.WriteString(kindPreexists + " " + d + "\n")
			}
		}
		for _, m := range shmMounts(parent) {
			lines.WriteString(kindPreexists + " " + m + "\n")
		}
		// Only this uid writes it: the check removes what it names.
		if err := os.WriteFile(filepath.Join(dir, ledgerFile), []byte(lines.String()), 0o644); err != nil {
			return "", fmt.Errorf("testrun: ledger: %w", err)
		}
		return dir, nil
	}
	return "", fmt.Errorf("testrun: no free run directory name in %s", parent)
}

// Leftovers is what a run left behind.
type Leftovers struct {
	Procs   []string // "PID command line (why it is the run's)"
	Cgroups []string // paths under /sys/fs/cgroup
	Dirs    []string
	Users   []string
	Default []string // MPS default directories that appeared during the run
	// Mounts are mpsd's private /dev/shm tmpfs mounts (source mpsd-shm)
	// made under the run's parent during the run and still mounted.
	Mounts []string

	pids []int // of Procs, to kill
}

// Empty reports whether nothing was left.
func (l *Leftovers) Empty() bool {
	return len(l.Procs)+len(l.Cgroups)+len(l.Dirs)+len(l.Users)+len(l.Default)+len(l.Mounts) == 0
}

// String is the report, one line per kind and thing.
func (l *Leftovers) String() string {
	var b strings.Builder
	for _, k := range []struct {
		what string
		list []string
	}{
		{"processes left running by the tests", l.Procs},
		{"cgroups left by the tests", l.Cgroups},
		{"temporary directories left by the tests", l.Dirs},
		{"test users left behind", l.Users},
		{"MPS default directories made during the run (a test used them)", l.Default},
		{"private /dev/shm mounts left by the tests", l.Mounts},
	} {
		if len(k.list) > 0 {
			fmt.Fprintf(&b, "check-leftovers: %s:\n", k.what)
			for _, s := range k.list {
				fmt.Fprintf(&b, "  %s\n", s)
			}
		}
	}
	return b.String()
}

// ledger is a run's ledger read back.
type ledger struct {
	dirs, users, preexists []string
	pids                   map[int]string // pid: start time
}

// readLedger reads run's ledger. The check kills and removes what the
// ledger names, so it takes only a ledger (and run directory) of its own
// uid that no one else may write.
func readLedger(run string) (ledger, error) {
	l := ledger{pids: map[int]string{}}
	if err := ownedSafe(run); err != nil {
		return l, err
	}
	f, err := os.Open(filepath.Join(run, ledgerFile))
	if err != nil {
		return l, fmt.Errorf("testrun: %w", err)
	}
	defer f.Close()
	if err := ownedSafe(f.Name()); err != nil {
		return l, err
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		kind, v, _ := strings.Cut(sc.Text(), " ")
		switch kind {
		case kindDir:
			if d := filepath.Clean(v); filepath.IsAbs(d) && d != "/" {
				l.dirs = append(l.dirs, d)
			}
		case kindUser:
			l.users = append(l.users, v)
		case kindPreexists:
			l.preexists = append(l.preexists, v)
		case kindPID:
			p, st, _ := strings.Cut(v, " ")
			if pid, err := strconv.Atoi(p); err == nil {
				l.pids[pid] = st
			}
		}
	}
	if err := sc.Err(); err != nil {
		return l, fmt.Errorf("testrun: ledger: %w", err)
	}
	return l, nil
}

// ownedSafe refuses a path not owned by this process's uid or writable by
// its group or others.
func ownedSafe(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("testrun: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 || fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("testrun: %s is not this uid's alone (%v, uid %d): not a ledger to act on", path, fi.Mode(), st.Uid)
	}
	return nil
}

// Check finds what the run whose directory is run left behind. It looks at
// nothing but what it can tie to the run (see the package comment), and
// leaves out itself and its ancestors (the runner, make): they carry the
// run's variables.
func Check(run string) (*Leftovers, error) {
	if _, ok := tagOf(run); !ok {
		return nil, fmt.Errorf("testrun: %q is not a run directory (%s*)", run, dirPrefix)
	}
	led, err := readLedger(run)
	if err != nil {
		return nil, err
	}
	left := &Leftovers{}
	cgs := runCgroups(run)
	left.Cgroups = append(left.Cgroups, cgs...)
	inCgroup := map[int]string{}
	for _, c := range cgs {
		_ = filepath.WalkDir(c, func(p string, de fs.DirEntry, err error) error {
			if err != nil || !de.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					inCgroup[pid] = p
				}
			}
			return nil
		})
	}
	skip := ancestors()
	for _, p := range listProcs() {
		if skip[p.pid] {
			continue
		}
		if why := belongs(p, run, led, inCgroup); why != "" {
			left.Procs = append(left.Procs, fmt.Sprintf("%s (%s)", p, why))
			left.pids = append(left.pids, p.pid)
		}
	}
	for _, d := range led.dirs {
		if _, err := os.Lstat(d); err == nil {
			left.Dirs = append(left.Dirs, d)
		}
	}
	for _, u := range led.users {
		if _, err := user.Lookup(u); err == nil {
			left.Users = append(left.Users, u)
		} else if _, err := user.LookupGroup(u); err == nil {
			left.Users = append(left.Users, u+" (its group)")
		}
	}
	for _, d := range DefaultMPSDirs {
		if _, err := os.Lstat(d); err == nil && !slices.Contains(led.preexists, d) {
			left.Default = append(left.Default, d)
		}
	}
	for _, m := range shmMounts(filepath.Dir(run)) {
		if !slices.Contains(led.preexists, m) {
			left.Mounts = append(left.Mounts, m)
		}
	}
	return left, nil
}

// shmMounts are the mount points, deepest first, of mpsd's private
// /dev/shm mounts (tmpfs, source mpsd-shm: only mpsd makes those) under
// dir, the run's parent (the system's temporary directory): where tests
// put their run_dir, never a production mpsd's (/run/mpsd).
func shmMounts(dir string) []string {
	if dir == "" {
		dir = os.TempDir()
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 2 || g[0] != "tmpfs" || g[1] != "mpsd-shm" {
			continue
		}
		if mp := mountinfo.Unescape(f[4]); under(mp, dir) {
			out = append(out, mp)
		}
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// belongs says why p is the run's, or "".
func belongs(p proc, run string, led ledger, inCgroup map[int]string) string {
	for _, kv := range p.environ {
		if kv == EnvRun+"="+run || kv == EnvEmuRun+"="+run {
			return "environment: " + kv
		}
	}
	if st, ok := led.pids[p.pid]; ok && st == p.stat.startTime {
		return "started by a test"
	}
	if c, ok := inCgroup[p.pid]; ok {
		return "in cgroup " + c
	}
	for _, d := range led.dirs {
		if under(p.cwd, d) {
			return "working directory in " + d
		}
		for _, kv := range p.environ {
			if _, v, _ := strings.Cut(kv, "="); mentions(v, d) {
				return "environment names " + d
			}
		}
		for _, a := range p.cmdline {
			if mentions(a, d) {
				return "command line names " + d
			}
		}
	}
	return ""
}

// under reports whether path is dir or lies in it.
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// mentions reports whether s holds the path dir (itself, or a path in
// it), not merely a longer name that starts the same.
func mentions(s, dir string) bool {
	for i := 0; ; {
		j := strings.Index(s[i:], dir)
		if j < 0 {
			return false
		}
		end := i + j + len(dir)
		if end == len(s) || s[end] == '/' || !isNameByte(s[end]) {
			return true
		}
		i = end
	}
}

func isNameByte(c byte) bool {
	return c == '-' || c == '_' || c == '.' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// runCgroups lists the cgroups named for run (CgroupName), at the top of
// a hierarchy or one level below.
func runCgroups(run string) []string {
	tag, _ := tagOf(run)
	prefix := CgroupPrefix + tag + "-"
	var out []string
	for _, root := range cgroupRoots {
		hier, _ := filepath.Glob(filepath.Join(root, "*"))
		for _, base := range append([]string{root}, hier...) {
			for _, pat := range []string{filepath.Join(base, prefix+"*"), filepath.Join(base, "*", prefix+"*")} {
				m, _ := filepath.Glob(pat)
				for _, d := range m {
					if fi, err := os.Stat(d); err == nil && fi.IsDir() && !slices.Contains(out, d) {
						out = append(out, d)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// ancestors are this process and its ancestors, by pid.
func ancestors() map[int]bool {
	out := map[int]bool{}
	for pid := os.Getpid(); pid > 0 && !out[pid]; {
		out[pid] = true
		st, err := readStat(pid)
		if err != nil {
			break
		}
		pid = st.ppid
	}
	return out
}

// Clean removes what l lists: it kills the processes (each proven the
// run's), then removes the cgroups (deepest first), unmounts the private
// /dev/shm mounts, removes the directories and the users. MPS's default directories are left: the check cannot tell
// whose they are. It returns what it could not remove.
func (l *Leftovers) Clean() []error {
	var errs []error
	for _, pid := range l.pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	for _, pid := range l.pids {
		if !waitGone(pid) {
			errs = append(errs, fmt.Errorf("process %d survived SIGKILL", pid))
		}
	}
	for _, c := range l.Cgroups {
		var dirs []string
		_ = filepath.WalkDir(c, func(p string, de fs.DirEntry, err error) error {
			if err == nil && de.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	for _, m := range l.Mounts {
		if err := syscall.Unmount(m, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	for _, d := range l.Dirs {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	for _, u := range l.Users {
		name, _, _ := strings.Cut(u, " ")
		if _, err := user.Lookup(name); err == nil {
			if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("userdel %s: %w: %s", name, err, out))
			}
		}
		if _, err := user.LookupGroup(name); err == nil {
			if out, err := exec.Command("groupdel", name).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("groupdel %s: %w: %s", name, err, out))
			}
		}
	}
	return errs
}

// waitGone waits, at most 5 s, until pid has ended. There is no exit
// event for a process that is not this one's child: it polls /proc.
func waitGone(pid int) bool {
	end := time.Now().Add(5 * time.Second)
	for {
		st, err := readStat(pid)
		if err != nil || st.state == 'Z' {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

package cgroup

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/internal/testrun"
)

// suitePrefix names every parent cgroup this test binary makes, so the
// leftover check in TestMain looks at this run's cgroups only (other
// packages' suites may run at the same time with their own mpsd-test-*);
// it holds the test run's tag, so the run's check finds them too.
var suitePrefix = testrun.CgroupName(randomHex(4))

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		// Killed process trees leave orphans; make this process their
		// reaper so they do not pile up as zombies under an init that
		// does not reap (as on this machine).
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, "PR_SET_CHILD_SUBREAPER:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	reapOrphans()
	if left := leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "cgroups left behind by this suite: %v\n", left)
		code = 1
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		code = 1
	}
	os.Exit(code)
}

// leftovers lists every cgroup under any mounted hierarchy whose name starts
// with this suite's prefix.
func leftovers() []string {
	var out []string
	for _, root := range []string{DefaultRoot, filepath.Join(DefaultRoot, "unified")} {
		ents, err := os.ReadDir(root)
		if err != nil {
			continue
		}
		for _, e := range ents {
			dir := filepath.Join(root, e.Name())
			if e.IsDir() && strings.HasPrefix(e.Name(), suitePrefix) {
				out = append(out, dir)
			}
			if sub, err := os.ReadDir(dir); err == nil {
				for _, s := range sub {
					if s.IsDir() && strings.HasPrefix(s.Name(), suitePrefix) {
						out = append(out, filepath.Join(dir, s.Name()))
					}
				}
			}
		}
	}
	return out
}

// reapOrphans reaps the orphans this subreaper adopted. Call it only when
// every exec.Cmd of the test has been waited for, or it would steal their
// exit status.
func reapOrphans() {
	if os.Geteuid() != 0 {
		return
	}
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(-1, &ws, unix.WALL, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
	}
}

var parentSeq atomic.Int64

// backend is one way to run the real-cgroup tests on this host.
type backend struct {
	name string
	cfg  Config
	// skip says why the backend cannot run here, or "".
	skip string
}

func isMount(dir string, magic int64) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == magic
}

// backends lists the three backends with the reason each cannot run on this
// host. The v2 backend runs against whichever cgroup2 mount exists: the
// unified tree of a hybrid host (as on the development machine) or the
// root of a pure v2 host.
func backends() []backend {
	v1ok := ""
	for _, c := range []string{"cpu", "cpuacct", "memory", "pids", "freezer"} {
		if !isMount(filepath.Join(DefaultRoot, c), unix.CGROUP_SUPER_MAGIC) {
			v1ok = "no cgroup v1 " + c + " hierarchy at " + filepath.Join(DefaultRoot, c)
			break
		}
	}
	unified := filepath.Join(DefaultRoot, "unified")
	v2skip := ""
	switch {
	case isMount(DefaultRoot, unix.CGROUP2_SUPER_MAGIC):
		unified = DefaultRoot
	case isMount(unified, unix.CGROUP2_SUPER_MAGIC):
	default:
		v2skip = "no cgroup2 mount at " + DefaultRoot + " or " + unified
	}
	hybridSkip := v1ok
	if hybridSkip == "" && unified != filepath.Join(DefaultRoot, "unified") {
		hybridSkip = "not a hybrid host: no cgroup2 mount at " + filepath.Join(DefaultRoot, "unified")
	}
	if hybridSkip == "" {
		hybridSkip = v2skip
	}
	return []backend{
		{name: "hybrid", cfg: Config{Mode: ModeHybrid}, skip: hybridSkip},
		{name: "v1", cfg: Config{Mode: ModeV1}, skip: v1ok},
		{name: "v2", cfg: Config{Mode: ModeV2, Unified: unified}, skip: v2skip},
	}
}

// eachBackend runs f as a subtest per backend, skipping with the reason
// where a backend cannot run or the test is not root.
func eachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	t.Helper()
	eachBackendOf(t, []Mode{ModeHybrid, ModeV1, ModeV2}, f)
}

// eachBackendOf is eachBackend for a test of what only some backends do
// (the v1 attach step, the unified tree): the others get no subtest, so
// that a skip always means something this host lacks.
func eachBackendOf(t *testing.T, modes []Mode, f func(t *testing.T, b backend)) {
	t.Helper()
	for _, b := range backends() {
		if !slices.Contains(modes, b.cfg.Mode) {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			if os.Geteuid() != 0 {
				t.Skip("needs root: creates cgroups in the host's cgroupfs")
			}
			if b.skip != "" {
				t.Skip(b.skip)
			}
			f(t, b)
		})
	}
}

// newManager makes a Manager with a fresh mpsd-test-* parent and removes
// everything under that parent when the test ends, killing what is left.
func newManager(t testing.TB, b backend) *Cgroups {
	t.Helper()
	cfg := b.cfg
	cfg.Parent = fmt.Sprintf("%s-%d", suitePrefix, parentSeq.Add(1))
	cfg.Logger = discardLogger()
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { cleanupParent(t, m) })
	return m
}

func cleanupParent(t testing.TB, m *Cgroups) {
	t.Helper()
	ids, err := m.List()
	if err != nil {
		t.Errorf("cleanup: list: %v", err)
	}
	for _, id := range ids {
		l, err := m.Open(id)
		if err != nil {
			t.Errorf("cleanup: open %s: %v", id, err)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := l.Kill(ctx); err != nil {
			t.Errorf("cleanup: kill %s: %v", id, err)
		}
		cancel()
		if err := l.Delete(); err != nil {
			t.Errorf("cleanup: delete %s: %v", id, err)
		}
	}
	for _, d := range m.dirs(m.parent) {
		if err := removeTree(d.path); err != nil {
			t.Errorf("cleanup: remove %s parent %s: %v", d.hierarchy, d.path, err)
		}
	}
	reapOrphans()
}

// proc is a started command whose Wait may be called by the test and by
// cleanup alike.
type proc struct {
	cmd  *exec.Cmd
	out  *bufio.Reader
	once sync.Once
	err  error
}

func (p *proc) wait() error {
	p.once.Do(func() { p.err = p.cmd.Wait() })
	return p.err
}

// startIn starts /bin/sh -c script with start (a Lease's Start, or plain
// cmd.Start) and kills it at cleanup if the test did not wait for it.
func startIn(t testing.TB, start func(*exec.Cmd) error, script string) *proc {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := start(cmd); err != nil {
		t.Fatalf("start %q: %v", script, err)
	}
	p := &proc{cmd: cmd, out: bufio.NewReader(out)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = p.wait()
	})
	return p
}

// readLine returns the next line the process prints, failing the test if
// none comes within the deadline.
func (p *proc) readLine(t testing.TB, deadline time.Duration) string {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	c := make(chan res, 1)
	go func() {
		s, err := p.out.ReadString('\n')
		c <- res{s, err}
	}()
	select {
	case r := <-c:
		if r.err != nil && !errors.Is(r.err, io.EOF) {
			t.Fatalf("read from %v: %v", p.cmd.Args, r.err)
		}
		return strings.TrimSuffix(r.s, "\n")
	case <-time.After(deadline):
		_ = p.cmd.Process.Kill()
		t.Fatalf("no output from %v within %s", p.cmd.Args, deadline)
	}
	return ""
}

// readAll returns everything the process prints until it closes stdout.
func (p *proc) readAll(t testing.TB) string {
	t.Helper()
	b, err := io.ReadAll(p.out)
	if err != nil {
		t.Fatalf("read from %v: %v", p.cmd.Args, err)
	}
	return string(b)
}

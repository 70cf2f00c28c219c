package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// v1Tree is the set of v1 controller hierarchies a backend uses, each
// mounted at root/<controller>.
type v1Tree struct {
	root string
	// freezer is set in ModeV1, where the freezer hierarchy is the
	// membership authority and the means to stop fork storms during kill.
	freezer bool
}

func newV1Tree(root string, freezer bool) *v1Tree {
	return &v1Tree{root: root, freezer: freezer}
}

// limitCtrls are the controllers that limit and account a lease. cpuset,
// devices and the named systemd hierarchy are left alone: mpsd does not
// pin CPUs, the devices controller needs a policy of its own, and systemd
// owns its tree.
func (t *v1Tree) limitCtrls() []cgroup1.Name {
	return []cgroup1.Name{cgroup1.Cpu, cgroup1.Cpuacct, cgroup1.Memory, cgroup1.Pids}
}

func (t *v1Tree) allCtrls() []cgroup1.Name {
	c := t.limitCtrls()
	if t.freezer {
		c = append([]cgroup1.Name{cgroup1.Freezer}, c...)
	}
	return c
}

func (t *v1Tree) dir(c cgroup1.Name, rel string) string {
	return filepath.Join(t.root, string(c), rel)
}

func (t *v1Tree) subsystem(c cgroup1.Name) cgroup1.Subsystem {
	switch c {
	case cgroup1.Cpu:
		return cgroup1.NewCpu(t.root)
	case cgroup1.Cpuacct:
		return cgroup1.NewCpuacct(t.root)
	case cgroup1.Memory:
		return cgroup1.NewMemory(t.root, cgroup1.OptionalSwap())
	case cgroup1.Pids:
		return cgroup1.NewPids(t.root)
	}
	return cgroup1.NewFreezer(t.root)
}

func (t *v1Tree) hierarchy(cs ...cgroup1.Name) cgroup1.Hierarchy {
	return func() ([]cgroup1.Subsystem, error) {
		out := make([]cgroup1.Subsystem, 0, len(cs))
		for _, c := range cs {
			out = append(out, t.subsystem(c))
		}
		return out, nil
	}
}

// check verifies that every controller the tree uses is a mounted v1
// hierarchy (a symlink such as cpu -> cpu,cpuacct is fine).
func (t *v1Tree) check() error {
	for _, c := range t.allCtrls() {
		d := t.dir(c, "")
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err != nil {
			return fmt.Errorf("cgroup: %s: statfs %s: %w: %w", c, d, ErrControllerMissing, err)
		}
		if st.Type != unix.CGROUP_SUPER_MAGIC {
			return fmt.Errorf("cgroup: %s: %s is not a cgroup v1 mount: %w", c, d, ErrControllerMissing)
		}
	}
	return nil
}

// specResources converts limits for cgroup1; nil fields leave the kernel's
// defaults.
func specResources(lim Limits) *specs.LinuxResources {
	res := &specs.LinuxResources{}
	if lim.CPUWeight > 0 || lim.CPUQuota > 0 {
		res.CPU = &specs.LinuxCPU{}
		if lim.CPUWeight > 0 {
			s := weightToShares(lim.CPUWeight)
			res.CPU.Shares = &s
		}
		if lim.CPUQuota > 0 {
			q := lim.CPUQuota.Microseconds()
			p := uint64(lim.period().Microseconds())
			res.CPU.Quota, res.CPU.Period = &q, &p
		}
	}
	if lim.MemoryBytes > 0 {
		m := lim.MemoryBytes
		res.Memory = &specs.LinuxMemory{Limit: &m}
	}
	if lim.Pids > 0 {
		p := lim.Pids
		res.Pids = &specs.LinuxPids{Limit: &p}
	}
	return res
}

// create makes rel in every controller, one at a time so that an error
// names the controller that failed.
func (t *v1Tree) create(rel string, lim Limits) error {
	res := specResources(lim)
	for _, c := range t.allCtrls() {
		if _, err := cgroup1.New(cgroup1.StaticPath("/"+rel), res, cgroup1.WithHierarchy(t.hierarchy(c))); err != nil {
			return fmt.Errorf("cgroup: %s: create %s: %w", c, t.dir(c, rel), err)
		}
	}
	return nil
}

// attach writes pid into rel in every controller, the freezer last: in
// ModeV1 the freezer tree is the membership authority, and the limits
// must already apply when the process shows there as the lease's. A
// failure on the way leaves it out of the membership tree.
func (t *v1Tree) attach(rel string, pid int) error {
	for _, c := range t.limitCtrls() {
		if err := writeProcs(string(c), t.dir(c, rel), pid); err != nil {
			return err
		}
	}
	if t.freezer {
		return writeProcs(string(cgroup1.Freezer), t.dir(cgroup1.Freezer, rel), pid)
	}
	return nil
}

// writeFile writes s to an existing interface file of a cgroup. Unlike
// os.WriteFile it opens without O_CREAT: kernfs answers an O_CREAT open of
// a file it does not have with EACCES, not ENOENT, so only this way does a
// missing file (cgroup.kill before Linux 5.14) read as fs.ErrNotExist.
func writeFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeProcs moves pid into the cgroup at dir.
func writeProcs(hierarchy, dir string, pid int) error {
	err := writeFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("cgroup: %s: attach %d to %s: %w: %w", hierarchy, pid, dir, ErrNoProcess, err)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("cgroup: %s: attach %d to %s: %w: %w", hierarchy, pid, dir, ErrNotExist, err)
	}
	return fmt.Errorf("cgroup: %s: attach %d to %s: %w", hierarchy, pid, dir, err)
}

// readFile reads one interface file of a controller, naming both on error.
func readFile(ctrl, dir, name string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("cgroup: %s: read %s: %w: %w", ctrl, filepath.Join(dir, name), ErrNotExist, err)
		}
		return nil, fmt.Errorf("cgroup: %s: read %s: %w", ctrl, filepath.Join(dir, name), err)
	}
	return b, nil
}

// v1Unlimited is the smallest value v1 reports for "no limit": the kernel
// prints PAGE_COUNTER_MAX pages in bytes, just under 2^63.
const v1Unlimited = 1 << 62

// limits reads back the limits of rel.
func (t *v1Tree) limits(rel string) (Limits, error) {
	var lim Limits
	cpu := t.dir(cgroup1.Cpu, rel)
	b, err := readFile("cpu", cpu, "cpu.shares")
	if err != nil {
		return Limits{}, err
	}
	shares, _, err := parseUintOrMax(b)
	if err != nil {
		return Limits{}, fmt.Errorf("cgroup: cpu: %s/cpu.shares: %w", cpu, err)
	}
	lim.CPUWeight = sharesToWeight(shares)
	if b, err = readFile("cpu", cpu, "cpu.cfs_quota_us"); err != nil {
		return Limits{}, err
	}
	q, err := parseInt(b)
	if err != nil {
		return Limits{}, fmt.Errorf("cgroup: cpu: %s/cpu.cfs_quota_us: %w", cpu, err)
	}
	if b, err = readFile("cpu", cpu, "cpu.cfs_period_us"); err != nil {
		return Limits{}, err
	}
	p, err := parseInt(b)
	if err != nil {
		return Limits{}, fmt.Errorf("cgroup: cpu: %s/cpu.cfs_period_us: %w", cpu, err)
	}
	if q > 0 {
		lim.CPUQuota = time.Duration(q) * time.Microsecond
		lim.CPUPeriod = time.Duration(p) * time.Microsecond
	}

	mem := t.dir(cgroup1.Memory, rel)
	if b, err = readFile("memory", mem, "memory.limit_in_bytes"); err != nil {
		return Limits{}, err
	}
	m, _, err := parseUintOrMax(b)
	if err != nil {
		return Limits{}, fmt.Errorf("cgroup: memory: %s/memory.limit_in_bytes: %w", mem, err)
	}
	if m < v1Unlimited {
		lim.MemoryBytes = int64(m)
	}

	pids := t.dir(cgroup1.Pids, rel)
	if b, err = readFile("pids", pids, "pids.max"); err != nil {
		return Limits{}, err
	}
	n, unlimited, err := parseUintOrMax(b)
	if err != nil || n > v1Unlimited {
		return Limits{}, fmt.Errorf("cgroup: pids: %s/pids.max: %w", pids, errors.Join(errParse, err))
	}
	if !unlimited {
		lim.Pids = int64(n)
	}
	return lim, nil
}

// stats reads usage through cgroup1.
func (t *v1Tree) stats(rel string) (Stats, error) {
	cg, err := cgroup1.Load(cgroup1.StaticPath("/"+rel), cgroup1.WithHierarchy(t.hierarchy(t.limitCtrls()...)))
	if err != nil {
		if errors.Is(err, cgroup1.ErrCgroupDeleted) {
			return Stats{}, fmt.Errorf("cgroup: stats %s: %w: %w", rel, ErrNotExist, err)
		}
		return Stats{}, fmt.Errorf("cgroup: cpu,cpuacct,memory,pids: load %s: %w", rel, err)
	}
	m, err := cg.Stat(cgroup1.IgnoreNotExist)
	if err != nil {
		return Stats{}, fmt.Errorf("cgroup: cpu,cpuacct,memory,pids: stats %s: %w", rel, err)
	}
	var s Stats
	if m.CPU != nil && m.CPU.Usage != nil {
		s.CPUUsage = time.Duration(m.CPU.Usage.Total)
	}
	if m.Memory != nil && m.Memory.Usage != nil {
		s.MemoryBytes = m.Memory.Usage.Usage
	}
	if m.Pids != nil {
		s.Pids = m.Pids.Current
	}
	return s, nil
}

// v1Freezer drives freezer.state of one v1 cgroup.
type v1Freezer struct{ dir string }

func (f v1Freezer) set(frozen bool) error {
	v := "THAWED"
	if frozen {
		v = "FROZEN"
	}
	if err := writeFile(filepath.Join(f.dir, "freezer.state"), v); err != nil {
		return fmt.Errorf("cgroup: freezer: write %s to %s/freezer.state: %w", v, f.dir, err)
	}
	return nil
}

func (f v1Freezer) frozen() (bool, error) {
	b, err := readFile("freezer", f.dir, "freezer.state")
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) == "FROZEN", nil
}

var _ freezer = v1Freezer{}

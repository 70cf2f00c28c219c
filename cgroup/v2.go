package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"
)

// v2Tree is the unified hierarchy mounted at mount.
type v2Tree struct{ mount string }

func (t *v2Tree) dir(rel string) string { return filepath.Join(t.mount, rel) }

func (t *v2Tree) check() error {
	var st unix.Statfs_t
	if err := unix.Statfs(t.mount, &st); err != nil {
		return fmt.Errorf("cgroup: unified: statfs %s: %w: %w", t.mount, ErrUnavailable, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("cgroup: unified: %s is not a cgroup2 mount: %w", t.mount, ErrUnavailable)
	}
	return nil
}

// checkControllers fails with ErrControllerMissing, naming the file it read,
// when a controller the limits need cannot be enabled for rel: it must be
// listed in cgroup.controllers of the deepest existing ancestor.
func (t *v2Tree) checkControllers(rel string, need []string) error {
	if len(need) == 0 {
		return nil
	}
	dir := filepath.Dir(t.dir(rel))
	for dir != t.mount && !exists(dir) {
		dir = filepath.Dir(dir)
	}
	b, err := readFile("unified", dir, "cgroup.controllers")
	if err != nil {
		return err
	}
	have := strings.Fields(string(b))
	for _, c := range need {
		if !slices.Contains(have, c) {
			return fmt.Errorf("cgroup: %s: not in %s/cgroup.controllers (%q): %w", c, dir, strings.TrimSpace(string(b)), ErrControllerMissing)
		}
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// v2Resources converts limits for cgroup2; nil fields leave the kernel's
// defaults. A memory limit also sets memory.oom.group so that an OOM kill
// takes the whole lease, as a lease is one client however many processes it
// forks.
func v2Resources(lim Limits) *cgroup2.Resources {
	res := &cgroup2.Resources{}
	if lim.CPUWeight > 0 || lim.CPUQuota > 0 {
		res.CPU = &cgroup2.CPU{}
		if lim.CPUWeight > 0 {
			w := lim.CPUWeight
			res.CPU.Weight = &w
		}
		if lim.CPUQuota > 0 {
			q := lim.CPUQuota.Microseconds()
			p := uint64(lim.period().Microseconds())
			res.CPU.Max = cgroup2.NewCPUMax(&q, &p)
		}
	}
	if lim.MemoryBytes > 0 {
		m, group := lim.MemoryBytes, true
		res.Memory = &cgroup2.Memory{Max: &m, OOMGroup: &group}
	}
	if lim.Pids > 0 {
		res.Pids = &cgroup2.Pids{Max: lim.Pids}
	}
	return res
}

// limits reads back the limits of rel; files of controllers that are not
// enabled read as "no limit".
func (t *v2Tree) limits(rel string) (Limits, error) {
	dir := t.dir(rel)
	if !exists(dir) {
		return Limits{}, fmt.Errorf("cgroup: unified: limits %s: %w", dir, ErrNotExist)
	}
	var lim Limits
	read := func(ctrl, name string) ([]byte, bool, error) {
		b, err := readFile(ctrl, dir, name)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, false, nil
		}
		return b, err == nil, err
	}
	if b, ok, err := read("cpu", "cpu.weight"); err != nil {
		return Limits{}, err
	} else if ok {
		w, _, err := parseUintOrMax(b)
		if err != nil {
			return Limits{}, fmt.Errorf("cgroup: cpu: %s/cpu.weight: %w", dir, err)
		}
		lim.CPUWeight = w
	}
	if b, ok, err := read("cpu", "cpu.max"); err != nil {
		return Limits{}, err
	} else if ok {
		q, p, err := parseCPUMax(b)
		if err != nil {
			return Limits{}, fmt.Errorf("cgroup: cpu: %s/cpu.max: %w", dir, err)
		}
		if q > 0 {
			lim.CPUQuota, lim.CPUPeriod = q, p
		}
	}
	if b, ok, err := read("memory", "memory.max"); err != nil {
		return Limits{}, err
	} else if ok {
		m, unlimited, err := parseUintOrMax(b)
		if err != nil || m > v1Unlimited {
			return Limits{}, fmt.Errorf("cgroup: memory: %s/memory.max: %w", dir, errors.Join(errParse, err))
		}
		if !unlimited {
			lim.MemoryBytes = int64(m)
		}
	}
	if b, ok, err := read("pids", "pids.max"); err != nil {
		return Limits{}, err
	} else if ok {
		n, unlimited, err := parseUintOrMax(b)
		if err != nil || n > v1Unlimited {
			return Limits{}, fmt.Errorf("cgroup: pids: %s/pids.max: %w", dir, errors.Join(errParse, err))
		}
		if !unlimited {
			lim.Pids = int64(n)
		}
	}
	return lim, nil
}

// stats reads usage through cgroup2, asking only for what rel's enabled
// controllers provide (cpu.stat exists without the cpu controller).
func (t *v2Tree) stats(rel string) (Stats, error) {
	dir := t.dir(rel)
	b, err := readFile("unified", dir, "cgroup.controllers")
	if err != nil {
		return Stats{}, err
	}
	have := strings.Fields(string(b))
	mask := cgroup2.StatCPU
	if slices.Contains(have, "memory") {
		mask |= cgroup2.StatMemory
	}
	if slices.Contains(have, "pids") {
		mask |= cgroup2.StatPids
	}
	mgr, err := cgroup2.Load("/"+rel, cgroup2.WithMountpoint(t.mount))
	if err != nil {
		return Stats{}, fmt.Errorf("cgroup: unified: load %s: %w", dir, err)
	}
	m, err := mgr.StatFiltered(mask)
	if err != nil {
		return Stats{}, fmt.Errorf("cgroup: unified: stats %s: %w", dir, err)
	}
	var s Stats
	if m.CPU != nil {
		s.CPUUsage = time.Duration(m.CPU.UsageUsec) * time.Microsecond
	}
	if m.Memory != nil {
		s.MemoryBytes = m.Memory.Usage
	}
	if m.Pids != nil {
		s.Pids = m.Pids.Current
	}
	return s, nil
}

// v2Freezer drives cgroup.freeze, used only where cgroup.kill is missing
// (kernels before 5.14).
type v2Freezer struct{ dir string }

func (f v2Freezer) set(frozen bool) error {
	v := "0"
	if frozen {
		v = "1"
	}
	if err := writeFile(filepath.Join(f.dir, "cgroup.freeze"), v); err != nil {
		return fmt.Errorf("cgroup: unified: write %s to %s/cgroup.freeze: %w", v, f.dir, err)
	}
	return nil
}

func (f v2Freezer) frozen() (bool, error) {
	b, err := readFile("unified", f.dir, "cgroup.events")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "frozen 1" {
			return true, nil
		}
	}
	return false, nil
}

var _ freezer = v2Freezer{}

package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The parsers below read cgroupfs files, whose content is outside input: a
// kernel version, a foreign writer or a fake tree in tests can put anything
// there, so they reject what they do not understand instead of guessing.

var errParse = errors.New("unexpected content")

// maxNameLen bounds group and lease names so that a full lease path stays far
// below PATH_MAX on every hierarchy.
const maxNameLen = 64

// validName reports whether s is usable as one path element of a lease
// cgroup. [A-Za-z0-9][A-Za-z0-9_-]* cannot climb (. and ..), hide (leading
// dot), nest (/) or collide with the kernel's interface files, which all
// contain a dot (cgroup.procs, cpu.max).
func validName(s string) bool {
	if s == "" || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case (c == '_' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// parseUintOrMax parses a single-value file such as pids.max or
// memory.limit_in_bytes: a decimal number or "max". unlimited is returned as
// true for "max".
func parseUintOrMax(b []byte) (v uint64, unlimited bool, err error) {
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, true, nil
	}
	v, err = strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("%w: %q is neither a number nor max", errParse, s)
	}
	return v, false, nil
}

// parseInt parses a single signed decimal value such as cpu.cfs_quota_us,
// where -1 means no quota.
func parseInt(b []byte) (int64, error) {
	s := strings.TrimSpace(string(b))
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is not a number", errParse, s)
	}
	return v, nil
}

// parseCPUMax parses cgroup v2 cpu.max ("$QUOTA $PERIOD" or "max $PERIOD"),
// both in microseconds. A zero quota means no quota.
func parseCPUMax(b []byte) (quota, period time.Duration, err error) {
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("%w: cpu.max %q: want 2 fields", errParse, b)
	}
	p, err := strconv.ParseUint(f[1], 10, 63)
	if err != nil || p == 0 || p > math.MaxInt64/uint64(time.Microsecond) {
		return 0, 0, fmt.Errorf("%w: cpu.max period %q", errParse, f[1])
	}
	period = time.Duration(p) * time.Microsecond
	if f[0] == "max" {
		return 0, period, nil
	}
	q, err := strconv.ParseUint(f[0], 10, 63)
	if err != nil || q == 0 || q > math.MaxInt64/uint64(time.Microsecond) {
		return 0, 0, fmt.Errorf("%w: cpu.max quota %q", errParse, f[0])
	}
	return time.Duration(q) * time.Microsecond, period, nil
}

// parsePopulated reads the populated key of cgroup v2 cgroup.events
// ("populated 0|1\nfrozen 0|1\n").
func parsePopulated(b []byte) (bool, error) {
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || k != "populated" {
			continue
		}
		switch v {
		case "0":
			return false, nil
		case "1":
			return true, nil
		}
		return false, fmt.Errorf("%w: cgroup.events populated %q", errParse, v)
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("%w: cgroup.events: %w", errParse, err)
	}
	return false, fmt.Errorf("%w: cgroup.events has no populated key", errParse)
}

// parsePids parses cgroup.procs: one decimal pid per line.
func parsePids(b []byte) ([]int, error) {
	var pids []int
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		pid, err := strconv.Atoi(line)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("%w: cgroup.procs line %q", errParse, line)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// The kernel's cpu.weight range and v1 cpu.shares range. The conversion is
// the linear map runc, systemd and containerd use; both directions round to
// nearest, and because the shares scale is ~26x finer than the weight scale
// every weight survives a round trip through cpu.shares unchanged.
const (
	minWeight = 1
	maxWeight = 10000
	minShares = 2
	maxShares = 262144
)

func weightToShares(w uint64) uint64 {
	return minShares + ((w-minWeight)*(maxShares-minShares)+(maxWeight-minWeight)/2)/(maxWeight-minWeight)
}

func sharesToWeight(s uint64) uint64 {
	switch {
	case s <= minShares:
		return minWeight
	case s >= maxShares:
		return maxWeight
	}
	return minWeight + ((s-minShares)*(maxWeight-minWeight)+(maxShares-minShares)/2)/(maxShares-minShares)
}

// parseKernelRelease reads the major and minor version from a kernel
// release string such as "6.1.0-18-amd64" or "5.4.0".
func parseKernelRelease(s string) (major, minor int, ok bool) {
	maj, rest, found := strings.Cut(s, ".")
	if !found {
		return 0, 0, false
	}
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	var err1, err2 error
	major, err1 = strconv.Atoi(maj)
	minor, err2 = strconv.Atoi(rest[:end])
	if err1 != nil || err2 != nil || major < 0 || minor < 0 {
		return 0, 0, false
	}
	return major, minor, true
}

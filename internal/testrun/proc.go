package testrun

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// procStat is what /proc/PID/stat says that the check needs.
type procStat struct {
	state     byte
	ppid      int
	startTime string // clock ticks after boot: with the pid, one process
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(string(b))
}

// parseStat reads /proc/PID/stat: "pid (comm) state ppid ...", comm being
// anything, parentheses included; field 22 is the start time.
func parseStat(s string) (procStat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("testrun: stat %q: no comm", s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("testrun: stat %q: too short", s)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, fmt.Errorf("testrun: stat %q: ppid: %w", s, err)
	}
	if _, err := strconv.ParseUint(f[19], 10, 64); err != nil {
		return procStat{}, fmt.Errorf("testrun: stat %q: start time: %w", s, err)
	}
	return procStat{state: f[0][0], ppid: ppid, startTime: f[19]}, nil
}

func startTime(pid int) (string, error) {
	st, err := readStat(pid)
	return st.startTime, err
}

// proc is a process as the check sees it.
type proc struct {
	pid     int
	stat    procStat
	cmdline []string
	environ []string
	cwd     string
}

func (p proc) String() string {
	return fmt.Sprintf("%d %s", p.pid, strings.Join(p.cmdline, " "))
}

// listProcs reads every process of the host that is still running (not a
// zombie); those it cannot read are left out.
func listProcs() []proc {
	ents, _ := os.ReadDir("/proc")
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.state == 'Z' {
			continue
		}
		p := proc{pid: pid, stat: st}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
			p.cmdline = splitNUL(b)
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err == nil {
			p.environ = splitNUL(b)
		}
		p.cwd, _ = os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		out = append(out, p)
	}
	return out
}

func splitNUL(b []byte) []string {
	var out []string
	for _, f := range bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0}) {
		if len(f) > 0 {
			out = append(out, string(f))
		}
	}
	return out
}

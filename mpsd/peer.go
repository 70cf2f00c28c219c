package mpsd

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	mountfields "github.com/mpsd/mpsd/internal/mountinfo"
	"github.com/mpsd/mpsd/internal/procstat"
)

// peer is who is on the other end of a connection, from SO_PEERCRED and
// SO_PEERGROUPS, both taken when the connection was accepted: the
// kernel's record of the connecting process, not anything a later look
// at /proc (whose pid may have been reused) would say.
type peer struct {
	pid    int
	uid    uint32
	gid    uint32
	groups []uint32 // supplementary groups; nil when they could not be read
}

// unixPeer reads the peer credentials of a unix socket connection.
func unixPeer(c net.Conn) (peer, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peer{}, errors.New("not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return peer{}, err
	}
	var p peer
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		var cred *unix.Ucred
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if cerr != nil {
			return
		}
		p = peer{pid: int(cred.Pid), uid: cred.Uid, gid: cred.Gid}
		p.groups, cerr = peerGroups(int(fd))
		if errors.Is(cerr, unix.ENOPROTOOPT) {
			// A kernel before 4.13: no groups, so unix-group membership
			// is not granted (never guessed from /proc).
			p.groups, cerr = nil, nil
		}
	}); err != nil {
		return peer{}, err
	}
	if cerr != nil {
		return peer{}, cerr
	}
	return p, nil
}

// peerGroups reads SO_PEERGROUPS: the supplementary groups the peer had
// when it connected (Linux 4.13 and later). golang.org/x/sys has no
// wrapper for it, so this is getsockopt(2) itself.
func peerGroups(fd int) ([]uint32, error) {
	n := 64
	for {
		buf := make([]uint32, n)
		size := uint32(len(buf) * 4)
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		switch {
		case e == 0:
			return buf[:size/4], nil
		case e == unix.ERANGE && int(size/4) > n && size/4 <= 1<<16:
			// The kernel says how much room the groups need.
			n = int(size / 4)
		default:
			return nil, fmt.Errorf("getsockopt SO_PEERGROUPS: %w", e)
		}
	}
}

// pidHandle is a process mpsd holds a pidfd on: what /proc says of its
// pid is that process's only while the pidfd shows it has not exited.
type pidHandle struct {
	pid   int
	fd    int
	start uint64 // start time, clock ticks after boot (/proc/PID/stat field 22)
}

// openPid opens a pidfd on pid, then reads its start time.
func openPid(proc string, pid int) (*pidHandle, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	h := &pidHandle{pid: pid, fd: fd}
	if h.start, err = procStartTime(proc, pid); err != nil {
		h.close()
		return nil, err
	}
	return h, nil
}

// alive reports whether the process has not exited: a pidfd polls
// readable once it has (a zombie has exited).
func (h *pidHandle) alive() bool {
	fds := []unix.PollFd{{Fd: int32(h.fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n == 0
	}
}

// exitsWithin waits up to d for the process to exit and reports whether
// it has.
func (h *pidHandle) exitsWithin(d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(h.fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(d)
	for {
		n, err := unix.Poll(fds, int(max(time.Until(deadline), 0).Milliseconds()))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return false
		}
		return n > 0
	}
}

func (h *pidHandle) close() { _ = unix.Close(h.fd) }

// procStartTime reads field 22 (starttime) of /proc/PID/stat. The command
// name (field 2) may hold spaces and parentheses: fields are counted after
// its last ')'.
func procStartTime(proc string, pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	return parseStatStart(b)
}

// userHZ is the unit of /proc's process start times: clock ticks, fixed
// at 100 a second for every architecture's user ABI (sysconf(_SC_CLK_TCK)).
const userHZ = 100

// bootTicks is the time since boot in the clock ticks of a process's
// start time (/proc/PID/stat field 22, which the kernel counts on
// CLOCK_BOOTTIME), rounded down: a process whose start time is larger
// started after the call.
func bootTicks() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, fmt.Errorf("clock_gettime(CLOCK_BOOTTIME): %w", err)
	}
	return uint64(ts.Sec)*userHZ + uint64(ts.Nsec)/(1e9/userHZ), nil
}

func parseStatStart(b []byte) (uint64, error) {
	st, err := procstat.Parse(string(b))
	if err != nil {
		return 0, err
	}
	if !st.HasStart {
		return 0, errors.New("stat: too few fields")
	}
	return st.StartTime, nil
}

// procCgroups reads /proc/PID/cgroup: each hierarchy's key ("" for cgroup
// v2, the controller list for v1) and the process's cgroup in it.
func procCgroups(proc string, pid int) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		out[parts[1]] = parts[2]
	}
	return out, nil
}

// unifiedCgroup is pid's cgroup v2 path ("0::" line of /proc/PID/cgroup),
// or "" when it has none.
func unifiedCgroup(proc string, pid int) (string, error) {
	cgs, err := procCgroups(proc, pid)
	return cgs[""], err
}

// restoreCgroups moves pid into the cgroups process from is in, in every
// hierarchy /proc/FROM/cgroup lists: where a child forked by from would
// be. It undoes mpsd's move of a process that was not the one it checked.
func restoreCgroups(proc string, pid, from int) error {
	cgs, err := procCgroups(proc, from)
	if err != nil {
		return err
	}
	mounts, err := cgroupMounts(filepath.Join(proc, "self", "mountinfo"))
	if err != nil {
		return err
	}
	var errs []error
	for key, path := range cgs { // key: the controller list; "" for v2, name=... for named v1
		dir, ok := mounts[key]
		if !ok {
			continue
		}
		target := filepath.Join(dir, filepath.Clean(path), "cgroup.procs")
		if err := os.WriteFile(target, []byte(strconv.Itoa(pid)), 0); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("move pid %d to %s: %w", pid, target, err))
		}
	}
	return errors.Join(errs...)
}

// cgroupMounts maps each mounted cgroup hierarchy, by the controller list
// /proc/PID/cgroup names it with ("" for cgroup2), to a mount point of its
// root.
func cgroupMounts(mountinfo string) (map[string]string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, sf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(sf) < 3 || pf[3] != "/" {
			continue
		}
		mp := mountfields.Unescape(pf[4])
		switch sf[0] {
		case "cgroup2":
			if _, seen := out[""]; !seen {
				out[""] = mp
			}
		case "cgroup":
			var ctrls []string
			for o := range strings.SplitSeq(sf[2], ",") {
				switch {
				case o == "rw" || o == "ro" || strings.HasPrefix(o, "release_agent=") || o == "clone_children" || o == "noprefix" || o == "xattr" || o == "cpuset_v2_mode" || o == "favordynmods":
				default:
					ctrls = append(ctrls, o)
				}
			}
			key := strings.Join(ctrls, ",")
			if _, seen := out[key]; !seen {
				out[key] = mp
			}
		}
	}
	return out, sc.Err()
}

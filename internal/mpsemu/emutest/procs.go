package emutest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Alive reports whether pid still runs. A zombie has exited (its parent just
// has not reaped it); but a multi-threaded process (the emulator is Go)
// shows its main thread as a zombie while other threads still exit and still
// hold its sockets, so it is gone only when no thread but the leader is left.
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	if !strings.HasPrefix(rest, "Z") {
		return true
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	return err == nil && len(tasks) > 1
}

// WaitGone waits (at most 5 s) until pid is gone. The kernel offers no exit
// event for a process that is not our child, so it polls /proc.
func WaitGone(pid int) {
	end := time.Now().Add(5 * time.Second)
	for Alive(pid) && time.Now().Before(end) {
		time.Sleep(time.Millisecond)
	}
}

// KillByPipeDir SIGKILLs every process whose environment has
// CUDA_MPS_PIPE_DIRECTORY=pipe (a daemon, its servers, orphans, hung
// callers) and waits until they are gone. Tests call it in cleanup, so
// nothing they started outlives them, whoever its parent is.
func KillByPipeDir(pipe string) {
	needle := []byte("CUDA_MPS_PIPE_DIRECTORY=" + pipe + "\x00")
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil || !bytes.Contains(env, needle) {
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGCONT) // a SIGSTOPped process dies too
		pids = append(pids, pid)
	}
	for _, pid := range pids {
		WaitGone(pid)
	}
}

// RemoveCgroupTree kills what is left in a test's cgroup parent (a name
// under every hierarchy's root) and removes it, deepest first, from every
// hierarchy.
func RemoveCgroupTree(parent string) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, root := range roots {
		top := filepath.Join(root, parent)
		if _, err := os.Stat(top); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, de os.DirEntry, err error) error {
			if err == nil && de.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if b, err := os.ReadFile(filepath.Join(dirs[i], "cgroup.procs")); err == nil {
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						_ = syscall.Kill(pid, syscall.SIGKILL)
						WaitGone(pid)
					}
				}
			}
			_ = os.Remove(dirs[i])
		}
	}
}

// ContainerCgroup makes, under mount (a cgroup hierarchy's root), a cgroup
// named as containerd names a container's, <parent>/cri-containerd-<id>.scope,
// and returns its directory; cleanup kills what is left in it and removes
// it and parent.
func ContainerCgroup(tb testing.TB, mount, parent, id string) string {
	tb.Helper()
	top := filepath.Join(mount, parent)
	dir := filepath.Join(top, "cri-containerd-"+id+".scope")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		deadline := time.Now().Add(30 * time.Second)
		for {
			b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for f := range strings.FieldsSeq(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = os.Remove(top)
	})
	return dir
}

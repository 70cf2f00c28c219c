package mps

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// DevShm is where CUDA's MPS servers and clients share memory.
const DevShm = "/dev/shm"

// ShmDirName is the name of an instance's private shared-memory directory,
// next to its pipe directory: <instance>/pipe is CUDA_MPS_PIPE_DIRECTORY,
// <instance>/shm the /dev/shm of its daemon, its servers and its pods.
const ShmDirName = "shm"

// ShmDirFor is the private shared-memory directory of the instance whose
// CUDA_MPS_PIPE_DIRECTORY is pipeDir.
func ShmDirFor(pipeDir string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(pipeDir)), ShmDirName)
}

// ErrShmDir wraps every reason a private shared-memory directory cannot
// be used (it is not a plain directory, someone else owns it).
var ErrShmDir = errors.New("mps: private /dev/shm directory")

// PrepareShmDir creates dir (its parent too) as the private /dev/shm of an
// instance: a directory, not a link, mode 1777 like /dev/shm itself (the
// servers run as their clients' uids and both sides create files there),
// owned by this process's user (root in production, so no tenant owns or
// can replace it; the parents are mpsd's run directories, which tenants
// cannot write). It is a plain directory, not a tmpfs of its own: it
// outlives mpsd (servers keep running across mpsd restarts), needs no
// mount on the host that could leak, and reaches pods as it is even when
// mpsd runs in a container without mount propagation to the host. The
// pages written there are charged to the writer's memory cgroup (a pod's
// limit bounds them), as on /dev/shm; run_dir should be on a tmpfs such as
// /run, where shared memory belongs.
func PrepareShmDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%w: %q is not an absolute path", ErrShmDir, dir)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("%w: create the parent of %s: %w", ErrShmDir, dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%w: create %s: %w", ErrShmDir, dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrShmDir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s is a %v, not a directory", ErrShmDir, dir, fi.Mode().Type())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: %s belongs to uid %d, not to mpsd's uid %d", ErrShmDir, dir, st.Uid, os.Geteuid())
	}
	if fi.Mode()&(os.ModePerm|os.ModeSticky) != os.ModePerm|os.ModeSticky {
		if err := os.Chmod(dir, os.ModePerm|os.ModeSticky); err != nil {
			return fmt.Errorf("%w: chmod %s: %w", ErrShmDir, dir, err)
		}
	}
	return nil
}

// PrivateShm returns a Runner that starts the control daemon (`-d`) in a
// mount namespace of its own, in which /dev/shm is a bind mount of dir
// (made with PrepareShmDir); every other command (the control client) goes
// to inner unchanged. The daemon forks its servers, which inherit the
// namespace: the instance's servers share memory through dir only, so
// clients reach them only with dir as their /dev/shm — pods get it mounted
// there by the device plugin — and no tenant sees another instance's
// shared memory or the host's. A nil inner is ExecRunner.
//
// This follows what NVIDIA's k8s-device-plugin does for its MPS daemons
// (cmd/mps-control-daemon: a dedicated shm directory, a tmpfs it mounts at
// <mps root>/shm, mounted into the daemon's container at /dev/shm and into
// every pod that uses MPS); mpsd has no container per daemon, so it makes
// the namespace itself, and has one directory per instance, not one per
// node.
//
// The namespace is made on a locked OS thread: unshare(CLONE_NEWNS), every
// mount made a slave (MS_REC|MS_SLAVE: nothing mounted there propagates
// back to the host, while the host's unmounts still reach the copy, so the
// daemon never pins a filesystem the host has unmounted, as an MS_PRIVATE
// copy would), then dir bound on /dev/shm with nosuid, nodev and noexec.
// inner starts the command from that thread — os/exec forks on the calling
// thread, and the child inherits the thread's namespace — and the thread
// is never unlocked, so the runtime discards it with its namespace when
// the goroutine ends; mpsd's own threads and the host never see the mount.
// inner must start the process on the goroutine it is called on, as
// ExecRunner does.
func PrivateShm(inner Runner, dir string) Runner {
	if inner == nil {
		inner = ExecRunner{}
	}
	return privateShm{inner: inner, dir: dir}
}

type privateShm struct {
	inner Runner
	dir   string
}

// Start implements Runner.
func (r privateShm) Start(cmd *exec.Cmd) error {
	if !slices.Contains(cmd.Args[1:], "-d") {
		return r.inner.Start(cmd)
	}
	// Whatever lies under /dev/shm is out of the daemon's sight once its
	// own is mounted there: its pipe and log directories must not.
	for what, p := range map[string]string{"private /dev/shm": r.dir, "pipe directory": envValue(cmd.Env, "CUDA_MPS_PIPE_DIRECTORY"), "log directory": envValue(cmd.Env, "CUDA_MPS_LOG_DIRECTORY")} {
		if rel, err := filepath.Rel(DevShm, filepath.Clean(p)); p != "" && err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return fmt.Errorf("%w: the daemon's %s %s is under %s, which its private %s hides: put run_dir and log_dir elsewhere", ErrShmDir, what, p, DevShm, DevShm)
		}
	}
	if err := PrepareShmDir(r.dir); err != nil {
		return err
	}
	return onDiscardedThread(func() error {
		if err := enterPrivateShm(r.dir); err != nil {
			return err
		}
		return r.inner.Start(cmd)
	})
}

// onDiscardedThread runs fn on a locked OS thread that ends with it, so
// whatever fn changes about its thread (its mount namespace) dies with the
// thread. The process's main thread is never used: the runtime cannot end
// it, and would keep it, parked in fn's namespace, for the life of the
// process (its /proc/<pid>/mountinfo would then show that namespace).
func onDiscardedThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Keep the main thread locked to this goroutine, so the
			// runtime cannot hand it to the one below, and let go of it
			// once that one is done.
			defer runtime.UnlockOSThread()
			errc <- onDiscardedThread(fn)
			return
		}
		// Never unlocked: the runtime ends the thread when this returns.
		errc <- fn()
	}()
	return <-errc
}

// enterPrivateShm moves the calling thread into a new mount namespace
// where dir is mounted on /dev/shm.
func enterPrivateShm(dir string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("mps: private /dev/shm: unshare the mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("mps: private /dev/shm: make the namespace's mounts slaves: %w", err)
	}
	if err := unix.Mount(dir, DevShm, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mps: private /dev/shm: bind %s on %s: %w", dir, DevShm, err)
	}
	if err := unix.Mount("", DevShm, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mps: private /dev/shm: remount %s nosuid,nodev,noexec: %w", DevShm, err)
	}
	return nil
}

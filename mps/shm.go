package mps

import (
	"errors"
	"fmt"
	"io/fs"
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

// ErrShmDir wraps every reason a private /dev/shm cannot be used (its
// path is not a plain directory of this process's uid, something else is
// mounted there, the mount failed or does not show where it must).
var ErrShmDir = errors.New("mps: private /dev/shm directory")

// ErrShmNotMounted: no private /dev/shm tmpfs is mounted at the directory.
var ErrShmNotMounted = errors.New("mps: no private /dev/shm mounted")

// ShmSource is the source of every tmpfs MountShm mounts (the source field
// of /proc/<pid>/mountinfo): how a private /dev/shm is told from any other
// mount, by mpsd at its start (stale ones) and by tests cleaning up.
const ShmSource = "mpsd-shm"

// shmFlags are the mount flags of a private /dev/shm: nothing there may be
// a set-uid program, a device or an executable.
const shmFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME

// ShmMount is an instance's private /dev/shm: a tmpfs of its own at Dir,
// so what its servers, its clients and its pods write there is bounded by
// Size and never lands on the file system of the pipe directories
// (run_dir), where a full disk would keep every control daemon of the host
// from starting.
type ShmMount struct {
	// Dir is where it is mounted: ShmDirFor the instance's pipe directory.
	Dir string
	// Size bounds what its files may hold, in bytes (tmpfs rounds it up to
	// whole pages); its inodes are bounded too (ShmInodes).
	Size int64
	// NS is the mount namespace to mount it in, a path such as
	// /proc/1/ns/mnt: the one where the container runtime resolves the
	// host paths it binds into pods. Empty: the calling process's. The
	// calling process's own namespace must show the mount too (the same
	// namespace, or one that receives its mounts): the daemon's /dev/shm
	// is bound from there; MountShm unmounts it again and fails when it
	// does not.
	NS string
}

// ShmInodes is the most files and directories a private /dev/shm of size
// bytes may hold: one per page, at least 1024. tmpfs's own default (half
// the host's pages) would let a tenant pin kernel memory with empty files
// far beyond the size.
func ShmInodes(size int64) int64 { return max(size/4096, 1024) }

// MountShm mounts m's tmpfs (mode 1777 like /dev/shm itself, owned by this
// process's uid; nosuid, nodev, noexec, noatime; size and inodes bounded)
// on m.Dir, in the mount namespace m.NS, unless one is mounted there
// already: then it is reused (reused true), as after a restart of the
// daemon or of mpsd, which it outlives. The directory is made (its parent
// too) mode 0755 where missing; one already there must be a directory of
// this process's uid, never a link, and loses any group or world write
// permission (a plain private /dev/shm of an earlier mpsd was 1777): so a
// runtime that does not see the mount gives a pod a directory it cannot
// write rather than the file system below. The mount is made on the very
// directory checked here (opened without following links in m.NS, its
// inode compared), never on a path a link could redirect; something else
// mounted at m.Dir is refused (ErrShmDir), never covered.
func MountShm(m ShmMount) (reused bool, err error) {
	dir, err := shmPath(m.Dir)
	if err != nil {
		return false, err
	}
	if m.Size < 1 {
		return false, fmt.Errorf("%w: size %d for %s: want at least 1 byte", ErrShmDir, m.Size, dir)
	}
	top, err := topMountAt(dir)
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrShmDir, err)
	}
	if top != nil {
		if !top.isShm() {
			return false, fmt.Errorf("%w: %s is a mount point already (%s from %s), not a private /dev/shm: unmount it", ErrShmDir, dir, top.fstype, top.source)
		}
		return true, shmRoot(dir)
	}
	fi, err := mountPoint(dir)
	if err != nil {
		return false, err
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=1777,uid=%d,gid=%d", m.Size, ShmInodes(m.Size), os.Geteuid(), os.Getegid())
	err = inMountNS(m.NS, func() error {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s there: %w", dir, err)
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("stat %s there: %w", dir, err)
		}
		if want := fi.Sys().(*syscall.Stat_t); st.Dev != want.Dev || st.Ino != want.Ino {
			return fmt.Errorf("%s there is not the directory prepared here (the namespace does not share run_dir's file system at that path)", dir)
		}
		// Mounted on the working directory, which is the checked one.
		if err := unix.Fchdir(fd); err != nil {
			return fmt.Errorf("enter %s: %w", dir, err)
		}
		return unix.Mount(ShmSource, ".", "tmpfs", shmFlags, opts)
	})
	if err != nil {
		return false, fmt.Errorf("%w: mount a tmpfs on %s%s: %w", ErrShmDir, dir, nsText(m.NS), err)
	}
	if top, err := topMountAt(dir); err != nil || top == nil || !top.isShm() {
		uerr := inMountNS(m.NS, func() error { return unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) })
		return false, fmt.Errorf("%w: the tmpfs mounted on %s%s does not show in this process's mount namespace (mount propagation: run_dir's mount here must receive that namespace's mounts; a container needs mountPropagation: HostToContainer on it); unmounted again (%v): %v", ErrShmDir, dir, nsText(m.NS), uerr, err)
	}
	return false, shmRoot(dir)
}

func nsText(ns string) string {
	if ns == "" {
		return ""
	}
	return " in mount namespace " + ns
}

// shmPath cleans an absolute directory path.
func shmPath(dir string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("%w: %q is not an absolute path", ErrShmDir, dir)
	}
	return filepath.Clean(dir), nil
}

// mountPoint makes dir (and its parent, mode 0755) where missing and
// checks it: a directory of this process's uid, writable by no one else.
func mountPoint(dir string) (fs.FileInfo, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("%w: create the parent of %s: %w", ErrShmDir, dir, err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("%w: create %s: %w", ErrShmDir, dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrShmDir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s is a %v, not a directory", ErrShmDir, dir, fi.Mode().Type())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("%w: %s does not belong to this process's uid %d", ErrShmDir, dir, os.Geteuid())
	}
	if fi.Mode()&(0o022|fs.ModeSticky|fs.ModeSetuid|fs.ModeSetgid) != 0 {
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, fmt.Errorf("%w: chmod %s: %w", ErrShmDir, dir, err)
		}
		if fi, err = os.Lstat(dir); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrShmDir, err)
		}
	}
	return fi, nil
}

// shmRoot checks the root of a mounted private /dev/shm: this process's
// uid's, mode 1777 (set back if root changed it).
func shmRoot(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrShmDir, err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || !fi.IsDir() || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: the root of the tmpfs on %s is not a directory of uid %d", ErrShmDir, dir, os.Geteuid())
	}
	if want := fs.ModePerm | fs.ModeSticky; fi.Mode()&(fs.ModePerm|fs.ModeSticky|fs.ModeSetuid|fs.ModeSetgid) != want {
		if err := os.Chmod(dir, want); err != nil {
			return fmt.Errorf("%w: chmod %s: %w", ErrShmDir, dir, err)
		}
	}
	return nil
}

// UnmountShm unmounts the private /dev/shm on dir, in the mount namespace
// ns ("" the calling process's) and, should a copy stay in the calling
// process's, there too; then removes dir with whatever lies below it (a
// plain private /dev/shm of an earlier mpsd left files there). Memory its
// files hold is freed once no process has it mounted any more (a daemon
// or a pod that still runs keeps its own mount of it). unmounted says
// whether one was mounted. Something else mounted on dir, or below it,
// is left alone (ErrShmDir), and so is dir then. No mount and no dir is no
// error.
func UnmountShm(dir, ns string) (unmounted bool, err error) {
	if dir, err = shmPath(dir); err != nil {
		return false, err
	}
	for i := 0; ; i++ {
		top, err := topMountAt(dir)
		if err != nil {
			return unmounted, fmt.Errorf("%w: %w", ErrShmDir, err)
		}
		if top == nil {
			break
		}
		if !top.isShm() {
			return unmounted, fmt.Errorf("%w: %s: another mount (%s from %s) is on it; left as it is", ErrShmDir, dir, top.fstype, top.source)
		}
		if i == 16 {
			return unmounted, fmt.Errorf("%w: %s: still mounted after %d unmounts", ErrShmDir, dir, i)
		}
		umount := func() error { return unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) }
		err = inMountNS(ns, umount)
		if errors.Is(err, unix.EINVAL) && ns != "" {
			// Not a mount point there: a copy of this namespace's own.
			err = umount()
		}
		if err != nil {
			return unmounted, fmt.Errorf("%w: unmount %s%s: %w", ErrShmDir, dir, nsText(ns), err)
		}
		unmounted = true
	}
	ms, err := readMountinfo()
	if err != nil {
		return unmounted, fmt.Errorf("%w: %w", ErrShmDir, err)
	}
	for _, m := range ms {
		if strings.HasPrefix(m.point, dir+"/") {
			return unmounted, fmt.Errorf("%w: %s is not removed: %s is mounted below it", ErrShmDir, dir, m.point)
		}
	}
	if fi, err := os.Lstat(dir); err == nil && !fi.IsDir() {
		return unmounted, fmt.Errorf("%w: %s is a %v, not a directory; left as it is", ErrShmDir, dir, fi.Mode().Type())
	}
	if err := os.RemoveAll(dir); err != nil {
		return unmounted, fmt.Errorf("%w: remove %s: %w", ErrShmDir, dir, err)
	}
	return unmounted, nil
}

// ShmUsage is what a private /dev/shm holds.
type ShmUsage struct {
	// Size and Used are in bytes, whole pages.
	Size, Used uint64
	// Inodes is the most files it may hold, InodesFree how many more.
	Inodes, InodesFree uint64
}

// Full reports whether nothing more can be written there: no page or no
// inode left.
func (u ShmUsage) Full() bool { return u.Used >= u.Size || (u.Inodes > 0 && u.InodesFree == 0) }

// ReadShmUsage reads the usage of the tmpfs mounted on dir: ErrShmNotMounted
// when dir is no tmpfs of its own (a plain directory, even on a tmpfs such
// as /run, or nothing).
func ReadShmUsage(dir string) (ShmUsage, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return ShmUsage{}, fmt.Errorf("%w on %s: %w", ErrShmNotMounted, dir, err)
	}
	if err != nil {
		return ShmUsage{}, fmt.Errorf("%w: open %s: %w", ErrShmDir, dir, err)
	}
	defer unix.Close(fd)
	var sfs unix.Statfs_t
	var st, parent unix.Stat_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return ShmUsage{}, fmt.Errorf("%w: statfs %s: %w", ErrShmDir, dir, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return ShmUsage{}, fmt.Errorf("%w: stat %s: %w", ErrShmDir, dir, err)
	}
	if err := unix.Fstatat(fd, "..", &parent, 0); err != nil {
		return ShmUsage{}, fmt.Errorf("%w: stat the parent of %s: %w", ErrShmDir, dir, err)
	}
	if sfs.Type != unix.TMPFS_MAGIC || st.Dev == parent.Dev {
		return ShmUsage{}, fmt.Errorf("%w on %s", ErrShmNotMounted, dir)
	}
	bs := uint64(sfs.Bsize)
	return ShmUsage{Size: sfs.Blocks * bs, Used: (sfs.Blocks - sfs.Bfree) * bs, Inodes: sfs.Files, InodesFree: sfs.Ffree}, nil
}

// ResizeShm sets the size (and so the inodes, ShmInodes) of the private
// /dev/shm on dir: a running instance takes a changed size without a
// restart. The kernel refuses less than its files hold.
func ResizeShm(dir string, size int64) error {
	if err := IsShm(dir); err != nil {
		return err
	}
	if size < 1 {
		return fmt.Errorf("%w: size %d for %s: want at least 1 byte", ErrShmDir, size, dir)
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|shmFlags, fmt.Sprintf("size=%d,nr_inodes=%d", size, ShmInodes(size))); err != nil {
		return fmt.Errorf("%w: resize %s to %d bytes: %w", ErrShmDir, dir, size, err)
	}
	return nil
}

// IsShm reports (nil) whether the mount on top of dir, as this process
// sees it, is a private /dev/shm (ErrShmNotMounted when nothing is
// mounted there, ErrShmDir when something else is).
func IsShm(dir string) error {
	dir, err := shmPath(dir)
	if err != nil {
		return err
	}
	top, err := topMountAt(dir)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", ErrShmDir, err)
	case top == nil:
		return fmt.Errorf("%w on %s", ErrShmNotMounted, dir)
	case !top.isShm():
		return fmt.Errorf("%w: %s is a mount of %s from %s, not a private /dev/shm", ErrShmDir, dir, top.fstype, top.source)
	}
	return nil
}

// CleanShm empties the private /dev/shm on dir: every file and directory
// in it is removed (never through a link: os.Root), and the memory they
// held is freed once no process maps or holds them open. removed counts
// the entries of dir removed. Only a private /dev/shm is cleaned (IsShm).
func CleanShm(dir string) (removed int, err error) {
	if err := IsShm(dir); err != nil {
		return 0, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrShmDir, err)
	}
	defer root.Close()
	f, err := root.Open(".")
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrShmDir, err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("%w: list %s: %w", ErrShmDir, dir, err)
	}
	var errs []error
	for _, name := range names {
		if err := root.RemoveAll(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	if len(errs) > 0 {
		return removed, fmt.Errorf("%w: clean %s: %w", ErrShmDir, dir, errors.Join(errs...))
	}
	return removed, nil
}

// ShmMountsUnder lists the private /dev/shm mounts (ShmSource) below root,
// as this process sees them, by mount point.
func ShmMountsUnder(root string) ([]string, error) {
	root = filepath.Clean(root)
	ms, err := readMountinfo()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrShmDir, err)
	}
	var out []string
	for _, m := range ms {
		if m.isShm() && strings.HasPrefix(m.point, root+"/") && !slices.Contains(out, m.point) {
			out = append(out, m.point)
		}
	}
	slices.Sort(out)
	return out, nil
}

// PrivateShm returns a Runner that starts the control daemon (`-d`) in a
// mount namespace of its own, in which /dev/shm is a bind mount of the
// private /dev/shm m (mounted with MountShm first, or reused); every other
// command (the control client) goes to inner unchanged. The daemon forks
// its servers, which inherit the namespace: the instance's servers share
// memory through that tmpfs only, so clients reach them only with it as
// their /dev/shm — pods get it mounted there by the device plugin — and no
// tenant sees another instance's shared memory or the host's, nor can
// fill more than m.Size of memory, or any of the file system of run_dir.
// A nil inner is ExecRunner.
//
// This follows what NVIDIA's k8s-device-plugin does for its MPS daemons
// (cmd/mps-control-daemon: a tmpfs it mounts at <mps root>/shm, mounted
// into the daemon's container at /dev/shm and into every pod that uses
// MPS); mpsd has no container per daemon, so it makes the namespace
// itself, and has one tmpfs per instance, not one per node.
//
// The namespace is made on a locked OS thread: unshare(CLONE_NEWNS), every
// mount made a slave (MS_REC|MS_SLAVE: nothing mounted there propagates
// back to the host, while the host's unmounts still reach the copy, so the
// daemon never pins a filesystem the host has unmounted, as an MS_PRIVATE
// copy would), then the tmpfs bound on /dev/shm with nosuid, nodev and
// noexec. inner starts the command from that thread — os/exec forks on
// the calling thread, and the child inherits the thread's namespace — and
// the thread is never unlocked, so the runtime discards it with its
// namespace when the goroutine ends; mpsd's own threads never see the
// bind. inner must start the process on the goroutine it is called on, as
// ExecRunner does.
func PrivateShm(inner Runner, m ShmMount) Runner {
	if inner == nil {
		inner = ExecRunner{}
	}
	return privateShm{inner: inner, m: m}
}

type privateShm struct {
	inner Runner
	m     ShmMount
}

// Start implements Runner.
func (r privateShm) Start(cmd *exec.Cmd) error {
	if !slices.Contains(cmd.Args[1:], "-d") {
		return r.inner.Start(cmd)
	}
	// Whatever lies under /dev/shm is out of the daemon's sight once its
	// own is mounted there: its pipe and log directories must not.
	for what, p := range map[string]string{"private /dev/shm": r.m.Dir, "pipe directory": envValue(cmd.Env, "CUDA_MPS_PIPE_DIRECTORY"), "log directory": envValue(cmd.Env, "CUDA_MPS_LOG_DIRECTORY")} {
		if rel, err := filepath.Rel(DevShm, filepath.Clean(p)); p != "" && err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return fmt.Errorf("%w: the daemon's %s %s is under %s, which its private %s hides: put run_dir and log_dir elsewhere", ErrShmDir, what, p, DevShm, DevShm)
		}
	}
	if _, err := MountShm(r.m); err != nil {
		return err
	}
	dir := filepath.Clean(r.m.Dir)
	return onDiscardedThread(func() error {
		if err := enterPrivateShm(dir); err != nil {
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

// sameMountNS reports whether ns names the calling thread's own mount
// namespace: then it is not entered (opening another process's namespace
// may be refused where reading its name is not).
func sameMountNS(ns string) bool {
	want, err1 := os.Readlink(ns)
	own, err2 := os.Readlink("/proc/thread-self/ns/mnt")
	return err1 == nil && err2 == nil && want == own
}

// inMountNS runs fn on a thread of its own (onDiscardedThread) whose root
// and working directory are its own (CLONE_FS unshared: fn may change
// them), in the mount namespace ns: a path such as /proc/1/ns/mnt, or ""
// for the process's own.
func inMountNS(ns string, fn func() error) error {
	return onDiscardedThread(func() error {
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("unshare the thread's file system attributes: %w", err)
		}
		if ns != "" && !sameMountNS(ns) {
			fd, err := unix.Open(ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open the mount namespace %s: %w", ns, err)
			}
			defer unix.Close(fd)
			if err := unix.Setns(fd, unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("enter the mount namespace %s: %w", ns, err)
			}
		}
		return fn()
	})
}

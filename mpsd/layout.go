package mpsd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/mps"
)

// Layout owns the directories of docs/architecture.md#files-on-a-host under the configured roots,
// so every path mpsd makes comes from one place.
type Layout struct {
	RunDir   string
	LogDir   string
	StateDir string
}

// GroupRunDir is the directory that gates a group's pipe directories:
// only the group's members may enter it.
func (l Layout) GroupRunDir(group string) string { return filepath.Join(l.RunDir, group) }

// PipeDir is an instance's CUDA_MPS_PIPE_DIRECTORY. The instance is named
// by the UUID of the first GPU of its set.
func (l Layout) PipeDir(group, gpuUUID string) string {
	return filepath.Join(l.RunDir, group, gpuUUID, "pipe")
}

// ShmDir is the private /dev/shm of an instance whose group the kubelet
// device plugin serves: next to its pipe directory (mps.ShmDirFor, which
// the plugin uses to find it from the pipe directory alone).
func (l Layout) ShmDir(group, gpuUUID string) string {
	return mps.ShmDirFor(l.PipeDir(group, gpuUUID))
}

// GroupLogDir gates a group's MPS log directories as GroupRunDir gates
// its pipe directories.
func (l Layout) GroupLogDir(group string) string { return filepath.Join(l.LogDir, group) }

// InstanceLogDir is an instance's CUDA_MPS_LOG_DIRECTORY.
func (l Layout) InstanceLogDir(group, gpuUUID string) string {
	return filepath.Join(l.LogDir, group, gpuUUID)
}

// StateFile holds the persisted leases.
func (l Layout) StateFile() string { return filepath.Join(l.StateDir, "state.json") }

// errForeignDir: a directory mpsd would use is there already and not
// its own (another owner, writable by others, a symlink).
var errForeignDir = errors.New("mpsd: directory not mpsd's own")

// makeDirs makes run_dir, log_dir and state_dir where they are missing:
// state_dir 0700, the others 0755, missing parents 0755. A directory that
// exists is left exactly as it is (policy.CheckDirs has judged it): mpsd
// never changes the mode or owner of a directory it did not make.
func (l Layout) makeDirs() error {
	for _, d := range []struct {
		dir  string
		mode os.FileMode
	}{{l.RunDir, 0o755}, {l.LogDir, 0o755}, {l.StateDir, 0o700}} {
		if _, err := os.Lstat(d.dir); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(d.dir), 0o755); err != nil {
			return fmt.Errorf("create %s: %w", filepath.Dir(d.dir), err)
		}
		if err := os.Mkdir(d.dir, d.mode); err != nil {
			if errors.Is(err, fs.ErrExist) {
				continue // someone was quicker: checked again by the caller
			}
			return fmt.Errorf("create %s: %w", d.dir, err)
		}
		// Made here: the umask is mpsd's business no more than the mode.
		if err := os.Chmod(d.dir, d.mode); err != nil {
			return fmt.Errorf("chmod %s: %w", d.dir, err)
		}
	}
	return nil
}

// checkWritable tells, before anything starts, of a directory mpsd could
// not make or write as its user (makeDirs, then every pipe, log and
// state file): the directory itself when it exists, else the nearest
// ancestor that does, where makeDirs would make it.
func (l Layout) checkWritable() error {
	for _, d := range []struct{ key, dir string }{{"run_dir", l.RunDir}, {"log_dir", l.LogDir}, {"state_dir", l.StateDir}} {
		at := d.dir
		for {
			if _, err := os.Lstat(at); err == nil || !errors.Is(err, fs.ErrNotExist) {
				break
			}
			up := filepath.Dir(at)
			if up == at {
				break
			}
			at = up
		}
		if err := unix.Faccessat(unix.AT_FDCWD, at, unix.W_OK|unix.X_OK, unix.AT_EACCESS); err != nil {
			return fmt.Errorf("%s %s: mpsd (uid %d) cannot write %s (%s): run mpsd as root, or set %s: to a directory mpsd's user may write", d.key, d.dir, os.Geteuid(), at, errnoText(err), d.key)
		}
	}
	return nil
}

// ownDir checks that a directory mpsd found already there is one it
// could have made: a real directory (not a symlink), owned by mpsd's
// user, writable by neither group nor others.
func ownDir(dir string, fi fs.FileInfo) error {
	euid := os.Geteuid()
	fix := fmt.Sprintf("mpsd does not adopt a directory it did not make; remove it (rm -r %s) and start mpsd again", dir)
	if fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%w: %s is a symlink; %s", errForeignDir, dir, fix)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s is not a directory; %s", errForeignDir, dir, fix)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%w: cannot tell who owns %s", errForeignDir, dir)
	}
	if int(st.Uid) != euid {
		return fmt.Errorf("%w: %s is owned by uid %d, not mpsd's %d; %s", errForeignDir, dir, st.Uid, euid, fix)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by its group or others (mode %04o); %s", errForeignDir, dir, fi.Mode().Perm(), fix)
	}
	return nil
}

// ownShmDir is ownDir for an instance's private /dev/shm: mpsd's own, a
// real directory, either the root of its tmpfs (mps.MountShm; mode
// exactly 1777, like /dev/shm itself), an earlier mpsd's plain private
// /dev/shm (1777 too), or the directory below the tmpfs while none is
// mounted (writable by neither group nor others).
func ownShmDir(dir string, fi fs.FileInfo) error {
	if fi.Mode()&fs.ModeSymlink != 0 || !fi.IsDir() {
		return fmt.Errorf("%w: %s is not a directory; remove it (rm -r %s) and start mpsd again", errForeignDir, dir, dir)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: %s is not owned by mpsd's uid %d; remove it (rm -r %s) and start mpsd again", errForeignDir, dir, os.Geteuid(), dir)
	}
	shm := fs.ModePerm | fs.ModeSticky
	if mode := fi.Mode() & (fs.ModePerm | fs.ModeSticky | fs.ModeSetuid | fs.ModeSetgid); mode != shm && mode&(0o022|fs.ModeSticky|fs.ModeSetuid|fs.ModeSetgid) != 0 {
		return fmt.Errorf("%w: %s has mode %v, want %v (a private /dev/shm) or a directory only mpsd may write; remove it (rm -r %s) and start mpsd again", errForeignDir, dir, fi.Mode().Perm(), shm, dir)
	}
	return nil
}

// checkBelow applies ownDir to every directory (and refuses every
// symlink) up to depth levels below dir: the GPU and pipe directories MPS
// uses, which a tenant must never have made for mpsd.
func checkBelow(dir string, depth int) error {
	if depth == 0 {
		return nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range ents {
		if !e.IsDir() && e.Type()&fs.ModeSymlink == 0 {
			continue // MPS's own sockets, FIFO and files
		}
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("check %s: %w", p, err)
		}
		if depth == 1 && e.Name() == mps.ShmDirName {
			// An instance's private /dev/shm (mps.MountShm) is sticky
			// and world-writable like /dev/shm itself, and what is in it
			// is the tenants'.
			if err := ownShmDir(p, fi); err != nil {
				return err
			}
			continue
		}
		if err := ownDir(p, fi); err != nil {
			return err
		}
		if err := checkBelow(p, depth-1); err != nil {
			return err
		}
	}
	return nil
}

// prepareGroupDir makes the group's run directory mode 0750 owned by
// root (by mpsd's own user when it is not root), with a POSIX ACL granting
// its member uids and gids r-x and nobody else anything: a tenant of
// another group cannot even look up the pipe directories below it, let
// alone connect to the control socket. The ACL is rewritten on every call,
// so a membership change in the config applies without restarting the
// group's daemons. A directory already there is used only if it is
// mpsd's own (see ownDir), and so are the GPU and pipe directories below
// it; anything else is refused, never repaired.
func prepareGroupDir(dir string, uids, gids []uint32) error {
	switch err := os.Mkdir(dir, 0o750); {
	case err == nil:
		// As root the directory belongs to root; an unprivileged mpsd (a
		// simulation without cgroups) owns it itself, which the ACL allows.
		if os.Geteuid() == 0 {
			if err := os.Chown(dir, 0, 0); err != nil {
				return fmt.Errorf("chown %s: %w", dir, err)
			}
		}
		if err := os.Chmod(dir, 0o750); err != nil {
			return fmt.Errorf("chmod %s: %w", dir, err)
		}
	case errors.Is(err, fs.ErrExist):
		fi, err := os.Lstat(dir)
		if err != nil {
			return fmt.Errorf("check %s: %w", dir, err)
		}
		if err := ownDir(dir, fi); err != nil {
			return err
		}
		if err := checkBelow(dir, 2); err != nil {
			return err
		}
	default:
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return setMemberACL(dir, uids, gids)
}

// setMemberACL writes dir's access ACL: owner rwx, the member uids and
// gids r-x, nobody else anything (mode 0750 follows from it).
func setMemberACL(dir string, uids, gids []uint32) error {
	if err := unix.Setxattr(dir, "system.posix_acl_access", encodeACL(uids, gids), 0); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("set access ACL on %s: the filesystem does not support POSIX ACLs, which mpsd needs to keep groups apart (mount it with acl, or point run_dir elsewhere): %w", dir, err)
		}
		return fmt.Errorf("set access ACL on %s: %w", dir, err)
	}
	return nil
}

// guardInstanceDir makes one of an instance's directories below a group
// directory (its GPU directory, its pipe directory, its log directory)
// where missing, owned as prepareGroupDir's, and gives it the group's
// member ACL itself: a working directory or an O_PATH descriptor a
// removed member took inside it earlier then gets no further lookup
// through it, because the kernel checks search permission on the
// directory a lookup starts from, not on its ancestors. open leaves the
// directory mode 0755 with no ACL instead: the pipe directory of a group
// the kubelet device plugin serves, which pods of any uid reach through
// their bind mount (docs/cluster.md). A directory already there must be
// mpsd's own (ownDir); it is never repaired.
func guardInstanceDir(dir string, uids, gids []uint32, open bool) error {
	switch err := os.Mkdir(dir, 0o750); {
	case err == nil:
		if os.Geteuid() == 0 {
			if err := os.Chown(dir, 0, 0); err != nil {
				return fmt.Errorf("chown %s: %w", dir, err)
			}
		}
	case errors.Is(err, fs.ErrExist):
		fi, err := os.Lstat(dir)
		if err != nil {
			return fmt.Errorf("check %s: %w", dir, err)
		}
		if err := ownDir(dir, fi); err != nil {
			return err
		}
	default:
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if !open {
		return setMemberACL(dir, uids, gids)
	}
	if err := unix.Removexattr(dir, "system.posix_acl_access"); err != nil && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("remove access ACL of %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	return nil
}

// The Linux xattr form of a POSIX ACL (linux/posix_acl_xattr.h).
const (
	aclVersion   = 2
	aclUserObj   = 0x01
	aclUser      = 0x02
	aclGroupObj  = 0x04
	aclGroup     = 0x08
	aclMask      = 0x10
	aclOther     = 0x20
	aclUndefined = 0xffffffff
	permRX       = 4 | 1
	permRWX      = 4 | 2 | 1
)

// encodeACL builds owner rwx, named users and groups r-x, owning group and
// others nothing. Entries are sorted by tag and id, as the kernel requires.
func encodeACL(uids, gids []uint32) []byte {
	uids = slices.Compact(slices.Sorted(slices.Values(uids)))
	gids = slices.Compact(slices.Sorted(slices.Values(gids)))
	buf := binary.LittleEndian.AppendUint32(nil, aclVersion)
	add := func(tag, perm uint16, id uint32) {
		buf = binary.LittleEndian.AppendUint16(buf, tag)
		buf = binary.LittleEndian.AppendUint16(buf, perm)
		buf = binary.LittleEndian.AppendUint32(buf, id)
	}
	add(aclUserObj, permRWX, aclUndefined)
	for _, u := range uids {
		add(aclUser, permRX, u)
	}
	add(aclGroupObj, 0, aclUndefined)
	for _, g := range gids {
		add(aclGroup, permRX, g)
	}
	add(aclMask, permRX, aclUndefined)
	add(aclOther, 0, aclUndefined)
	return buf
}

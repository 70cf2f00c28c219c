package mpsd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/mps"
)

// Layout owns the directories of DESIGN.md §3 under the configured roots,
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

// prepareGroupDir makes the group's run directory mode 0750 owned by
// root (by mpsd's own user when it is not root), with a POSIX ACL granting
// its member uids and gids r-x and nobody else anything: a tenant of
// another group cannot even look up the pipe directories below it, let
// alone connect to the control socket. The ACL is rewritten on every call,
// so a membership change in the config applies without restarting the
// group's daemons.
func prepareGroupDir(dir string, uids, gids []uint32) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
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
	if err := unix.Setxattr(dir, "system.posix_acl_access", encodeACL(uids, gids), 0); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("set access ACL on %s: the filesystem does not support POSIX ACLs, which mpsd needs to keep groups apart (mount it with acl, or point run_dir elsewhere): %w", dir, err)
		}
		return fmt.Errorf("set access ACL on %s: %w", dir, err)
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

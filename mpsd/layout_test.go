package mpsd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// ltACLEntry is one entry of a POSIX ACL in its xattr form.
type ltACLEntry struct {
	tag, perm uint16
	id        uint32
}

// ltDecodeACL parses the xattr form encodeACL writes.
func ltDecodeACL(t *testing.T, b []byte) []ltACLEntry {
	t.Helper()
	if len(b) < 4 || (len(b)-4)%8 != 0 {
		t.Fatalf("ACL of %d bytes: not a version header and 8-byte entries", len(b))
	}
	if v := binary.LittleEndian.Uint32(b); v != aclVersion {
		t.Fatalf("ACL version %d, want %d", v, aclVersion)
	}
	var out []ltACLEntry
	for p := b[4:]; len(p) > 0; p = p[8:] {
		out = append(out, ltACLEntry{
			tag:  binary.LittleEndian.Uint16(p),
			perm: binary.LittleEndian.Uint16(p[2:]),
			id:   binary.LittleEndian.Uint32(p[4:]),
		})
	}
	return out
}

func TestEncodeACL(t *testing.T) {
	uids := []uint32{64002, 64001, 64002}
	gids := []uint32{700, 5, 700}
	got := ltDecodeACL(t, encodeACL(uids, gids))
	want := []ltACLEntry{
		{aclUserObj, permRWX, aclUndefined},
		{aclUser, permRX, 64001},
		{aclUser, permRX, 64002},
		{aclGroupObj, 0, aclUndefined},
		{aclGroup, permRX, 5},
		{aclGroup, permRX, 700},
		{aclMask, permRX, aclUndefined},
		{aclOther, 0, aclUndefined},
	}
	if !slices.Equal(got, want) {
		t.Errorf("encodeACL(%v, %v) =\n%v\nwant (sorted, unique, owner rwx, members r-x, nobody else anything)\n%v", uids, gids, got, want)
	}
	if !slices.Equal(uids, []uint32{64002, 64001, 64002}) || !slices.Equal(gids, []uint32{700, 5, 700}) {
		t.Errorf("encodeACL changed its arguments: %v %v", uids, gids)
	}
	// No members: only the owner; still an extended ACL (a mask), so the
	// kernel stores it rather than folding it into the mode.
	got = ltDecodeACL(t, encodeACL(nil, nil))
	want = []ltACLEntry{
		{aclUserObj, permRWX, aclUndefined},
		{aclGroupObj, 0, aclUndefined},
		{aclMask, permRX, aclUndefined},
		{aclOther, 0, aclUndefined},
	}
	if !slices.Equal(got, want) {
		t.Errorf("encodeACL(nil, nil) = %v, want %v", got, want)
	}
}

// ltDir is a directory test uids can reach: t.TempDir's are 0700.
func ltDir(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: chown to root, ACLs and test uids")
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// ltPrepare runs prepareGroupDir, skipping where the filesystem has no ACLs.
func ltPrepare(t *testing.T, dir string, uids, gids []uint32) {
	t.Helper()
	if err := prepareGroupDir(dir, uids, gids); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			t.Skipf("no POSIX ACLs on %s: %v", dir, err)
		}
		t.Fatalf("prepareGroupDir: %v", err)
	}
}

func ltReadACL(t *testing.T, dir string) []byte {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Getxattr(dir, "system.posix_acl_access", buf)
	if err != nil {
		t.Fatalf("getxattr %s: %v", dir, err)
	}
	return buf[:n]
}

// ltCanEnter reports whether a process with these credentials can look into
// dir (list it and reach what is below it).
func ltCanEnter(t *testing.T, dir string, uid uint32, groups ...uint32) bool {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", `ls "$1" >/dev/null && test -d "$1/sub" && cd "$1"`, "sh", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: groups}}
	out, err := cmd.CombinedOutput()
	if err == nil {
		return true
	}
	if _, ok := err.(*exec.ExitError); !ok {
		t.Fatalf("run as uid %d: %v", uid, err)
	}
	if !bytes.Contains(out, []byte("Permission denied")) {
		t.Errorf("uid %d on %s: %v, not for want of permission: %s", uid, dir, err, out)
	}
	return false
}

func ltCheckModeOwner(t *testing.T, dir string) {
	t.Helper()
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o750 || !fi.IsDir() || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("%s: mode %v owner %d:%d, want drwxr-x--- root:root", dir, fi.Mode(), st.Uid, st.Gid)
	}
}

// The group directory lets its members (by uid or by unix group) in and
// nobody else, and a rewrite with other members replaces the ACL.
func TestPrepareGroupDir(t *testing.T) {
	dir := filepath.Join(ltDir(t), "g")
	ltPrepare(t, dir, []uint32{64004, 64005}, []uint32{64006})
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	ltCheckModeOwner(t, dir)
	if got, want := ltReadACL(t, dir), encodeACL([]uint32{64004, 64005}, []uint32{64006}); !bytes.Equal(got, want) {
		t.Errorf("ACL read back\n%v\nwant\n%v", ltDecodeACL(t, got), ltDecodeACL(t, want))
	}
	for _, c := range []struct {
		uid    uint32
		groups []uint32
		want   bool
	}{
		{64004, nil, true},
		{64005, nil, true},
		{64007, []uint32{64006}, true}, // by supplementary group
		{64006, nil, true},             // by primary gid (asUID's gid is the uid)
		{64008, nil, false},
		{64009, []uint32{0}, false}, // root's group gets nothing: group entry is ---
	} {
		if got := ltCanEnter(t, dir, c.uid, c.groups...); got != c.want {
			t.Errorf("uid %d groups %v can enter: %v, want %v", c.uid, c.groups, got, c.want)
		}
	}

	// A membership change: 64005 and the unix group leave, 64008 joins.
	ltPrepare(t, dir, []uint32{64008, 64004}, nil)
	ltCheckModeOwner(t, dir)
	if got, want := ltReadACL(t, dir), encodeACL([]uint32{64004, 64008}, nil); !bytes.Equal(got, want) {
		t.Errorf("ACL after rewrite\n%v\nwant\n%v", ltDecodeACL(t, got), ltDecodeACL(t, want))
	}
	for uid, want := range map[uint32]bool{64004: true, 64008: true, 64005: false, 64007: false} {
		groups := []uint32{}
		if uid == 64007 {
			groups = []uint32{64006}
		}
		if got := ltCanEnter(t, dir, uid, groups...); got != want {
			t.Errorf("after rewrite uid %d groups %v can enter: %v, want %v", uid, groups, got, want)
		}
	}
}

// A group directory, or a GPU or pipe directory below it, that exists
// with another owner, an open mode or as a symlink (made by someone else)
// is refused and left exactly as it was: never chmodded, chowned or given
// the ACL. One of mpsd's own from an earlier run is reused.
func TestPrepareGroupDirRefusesForeign(t *testing.T) {
	type node struct {
		rel  string
		mode os.FileMode
		uid  int
	}
	for _, tc := range []struct {
		name  string
		nodes []node
		want  string // "" = accepted
	}{
		{"own from an earlier run", []node{{"g", 0o750, 0}, {"g/GPU-1", 0o755, 0}, {"g/GPU-1/pipe", 0o755, 0}}, ""},
		{"group dir of another uid", []node{{"g", 0o777, 64210}}, "is owned by uid 64210"},
		{"group-writable group dir", []node{{"g", 0o770, 0}}, "writable by its group or others"},
		{"pipe dir of another uid", []node{{"g", 0o750, 0}, {"g/GPU-1", 0o755, 0}, {"g/GPU-1/pipe", 0o755, 64211}}, "pipe is owned by uid 64211"},
		{"world-writable GPU dir", []node{{"g", 0o750, 0}, {"g/GPU-1", 0o777, 0}}, "GPU-1 is writable by its group or others"},
		{"an instance's private /dev/shm", []node{{"g", 0o750, 0}, {"g/GPU-1", 0o755, 0}, {"g/GPU-1/pipe", 0o755, 0}, {"g/GPU-1/shm", 0o777 | os.ModeSticky, 0}}, ""},
		{"shm dir without the sticky bit", []node{{"g", 0o750, 0}, {"g/GPU-1", 0o755, 0}, {"g/GPU-1/shm", 0o777, 0}}, "want trwxrwxrwx"},
		{"shm dir of another uid", []node{{"g", 0o750, 0}, {"g/GPU-1", 0o755, 0}, {"g/GPU-1/shm", 0o777 | os.ModeSticky, 64212}}, "is not owned by mpsd's uid"},
		{"world-writable dir named shm one level up", []node{{"g", 0o750, 0}, {"g/shm", 0o777 | os.ModeSticky, 0}}, "shm is writable by its group or others"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := ltDir(t)
			for _, n := range tc.nodes {
				p := filepath.Join(base, n.rel)
				if err := os.Mkdir(p, n.mode); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(p, n.mode); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(p, n.uid, n.uid); err != nil {
					t.Fatal(err)
				}
			}
			dir := filepath.Join(base, "g")
			before, _ := os.Lstat(dir)
			err := prepareGroupDir(dir, []uint32{64212}, nil)
			if errors.Is(err, unix.EOPNOTSUPP) {
				t.Skipf("no POSIX ACLs: %v", err)
			}
			if tc.want == "" {
				if err != nil {
					t.Fatalf("prepareGroupDir: %v", err)
				}
				ltCheckModeOwner(t, dir)
				return
			}
			if !errors.Is(err, errForeignDir) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "rm -r") {
				t.Fatalf("prepareGroupDir = %v; want errForeignDir with %q and the fix", err, tc.want)
			}
			after, _ := os.Lstat(dir)
			if after.Mode() != before.Mode() || after.Sys().(*syscall.Stat_t).Uid != before.Sys().(*syscall.Stat_t).Uid {
				t.Errorf("refused directory changed: mode %v uid %d, was %v uid %d", after.Mode(), after.Sys().(*syscall.Stat_t).Uid, before.Mode(), before.Sys().(*syscall.Stat_t).Uid)
			}
			if b, _ := unix.Getxattr(dir, "system.posix_acl_access", make([]byte, 256)); b > 0 {
				t.Errorf("refused directory got an ACL")
			}
		})
	}
}

// A symlink where the group directory goes is refused, and its target
// left alone.
func TestPrepareGroupDirRefusesSymlink(t *testing.T) {
	base := ltDir(t)
	target := filepath.Join(base, "elsewhere")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "g")
	if err := os.Symlink(target, dir); err != nil {
		t.Fatal(err)
	}
	if err := prepareGroupDir(dir, []uint32{64212}, nil); !errors.Is(err, errForeignDir) || !strings.Contains(err.Error(), "is a symlink") {
		t.Fatalf("prepareGroupDir on a symlink = %v; want errForeignDir", err)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o755 {
		t.Errorf("symlink target's mode changed to %v", fi.Mode())
	}
}

// With no members nobody but root gets in.
func TestPrepareGroupDirNoMembers(t *testing.T) {
	dir := filepath.Join(ltDir(t), "g")
	ltPrepare(t, dir, nil, nil)
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	ltCheckModeOwner(t, dir)
	if ltCanEnter(t, dir, 64004) {
		t.Error("uid 64004 can enter a group directory with no members")
	}
}

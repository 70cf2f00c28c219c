package mpsd

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// An instance directory gets the group's ACL itself (made where missing,
// rewritten on a membership change), so a removed member cannot enter
// it; an open one (a pipe directory the device plugin serves) is 0755
// without an ACL; a foreign one is refused untouched.
func TestGuardInstanceDir(t *testing.T) {
	dir := filepath.Join(ltDir(t), "g")
	ltPrepare(t, dir, []uint32{64004, 64005}, nil)
	gpuDir := filepath.Join(dir, "GPU-x")
	if err := guardInstanceDir(gpuDir, []uint32{64004, 64005}, nil, false); err != nil {
		t.Fatal(err)
	}
	ltCheckModeOwner(t, gpuDir)
	if got, want := ltReadACL(t, gpuDir), encodeACL([]uint32{64004, 64005}, nil); !bytes.Equal(got, want) {
		t.Errorf("ACL\n%v\nwant\n%v", ltDecodeACL(t, got), ltDecodeACL(t, want))
	}
	// 64005 leaves.
	if err := guardInstanceDir(gpuDir, []uint32{64004}, nil, false); err != nil {
		t.Fatal(err)
	}
	if got, want := ltReadACL(t, gpuDir), encodeACL([]uint32{64004}, nil); !bytes.Equal(got, want) {
		t.Errorf("ACL after the change\n%v\nwant\n%v", ltDecodeACL(t, got), ltDecodeACL(t, want))
	}

	pipe := filepath.Join(gpuDir, "pipe")
	if err := guardInstanceDir(pipe, []uint32{64004}, nil, false); err != nil {
		t.Fatal(err)
	}
	if err := guardInstanceDir(pipe, []uint32{64004}, nil, true); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(pipe)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Errorf("open pipe directory mode %v, want 0755", fi.Mode().Perm())
	}
	if _, err := unix.Getxattr(pipe, "system.posix_acl_access", make([]byte, 256)); !errors.Is(err, unix.ENODATA) {
		t.Errorf("open pipe directory still has an access ACL (%v)", err)
	}

	foreign := filepath.Join(dir, "GPU-y")
	if err := os.Mkdir(foreign, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(foreign, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := guardInstanceDir(foreign, []uint32{64004}, nil, false); !errors.Is(err, errForeignDir) {
		t.Errorf("guardInstanceDir on a 0777 directory = %v, want errForeignDir", err)
	}
	if fi, _ := os.Stat(foreign); fi.Mode().Perm() != 0o777 {
		t.Errorf("refused directory now mode %v", fi.Mode().Perm())
	}
}

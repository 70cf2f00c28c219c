package cgroup

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// CheckCreate makes the parent where it is missing, makes and removes a
// cgroup under it in every hierarchy a lease uses, and leaves nothing but
// the parent; a concurrent manager's Unowned never names the probe.
func TestCheckCreate(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		m := newManager(t, b)
		if err := m.CheckCreate(); err != nil {
			t.Fatalf("CheckCreate as root: %v", err)
		}
		for _, d := range m.dirs(m.parent) {
			ents, err := os.ReadDir(d.path)
			if err != nil {
				t.Fatalf("%s: parent %s after CheckCreate: %v", d.hierarchy, d.path, err)
			}
			for _, e := range ents {
				if e.IsDir() {
					t.Errorf("%s: %s left under the parent", d.hierarchy, filepath.Join(d.path, e.Name()))
				}
			}
		}
		// A probe seen mid-way by another owner is not "not ours".
		cfg := b.cfg
		cfg.Parent, cfg.Owner, cfg.Logger = m.parent, "aaaa0001", discardLogger()
		other, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		probe := filepath.Join(m.ParentDir(), probePrefix+"1")
		if err := os.Mkdir(probe, 0o755); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = syscall.Rmdir(probe) }()
		if got, err := other.Unowned(); err != nil || len(got) != 0 {
			t.Errorf("Unowned() = %v, %v while a probe exists; want nothing", got, err)
		}
	})
}

// A user that may not write the cgroup tree gets an error that wraps
// EACCES and names the directory.
func TestCheckCreateNotPermitted(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		m := newManager(t, b)
		// Drop to an unprivileged fsuid on this thread only: mkdir in
		// cgroupfs is then checked like an ordinary user's.
		errc := make(chan error, 1)
		go func() {
			// The thread ends with the goroutine (never unlocked): its
			// changed fsuid is never reused.
			runtime.LockOSThread()
			if _, _, e := syscall.RawSyscall(syscall.SYS_SETFSUID, 64751, 0, 0); e != 0 {
				errc <- e
				return
			}
			errc <- m.CheckCreate()
		}()
		err := <-errc
		if !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), m.ParentDir()) {
			t.Fatalf("CheckCreate as uid 64751 = %v; want EACCES naming %s", err, m.ParentDir())
		}
	})
}

package emutest

import (
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"testing"

	"github.com/mpsd/mpsd/internal/testrun"
)

// UserPrefix starts the name of every user User creates.
const UserPrefix = "mpsdt"

// User creates a real unprivileged user for the test: name UserPrefix+uid,
// uid and primary gid uid (a group of the same name), no home, no login
// shell, no supplementary groups. It is removed, with its group, when the
// test ends. It needs root (the test is skipped, saying so, without it)
// and fails the test if the uid or the name belongs to anyone else: it
// never touches an account it did not create.
func User(tb testing.TB, uid uint32) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("creating a test user needs root")
	}
	name := UserPrefix + strconv.FormatUint(uint64(uid), 10)
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil && u.Username != name {
		tb.Fatalf("uid %d belongs to %q on this host; pick another test uid", uid, u.Username)
	}
	if g, err := user.LookupGroupId(id); err == nil && g.Name != name {
		tb.Fatalf("gid %d belongs to group %q on this host; pick another test uid", uid, g.Name)
	}
	// One an interrupted run left behind is ours by its name and uid.
	removeUser(name)
	// The run's leftover check looks for it (internal/testrun).
	if err := testrun.RecordUser(name); err != nil {
		tb.Fatal(err)
	}
	run := func(args ...string) {
		tb.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			tb.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("groupadd", "--gid", id, name)
	tb.Cleanup(func() { removeUser(name) })
	run("useradd", "--uid", id, "--gid", id, "--no-create-home", "--no-user-group", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name)
	return name
}

// removeUser deletes the test user and group name, if there.
func removeUser(name string) {
	if _, err := user.Lookup(name); err == nil {
		_ = exec.Command("userdel", name).Run()
	}
	if _, err := user.LookupGroup(name); err == nil {
		_ = exec.Command("groupdel", name).Run()
	}
}

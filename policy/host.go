package policy

import (
	"fmt"
	"os/user"
	"strconv"
	"strings"
)

// GPU is what policy needs of one GPU of the host inventory; gpu/ provides
// it and mpsd copies it here, so decisions never touch NVML.
type GPU struct {
	// Index is the NVML index.
	Index int
	// UUID is the NVML UUID, "GPU-…".
	UUID string
	// Memory is the total memory in bytes, as NVML reports it.
	Memory int64
}

// Users resolves the names a config gives for users and unix groups. The
// production implementation is SystemUsers; tests use a fake.
type Users interface {
	// UserID returns the uid of a user name.
	UserID(name string) (uint32, error)
	// GroupID returns the gid of a unix group name.
	GroupID(name string) (uint32, error)
}

// SystemUsers resolves names through the host's user database (os/user:
// /etc/passwd and /etc/group, or NSS with cgo).
type SystemUsers struct{}

var _ Users = SystemUsers{}

// UserID looks the user up; the error wraps user.UnknownUserError when
// there is no such user.
func (SystemUsers) UserID(name string) (uint32, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return 0, fmt.Errorf("policy: look up user %q: %w", name, err)
	}
	return parseID(u.Uid)
}

// GroupID looks the group up; the error wraps user.UnknownGroupError when
// there is no such group.
func (SystemUsers) GroupID(name string) (uint32, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("policy: look up group %q: %w", name, err)
	}
	return parseID(g.Gid)
}

func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("policy: id %q from the user database: %w", s, err)
	}
	return uint32(n), nil
}

// Host is what a config is checked against beyond its own text.
type Host struct {
	// GPUs is the host's GPU inventory. Nil skips the checks that need it
	// (selectors naming real GPUs, memory budgets fitting the cards) and
	// leaves Group.Instances nil; an empty, non-nil slice is a host
	// without GPUs, on which every group fails.
	GPUs []GPU
	// Users resolves user and group names; nil means SystemUsers.
	Users Users
	// Driver is the NVIDIA driver's version as NVML reports it
	// ("550.163.01"; with --simulate, the simulated model's). Empty (or
	// unparsable) skips the checks that need it: what the driver's MPS
	// can run (multiuser groups need MultiuserDriver or newer).
	Driver string
}

// MultiuserDriver is the oldest driver whose MPS control daemon takes
// -multiuser-server, which a group with multiuser: true needs: a 550
// daemon does not know the flag (it runs "-d -multiuser-server" as a
// client and fails with "Cannot find MPS control daemon process"), so
// such an instance could never start.
const MultiuserDriver = 555

// DriverMajor is the major of a driver version ("550.163.01": 550), or
// 0 when it has none.
func DriverMajor(v string) int {
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	if err != nil || n <= 0 || major != strconv.Itoa(n) {
		return 0
	}
	return n
}

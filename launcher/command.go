package launcher

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/mpsd/mpsd/api"
)

// lookPath resolves the command name as a shell would, against the
// caller's PATH (not this process's: Run may be given another
// environment). A name with a slash is taken as a path. Searching PATH,
// the first executable match wins; if there are matches but none is
// executable the error wraps ErrNotExecutable (the shell's 126), if none
// ErrCommandNotFound (127).
func lookPath(name, pathEnv string) (string, error) {
	if strings.Contains(name, "/") {
		if err := executable(name); err != nil {
			return "", err
		}
		return name, nil
	}
	var denied error
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "." // an empty PATH entry means the working directory
		}
		p := filepath.Join(dir, name)
		err := executable(p)
		if err == nil {
			if !filepath.IsAbs(p) && !strings.HasPrefix(p, ".") {
				p = "./" + p // keep it a path, not a name to search again
			}
			return p, nil
		}
		if errors.Is(err, ErrNotExecutable) && denied == nil {
			denied = err
		}
	}
	if denied != nil {
		return "", denied
	}
	return "", fmt.Errorf("%w: %s", ErrCommandNotFound, name)
}

// executable says why p cannot be executed by this process, or nil.
func executable(p string) error {
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w: %s", ErrCommandNotFound, p)
	case err != nil:
		return fmt.Errorf("%w: %w", ErrNotExecutable, err)
	case fi.IsDir():
		return fmt.Errorf("%w: %s is a directory", ErrNotExecutable, p)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%w: %s is not a regular file", ErrNotExecutable, p)
	}
	if err := unix.Faccessat(unix.AT_FDCWD, p, unix.X_OK, unix.AT_EACCESS); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrNotExecutable, p, err)
	}
	return nil
}

// childEnv is the command's environment for a run of lease: the caller's
// environment with the lease's variables added, each replacing the
// caller's value of the same name, and MPSD_LEASE_ID, MPSD_GROUP and
// MPSD_ATTEMPT taken from the lease itself so they always match the run.
// The trampoline's own variable is dropped so a nested mps-launch behaves.
//
// With pinGPUs (the request named its GPUs, as a Slurm job does) the
// command's CUDA_VISIBLE_DEVICES becomes the lease's GPU UUIDs: the
// caller's value names GPUs of the host (Slurm's indexes), but a client of
// an MPS server enumerates only that server's GPUs, so an index such as 1
// would select no device there. UUIDs mean the same GPU in both.
func childEnv(caller []string, lease *api.Lease, pinGPUs bool) []string {
	set := make(map[string]string, len(lease.Env)+4)
	for k, v := range lease.Env {
		set[k] = v
	}
	if pinGPUs && len(lease.GPUUUIDs) > 0 {
		set[EnvVisibleDevices] = strings.Join(lease.GPUUUIDs, ",")
	}
	set[api.EnvLeaseID] = lease.ID
	set[api.EnvGroup] = lease.Group
	set[api.EnvAttempt] = strconv.Itoa(lease.Attempt)

	env := make([]string, 0, len(caller)+len(set))
	for _, kv := range caller {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; ok || k == trampolineEnv {
			continue
		}
		env = append(env, kv)
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.Sort(keys) // a stable order makes runs comparable
	for _, k := range keys {
		env = append(env, k+"="+set[k])
	}
	return env
}

// getenv looks name up in an environment list; the first entry wins, as
// in libc's getenv and Go's os.Getenv.
func getenv(env []string, name string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

// exitStatus maps a finished process to mps-launch's exit status: its own
// exit code, or 128+N when signal N killed it (the shell's convention).
func exitStatus(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

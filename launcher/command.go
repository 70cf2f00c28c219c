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
	"github.com/mpsd/mpsd/internal/mpsenv"
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
// The command's CUDA_VISIBLE_DEVICES is the lease's GPU UUIDs (mpsd sets
// it in the lease's environment; from a lease without it, mps-launch takes
// GPUUUIDs): the caller's value names GPUs of the host (Slurm's indexes),
// but a client of an MPS server enumerates only that server's GPUs, so an
// index such as 1 would select no device there, and the lease's
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT entries are ordinals of the devices it
// names: a list that makes one of them name a device the client cannot see
// makes MPS drop every pinned limit. The caller's value stays only when the
// lease names no GPU.
//
// conflicts lists, as "NAME=value", the caller's MPS variables that the
// lease's replaced with another value (see startCommand).
func childEnv(caller []string, lease *api.Lease) (env, conflicts []string) {
	set := make(map[string]string, len(lease.Env)+4)
	for k, v := range lease.Env {
		set[k] = v
	}
	if _, ok := set[EnvVisibleDevices]; !ok && len(lease.GPUUUIDs) > 0 {
		set[EnvVisibleDevices] = strings.Join(lease.GPUUUIDs, ",")
	}
	set[api.EnvLeaseID] = lease.ID
	set[api.EnvGroup] = lease.Group
	set[api.EnvAttempt] = strconv.Itoa(lease.Attempt)

	env = make([]string, 0, len(caller)+len(set))
	seen := map[string]bool{}
	for _, kv := range caller {
		k, v, _ := strings.Cut(kv, "=")
		if lv, ok := set[k]; ok {
			if slices.Contains(mpsenv.Names, k) && v != lv && !seen[k] {
				conflicts = append(conflicts, kv)
			}
			seen[k] = true
			continue
		}
		if k == trampolineEnv {
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
	return env, conflicts
}

// startCommand releases trampoline c to exec the command of a run of
// lease, in childEnv's environment. A caller's MPS variable the lease
// replaced is reported on stderr, once per run (but CUDA_VISIBLE_DEVICES
// when the request's GPUs came from it): the command runs with the
// lease's. If the environment would still let MPS run the command without
// its limits (mpsenv.Check: no pipe directory, a memory limit naming a
// device the command does not see), the command is not started: the error
// wraps ErrUnsafeEnv.
func (s *session) startCommand(c *child, lease *api.Lease) error {
	env, conflicts := childEnv(s.cfg.Environ, lease)
	if err := mpsenv.Check(mpsenv.Lookup(env)); err != nil {
		return fmt.Errorf("%w: lease %s: %w", ErrUnsafeEnv, lease.ID, err)
	}
	if err := checkShare(env, lease, s.req.Procs); err != nil {
		return fmt.Errorf("%w: lease %s: %w", ErrUnsafeEnv, lease.ID, err)
	}
	for _, kv := range conflicts {
		k, _, _ := strings.Cut(kv, "=")
		if k == EnvVisibleDevices && len(s.req.GPUSelect) > 0 {
			// The request's GPUs were read from it (Slurm's): the lease's
			// UUIDs are the same GPUs, named as the client sees them.
			continue
		}
		fmt.Fprintf(s.errw, "%signoring %s from the environment: the lease sets %s=%s\n", s.prefix(), kv, k, getenv(env, k))
	}
	return c.start(env)
}

// checkShare holds a command of procs processes (--procs) to its part of
// the lease's share: the lease must be one of that many processes and
// give each at most its SM divided by them (mpsenv.WorkerPercentage); a
// lease that did not divide it would let the processes together take
// procs times the share. Nothing to check for one process. Errors wrap
// mpsenv.ErrFallsOpen.
func checkShare(env []string, lease *api.Lease, procs int) error {
	if procs <= 1 {
		return nil
	}
	if lease.Procs != procs {
		return fmt.Errorf("%w: the lease divides its share among %d processes, not the %d of --procs", mpsenv.ErrFallsOpen, max(lease.Procs, 1), procs)
	}
	pct, err := mpsenv.WorkerPercentage(lease.SM, procs)
	if err != nil {
		return fmt.Errorf("%w: %w", mpsenv.ErrFallsOpen, err)
	}
	return mpsenv.CheckShare(mpsenv.Lookup(env), pct)
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

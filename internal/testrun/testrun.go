// Package testrun ties what a test run starts to that run, so that the
// check after it looks at exactly those things and at nothing else on the
// host: not a production mpsd, not another user's MPS daemons, not a
// second test run going on at the same time.
//
// A run is a directory, its ledger, named by EnvRun (make test's runner,
// cmd/testrun, makes it and sets the variable, and EnvEmuRun to the same,
// for every process of the run). What belongs to the run:
//
//   - every process whose environment carries either variable with the
//     run's value (processes inherit it; mpsd passes MPSEMU_* on to the
//     MPS daemons it starts, so EnvEmuRun reaches those);
//   - every process the ledger names (Start records it), every process
//     whose working directory, environment values or command line lie in
//     a directory the ledger names (MkdirTemp records it: the MPS daemons
//     of a test's pipe directory, Slurm's daemons of its spool), and every
//     process in a cgroup named for the run (CgroupName);
//   - those directories, those cgroups, and the test users the ledger
//     names (RecordUser).
//
// Start also makes a started process die with the test process (its
// parent-death signal), so an interrupted test leaves none behind.
// Outside a run (a plain go test) nothing is recorded and CgroupName uses
// a tag of the process's own.
package testrun

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	// EnvRun names the run's directory in every process of the run.
	EnvRun = "MPSD_TEST_RUN"
	// EnvEmuRun is EnvRun under a name mpsd passes to the MPS daemons it
	// starts (it passes the emulator's MPSEMU_* variables and no others).
	EnvEmuRun = "MPSEMU_TEST_RUN"
	// ledgerFile, in the run's directory, lists what the run made: one
	// "<kind> <value>" line each.
	ledgerFile = "ledger"
	// dirPrefix starts the name of a run's directory; the rest is its tag.
	dirPrefix = "mpsd-test-run-"
	// CgroupPrefix starts the name of every cgroup a test makes.
	CgroupPrefix = "mpsd-test-"
)

// Kinds of ledger entries.
const (
	kindDir       = "dir"       // a directory the run made
	kindUser      = "user"      // a user the run made
	kindPID       = "pid"       // "PID STARTTIME": a process the run started
	kindPreexists = "preexists" // a path that existed before the run
)

// Dir is the run's directory, or "" outside a run.
func Dir() string { return os.Getenv(EnvRun) }

var (
	ownTagOnce sync.Once
	ownTag     string
)

// Tag is a short name of the run, part of the names of the cgroups it
// makes; outside a run, one random per process.
func Tag() string {
	if t, ok := tagOf(Dir()); ok {
		return t
	}
	ownTagOnce.Do(func() { ownTag = "p" + randomHex(3) })
	return ownTag
}

func tagOf(dir string) (string, bool) {
	t, ok := strings.CutPrefix(filepath.Base(dir), dirPrefix)
	return t, ok && dir != "" && t != ""
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// CgroupName is a name for a cgroup parent a test makes: CgroupPrefix, the
// run's tag, then what, joined by dashes.
func CgroupName(what string) string { return CgroupPrefix + Tag() + "-" + what }

// Env returns env with the run's variables added, for a process started
// with an environment of its own (exec.Cmd.Env set): it stays tied to the
// run. Outside a run it returns env.
func Env(env []string) []string {
	dir := Dir()
	if dir == "" {
		return env
	}
	return append(env[:len(env):len(env)], EnvRun+"="+dir, EnvEmuRun+"="+dir)
}

// MkdirTemp is os.MkdirTemp, recording the directory in the run's ledger.
func MkdirTemp(dir, pattern string) (string, error) {
	d, err := os.MkdirTemp(dir, pattern)
	if err != nil {
		return "", err
	}
	if err := record(kindDir, d); err != nil {
		_ = os.Remove(d)
		return "", err
	}
	return d, nil
}

// RecordUser records a user the test is about to create.
func RecordUser(name string) error { return record(kindUser, name) }

// record appends an entry to the run's ledger; outside a run it does
// nothing. Lines are short and written with O_APPEND, one write each, so
// the test processes of a run can record at the same time.
func record(kind, value string) error {
	dir := Dir()
	if dir == "" {
		return nil
	}
	if strings.ContainsAny(value, "\n") {
		return fmt.Errorf("testrun: %s %q: a newline cannot be recorded", kind, value)
	}
	f, err := os.OpenFile(filepath.Join(dir, ledgerFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("testrun: ledger of run %s: %w", dir, err)
	}
	_, err = f.WriteString(kind + " " + value + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("testrun: ledger of run %s: %w", dir, err)
	}
	return nil
}

// Start starts cmd so that it dies with this process: its parent-death
// signal is SIGKILL, and it is recorded in the run's ledger. The kernel
// sends the parent-death signal when the *thread* that forked the child
// ends, and the Go runtime ends threads (a goroutine that exits while
// locked to its thread ends it; package mps does that on purpose), so the
// fork happens on a thread locked for the purpose, which stays locked, in
// a goroutine that waits (without reaping: cmd.Wait still does that) for
// the process to end. cmd.SysProcAttr is kept, Pdeathsig set in it.
func Start(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		pid := cmd.Process.Pid
		started <- recordPID(pid)
		// Not waited for before Start returns to the caller, so pid is
		// still this child, if only as a zombie; after cmd.Wait reaped
		// it, waitid fails at once (ECHILD).
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	if err := <-started; err != nil {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		return fmt.Errorf("testrun: start %s: %w", cmd.Path, err)
	}
	return nil
}

func recordPID(pid int) error {
	st, err := startTime(pid)
	if err != nil {
		return err
	}
	return record(kindPID, strconv.Itoa(pid)+" "+st)
}

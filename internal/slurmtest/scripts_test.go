package slurmtest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
)

// scriptDir is examples/slurm, from this package's directory.
const scriptDir = "../../examples/slurm"

// runScript runs an examples/slurm script as slurmd does: by its path,
// with only the variables Slurm sets (no PATH) and the given settings.
func runScript(t *testing.T, dir, name string, env ...string) (code int, stderr string) {
	t.Helper()
	path, err := filepath.Abs(filepath.Join(scriptDir, name))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path)
	cmd.Env = append([]string{markerEnv + "=" + dir, "SLURM_SCRIPT_CONTEXT=" + strings.TrimSuffix(name, ".sh") + "_slurmd"}, env...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err = cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run %s: %v", name, err)
	}
	return cmd.ProcessState.ExitCode(), errb.String()
}

// TestPrologEpilog runs examples/slurm/prolog.sh and epilog.sh against a
// live mpsd, a drained one, one holding a job's lease, a stopped one, and
// on a node without mpsd, and checks the exit statuses Slurm acts on (any
// but 0 drains the node) and the line each failure leaves in slurmd's log.
func TestPrologEpilog(t *testing.T) {
	dir := shortDir(t)
	e := startMpsd(t, dir, fmt.Sprintf("  slurm:\n    users: [\"%d\"]\n    sm_percent: 100\n    memory: 8G\n", os.Geteuid()))
	mpsctl := filepath.Join(e.bin, "mpsctl")
	live := []string{"MPSD_CONFIG=" + e.cfgPath, "MPSD_SOCKET=" + e.socket, "MPSCTL=" + mpsctl, "MPSD_SLURM_ENV=" + dir + "/none.env"}
	with := func(env []string, kv ...string) []string { return append(append([]string(nil), env...), kv...) }
	settings := filepath.Join(dir, "slurm.env")
	if err := os.WriteFile(settings, []byte(strings.Join(live[:3], "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadSock := filepath.Join(dir, "dead.sock")
	dead := with(live, "MPSD_SOCKET="+deadSock, "MPSD_CHECK_WAIT=1")

	type tc struct {
		name   string
		script string
		env    []string
		code   int
		stderr string // a substring; "" wants none
	}
	check := func(t *testing.T, c tc) {
		t.Helper()
		code, stderr := runScript(t, dir, c.script, c.env...)
		if code != c.code || (c.stderr == "") != (stderr == "") || !strings.Contains(stderr, c.stderr) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", c.script, code, stderr, c.code, c.stderr)
		}
	}
	for _, c := range []tc{
		{"healthy", "prolog.sh", with(live, "SLURM_JOB_ID=7"), 0, ""},
		{"settings from the file", "prolog.sh", []string{"SLURM_JOB_ID=7", "MPSD_SLURM_ENV=" + settings}, 0, ""},
		{"no mpsd on this node", "prolog.sh", with(dead, "MPSD_CONFIG="+dir+"/none.yaml"), 0, ""},
		{"no socket", "prolog.sh", with(dead, "SLURM_JOB_ID=7"), 1,
			"mpsd-prolog: job 7: mpsd does not answer at " + deadSock + ": mpsctl: cannot reach mpsd"},
		{"no mpsctl", "prolog.sh", with(live, "SLURM_JOB_ID=7", "MPSCTL="+dir+"/no-mpsctl"), 2,
			"mpsd-prolog: job 7: cannot check mpsd: " + dir + "/no-mpsctl not found"},
		{"healthy", "epilog.sh", with(live, "SLURM_JOB_ID=7"), 0, ""},
		{"no job", "epilog.sh", live, 0, ""},
		{"no mpsd on this node", "epilog.sh", with(dead, "MPSD_CONFIG="+dir+"/none.yaml"), 0, ""},
		{"no socket", "epilog.sh", with(dead, "SLURM_JOB_ID=7"), 1,
			"mpsd-epilog: job 7: mpsd does not answer at " + deadSock + ": mpsctl: cannot reach mpsd"},
	} {
		t.Run(strings.TrimSuffix(c.script, ".sh")+"/"+c.name, func(t *testing.T) { check(t, c) })
	}

	t.Run("prolog/every instance drained", func(t *testing.T) {
		drain := exec.Command(mpsctl, "--socket", e.socket, "drain", "--group", "slurm")
		if out, err := drain.CombinedOutput(); err != nil {
			t.Fatalf("mpsctl drain: %v\n%s", err, out)
		}
		check(t, tc{"", "prolog.sh", with(live, "SLURM_JOB_ID=7", "MPSD_CHECK_WAIT=1"), 1,
			"mpsd-prolog: job 7: mpsd at " + e.socket + " has no instance that takes leases (all quarantined, draining, drained or retiring; see mpsctl status); not starting jobs here"})
		resume := exec.Command(mpsctl, "--socket", e.socket, "resume", "--group", "slurm")
		if out, err := resume.CombinedOutput(); err != nil {
			t.Fatalf("mpsctl resume: %v\n%s", err, out)
		}
		check(t, tc{"", "prolog.sh", with(live, "SLURM_JOB_ID=7"), 0, ""})
	})

	t.Run("epilog/a lease of the job is left", func(t *testing.T) {
		gate := filepath.Join(dir, "gate")
		launch := exec.Command(filepath.Join(e.bin, "mps-launch"), "--job", "77.1", "--sm", "10", "--mem", "1G",
			"--", "/bin/sh", "-c", "while [ ! -e "+gate+" ]; do sleep 0.02; done")
		launch.Env = baseEnv(dir, api.EnvSocket+"="+e.socket)
		var out bytes.Buffer
		launch.Stdout, launch.Stderr = &out, &out
		if err := launch.Start(); err != nil {
			t.Fatal(err)
		}
		opened := false
		openGate := func() {
			if !opened {
				opened = true
				if err := os.WriteFile(gate, nil, 0o644); err != nil {
					t.Error(err)
				}
			}
		}
		defer func() {
			openGate()
			if err := launch.Wait(); err != nil {
				t.Errorf("mps-launch: %v\n%s", err, out.String())
			}
		}()
		st := e.waitStatus("the lease of job 77.1 running", func(st api.Status) bool {
			l, ok := leaseOfJob(st, "77.1")
			return ok && l.State == api.LeaseRunning
		})
		l, _ := leaseOfJob(st, "77.1")
		check(t, tc{"", "epilog.sh", with(live, "SLURM_JOB_ID=77", "MPSD_EPILOG_WAIT=1"), 1,
			"mpsd-epilog: job 77: mpsd still holds lease(s) " + l.ID + " of this job after 1s (mpsctl status lists their pids)"})
		// Job 7 is not job 77.
		check(t, tc{"", "epilog.sh", with(live, "SLURM_JOB_ID=7", "MPSD_EPILOG_WAIT=1"), 0, ""})
		// Once the workload ends, so does the lease, within the wait.
		openGate()
		check(t, tc{"", "epilog.sh", with(live, "SLURM_JOB_ID=77"), 0, ""})
	})

	t.Run("stopped mpsd", func(t *testing.T) {
		e.stop()
		check(t, tc{"", "prolog.sh", with(live, "SLURM_JOB_ID=8", "MPSD_CHECK_WAIT=1"), 1,
			"mpsd-prolog: job 8: mpsd does not answer at " + e.socket + ": mpsctl: cannot reach mpsd"})
		check(t, tc{"", "epilog.sh", with(live, "SLURM_JOB_ID=8", "MPSD_CHECK_WAIT=1"), 1,
			"mpsd-epilog: job 8: mpsd does not answer at " + e.socket + ": mpsctl: cannot reach mpsd"})
	})
}

// TestScriptsShellcheck lints the example scripts as POSIX sh (slurmd
// runs them with whatever /bin/sh is).
func TestScriptsShellcheck(t *testing.T) {
	sc, err := exec.LookPath("shellcheck")
	if err != nil {
		missing(t, "shellcheck not installed (apt-get install shellcheck)")
	}
	scripts, err := filepath.Glob(filepath.Join(scriptDir, "*.sh"))
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts in %s: %v", scriptDir, err)
	}
	out, err := exec.Command(sc, append([]string{"--shell=sh", "--severity=style"}, scripts...)...).CombinedOutput()
	if err != nil {
		t.Errorf("shellcheck %v: %v\n%s", scripts, err, out)
	}
}

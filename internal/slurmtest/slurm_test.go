package slurmtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/testrun"
)

// slurmPrograms are what the Slurm test runs: Debian's slurmctld, slurmd,
// munge and slurm-client packages.
var slurmPrograms = []string{"munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "sinfo", "scontrol", "scancel"}

// cluster is a single-node Slurm on localhost: munged, slurmctld and
// slurmd run from a temporary directory with their own sockets, ports,
// state and logs.
type cluster struct {
	t     *testing.T
	dir   string
	conf  string
	node  string
	progs map[string]string
	// env is the environment of Slurm's commands, and through them of
	// the jobs (srun and sbatch export it): SLURM_CONF, MPSD_SOCKET and
	// the project's and the emulator's programs first on PATH.
	env     []string
	daemons []*daemon
	ctld    *daemon // slurmctld, once started
	bg      []*exec.Cmd
}

type daemon struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// ended are the job states Slurm leaves a job in for good.
var ended = map[string]bool{"COMPLETED": true, "FAILED": true, "CANCELLED": true, "TIMEOUT": true,
	"NODE_FAIL": true, "OUT_OF_MEMORY": true, "BOOT_FAIL": true, "DEADLINE": true, "PREEMPTED": true}

// findSlurm returns the paths of slurmPrograms, skipping the test (or
// failing it under MPSD_REQUIRE_SLURM=1) when one is missing or the test
// is not root (the cluster runs as SlurmUser=root).
func findSlurm(t *testing.T) map[string]string {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "the Slurm test runs slurmctld and slurmd as root")
	}
	progs := map[string]string{}
	var absent []string
	for _, p := range slurmPrograms {
		path, err := exec.LookPath(p)
		if err != nil {
			// Debian puts the daemons in /usr/sbin, which a user's PATH
			// may lack.
			if _, serr := os.Stat("/usr/sbin/" + p); serr == nil {
				path, err = "/usr/sbin/"+p, nil
			}
		}
		if err != nil {
			absent = append(absent, p)
			continue
		}
		progs[p] = path
	}
	if len(absent) > 0 {
		missing(t, fmt.Sprintf("Slurm not installed: no %s (apt-get install slurmctld slurmd munge slurm-client)", strings.Join(absent, ", ")))
	}
	return progs
}

// freePort returns a TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startCluster starts munged, slurmctld and slurmd in dir for mpsd e, and
// returns once the node is idle. The node has two GPUs for gres/gpu and
// 200 gres/mps (100 per GPU); its prolog and epilog are examples/slurm's,
// pointed at e; batch jobs that exit 75 are requeued (RequeueExit=75).
// Cleanup cancels every job and stops the daemons, slurmd first.
func startCluster(t *testing.T, dir string, e *mpsdEnv) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: dir, conf: filepath.Join(dir, "slurm.conf"), progs: findSlurm(t)}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	// slurmd finds its node by `hostname -s`.
	c.node, _, _ = strings.Cut(host, ".")
	c.env = baseEnv(dir,
		"SLURM_CONF="+c.conf,
		api.EnvSocket+"="+e.socket,
		"PATH="+e.bin+":"+e.emu+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")

	// munge: a key of our own and a socket in dir; every Slurm program
	// finds the socket through AuthInfo in slurm.conf.
	key := make([]byte, 1024)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "munge.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	munge := filepath.Join(dir, "munge.sock")
	for _, d := range []string{"slurmctld-state", "slurmd-spool", "dev"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// slurmd wants gres device files to be character devices, and jobs
	// never open them: /dev/null stands in for both GPUs.
	for i := range 2 {
		if err := os.Symlink("/dev/null", filepath.Join(dir, "dev", fmt.Sprintf("nvidia%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	nodeLine := c.hardware()
	wrapper := func(name string, settings ...string) string {
		path := filepath.Join(dir, name)
		script, err := filepath.Abs(filepath.Join(scriptDir, name))
		if err != nil {
			t.Fatal(err)
		}
		body := "#!/bin/sh\n# slurmd passes a prolog no environment of its own: the settings are here.\n"
		for _, s := range settings {
			body += "export " + s + "\n"
		}
		body += "exec " + script + "\n"
		if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		return path
	}
	settings := []string{"MPSD_CONFIG=" + e.cfgPath, "MPSD_SOCKET=" + e.socket, "MPSCTL=" + filepath.Join(e.bin, "mpsctl"),
		"MPSD_SLURM_ENV=" + dir + "/none.env", "MPSD_EPILOG_WAIT=10"}
	conf := fmt.Sprintf(`# A single-node cluster for internal/slurmtest.
ClusterName=mpsdtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort=%[2]d
SlurmdPort=%[3]d
AuthType=auth/munge
AuthInfo=socket=%[4]s
CredType=cred/munge
StateSaveLocation=%[1]s/slurmctld-state
SlurmdSpoolDir=%[1]s/slurmd-spool
SlurmctldPidFile=%[1]s/slurmctld.pid
SlurmdPidFile=%[1]s/slurmd.pid
SlurmctldLogFile=%[1]s/slurmctld.log
SlurmdLogFile=%[1]s/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=2
# OverSubscribe: jobs that wait in mpsd's queue must run in Slurm at once,
# however few cores the machine has.
%[7]s Gres=gpu:2,mps:200 NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=mpsd Nodes=%[6]s Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
# From examples/slurm/slurm.conf:
%[5]s`, dir, freePort(t), freePort(t), munge, c.example(wrapper("prolog.sh", settings...), wrapper("epilog.sh", settings...)), c.node, nodeLine)
	if err := os.WriteFile(c.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	gres := fmt.Sprintf("Name=gpu File=%[1]s/dev/nvidia[0-1]\nName=mps Count=200\n", dir)
	if err := os.WriteFile(filepath.Join(dir, "gres.conf"), []byte(gres), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(c.stop)
	c.start("munged", "", "-F", "--force", "--key-file="+filepath.Join(dir, "munge.key"), "--socket="+munge,
		"--pid-file="+filepath.Join(dir, "munged.pid"), "--seed-file="+filepath.Join(dir, "munged.seed"),
		"--log-file="+filepath.Join(dir, "munged.log"))
	c.waitFor("munged's socket", func() bool { _, err := os.Stat(munge); return err == nil })
	// -i: no state to recover; -f shows the config (and so the test's
	// directory) on the command line, where the leftover check looks.
	c.start("slurmctld", filepath.Join(dir, "slurmctld.log"), "-D", "-i", "-f", c.conf)
	c.start("slurmd", filepath.Join(dir, "slurmd.log"), "-D", "-f", c.conf)
	c.waitFor("node "+c.node+" idle", func() bool {
		out, err := c.run("sinfo", "-h", "-N", "-n", c.node, "-o", "%t")
		return err == nil && strings.TrimSpace(out) == "idle"
	})
	return c
}

// example returns the settings of examples/slurm/slurm.conf, the shipped
// snippet, with the test's prolog and epilog wrappers for its scripts;
// its NodeName line describes a node of its own and is left out.
func (c *cluster) example(prolog, epilog string) string {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(scriptDir, "slurm.conf"))
	if err != nil {
		c.t.Fatal(err)
	}
	var out strings.Builder
	for line := range strings.Lines(string(b)) {
		key, _, _ := strings.Cut(strings.TrimSpace(line), "=")
		switch {
		case key == "" || strings.HasPrefix(key, "#") || key == "NodeName":
			continue
		case key == "Prolog":
			line = "Prolog=" + prolog + "\n"
		case key == "Epilog":
			line = "Epilog=" + epilog + "\n"
		}
		out.WriteString(line)
	}
	for _, want := range []string{"GresTypes=gpu,mps\n", "RequeueExit=75\n", "Prolog=", "Epilog="} {
		if !strings.Contains(out.String(), want) {
			c.t.Fatalf("examples/slurm/slurm.conf sets no %q", want)
		}
	}
	return out.String()
}

// hardware is slurmd's own view of the node (`slurmd -C`), so the
// configured CPUs match what it finds; RealMemory is not enforced here.
func (c *cluster) hardware() string {
	out, err := exec.Command(c.progs["slurmd"], "-C").Output()
	if err != nil {
		c.t.Fatalf("slurmd -C: %v", err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	if !strings.HasPrefix(line, "NodeName="+c.node+" ") {
		c.t.Fatalf("slurmd -C says %q; want node %s", line, c.node)
	}
	return regexp.MustCompile(`RealMemory=\d+`).ReplaceAllString(line, "RealMemory=100")
}

// start runs a daemon in the foreground, its output in dir.
func (c *cluster) start(name, log string, args ...string) {
	c.t.Helper()
	out, err := os.Create(filepath.Join(c.dir, name+".out"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command(c.progs[name], args...)
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = out, out
	if err := testrun.Start(cmd); err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	d := &daemon{name: name, cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(d.done) }()
	c.daemons = append(c.daemons, d)
	if name == "slurmctld" {
		c.ctld = d
	}
}

// waitFor polls cond until it holds; a daemon that exits meanwhile, or
// the deadline, fails the test.
func (c *cluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		for _, d := range c.daemons {
			select {
			case <-d.done:
				c.t.Fatalf("%s exited while waiting for %s", d.name, what)
			default:
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no %s within %s", what, waitFor)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cmd prepares a Slurm command with the cluster's environment.
func (c *cluster) cmd(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(c.progs[name], args...)
	cmd.Env = c.env
	cmd.Dir = c.dir
	return cmd
}

// run runs a Slurm command to its end (at most waitFor) and returns its
// standard output.
func (c *cluster) run(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.progs[name], args...)
	cmd.Env, cmd.Dir = c.env, c.dir
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, ee.Stderr)
	}
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return string(out), nil
}

// mustRun is run; a failure fails the test.
func (c *cluster) mustRun(name string, args ...string) string {
	c.t.Helper()
	out, err := c.run(name, args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// srun starts `srun ARGS` in the background, its stdout and stderr in
// dir/NAME.out and dir/NAME.err, and returns a channel closed when it
// ends, with its exit status in *code.
func (c *cluster) srun(name string, code *int, args ...string) <-chan struct{} {
	c.t.Helper()
	cmd := c.cmd("srun", append([]string{"--job-name=" + name, "--unbuffered"}, args...)...)
	var files []*os.File
	for _, ext := range []string{".out", ".err"} {
		f, err := os.Create(filepath.Join(c.dir, name+ext))
		if err != nil {
			c.t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
	}
	cmd.Stdout, cmd.Stderr = files[0], files[1]
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("srun: %v", err)
	}
	c.bg = append(c.bg, cmd)
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		*code = cmd.ProcessState.ExitCode()
		close(done)
	}()
	return done
}

// read returns dir/name's content.
func (c *cluster) read(name string) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, name))
	return string(b)
}

// wait waits for a background srun and returns its exit status.
func (c *cluster) wait(name string, done <-chan struct{}, code *int) int {
	c.t.Helper()
	select {
	case <-done:
		return *code
	case <-time.After(waitFor):
		c.t.Fatalf("srun %s did not end within %s; stdout:\n%s\nstderr:\n%s", name, waitFor, c.read(name+".out"), c.read(name+".err"))
		return -1
	}
}

// jobID is the id of the job named name.
func (c *cluster) jobID(name string) string {
	c.t.Helper()
	var id string
	c.waitFor("job "+name+" in squeue", func() bool {
		out, err := c.run("squeue", "-h", "-n", name, "-o", "%i")
		id = strings.TrimSpace(out)
		return err == nil && id != ""
	})
	return id
}

// job is `scontrol show job -o ID` as a map.
func (c *cluster) job(id string) map[string]string {
	c.t.Helper()
	out := c.mustRun("scontrol", "show", "job", "-o", id)
	m := map[string]string{}
	for _, f := range strings.Fields(out) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

// waitJob polls the job until cond holds for it, and returns it.
func (c *cluster) waitJob(id, what string, cond func(map[string]string) bool) map[string]string {
	c.t.Helper()
	var j map[string]string
	c.waitFor("job "+id+" "+what, func() bool { j = c.job(id); return cond(j) })
	return j
}

// stop cancels every job, waits until Slurm has ended them, and stops
// the daemons: slurmd, slurmctld, munged. Whatever was started is
// stopped, however far startCluster got.
func (c *cluster) stop() {
	if c.ctld != nil {
		select {
		case <-c.ctld.done:
			c.t.Errorf("slurmctld had exited before the end of the test")
		default:
			c.cancelJobs()
		}
	}
	for _, cmd := range c.bg {
		_ = cmd.Process.Kill()
	}
	c.stopDaemons()
}

// cancelJobs cancels every job and waits until Slurm has ended them (srun
// and slurmstepd gone; mps-launch killed, so mpsd kills the workloads).
func (c *cluster) cancelJobs() {
	if _, err := c.run("scancel", "--user=root"); err != nil {
		c.t.Logf("scancel: %v", err)
	}
	deadline := time.Now().Add(waitFor)
	for {
		out, err := c.run("squeue", "-h", "-o", "%i %T")
		if err != nil || strings.TrimSpace(out) == "" || time.Now().After(deadline) {
			if err == nil && strings.TrimSpace(out) != "" {
				c.t.Errorf("jobs left after scancel: %s", out)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *cluster) stopDaemons() {
	for _, d := range slices.Backward(c.daemons) {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(waitFor):
			c.t.Errorf("%s did not stop within %s of SIGTERM; killing it", d.name, waitFor)
			_ = d.cmd.Process.Kill()
			<-d.done
		}
	}
	if c.t.Failed() {
		for _, d := range c.daemons {
			for _, f := range []string{d.log, filepath.Join(c.dir, d.name+".out")} {
				if b, err := os.ReadFile(f); err == nil && len(b) > 0 {
					if len(b) > 8000 {
						b = b[len(b)-8000:]
					}
					c.t.Logf("%s (tail):\n%s", f, b)
				}
			}
		}
	}
}

// TestSlurm runs jobs through a real Slurm against mpsd: limits reach the
// client, leases carry the Slurm job id, a job waits in mpsd's queue
// while another holds the GPU, a job's gres/gpu allocation confines its
// lease, mpsd relaunches a job's workload after its MPS server crashed,
// and a batch job whose requeue attempts ran out exits 75 and is requeued
// by Slurm, then completes. The prolog and epilog run for every job;
// the node still being idle at the end says they passed.
func TestSlurm(t *testing.T) {
	findSlurm(t)
	start := time.Now()
	dir := shortDir(t)
	e := startMpsd(t, dir, `  slurm:
    users: [root]
    sm_percent: 100
    memory: 16G
    default_sm: 10
    default_mem: 1G
    requeue_attempts: 1
`)
	c := startCluster(t, dir, e)
	t.Logf("Slurm and mpsd up in %s", time.Since(start).Round(time.Millisecond))
	// gate is a shell loop that holds a job's lease until open is called
	// (again is harmless).
	gate := func(name string) (wait string, open func()) {
		path := filepath.Join(dir, "gate-"+name)
		return "while [ ! -e " + path + " ]; do sleep 0.02; done", func() {
			if err := os.WriteFile(path, nil, 0o644); err != nil {
				t.Errorf("open gate %s: %v", name, err)
			}
		}
	}

	t.Run("gres/mps limits, job id and queueing", func(t *testing.T) {
		// a holds 60% of GPU 0, the share its gres/mps allocation gives.
		waitA, openA := gate("a")
		var codeA, codeB int
		doneA := c.srun("mps-a", &codeA, "--gres=mps:60", "mps-launch", "--gpu", "0", "--",
			"sh", "-c", "mpsemu-client --alloc 512M && "+waitA)
		defer openA()
		idA := c.jobID("mps-a")
		st := e.waitStatus("job "+idA+"'s lease running", func(st api.Status) bool {
			l, ok := leaseOfJob(st, idA+".0")
			return ok && l.State == api.LeaseRunning
		})
		if l, _ := leaseOfJob(st, idA+".0"); l.SM != 60 || !slices.Equal(l.GPUIndexes, []int{0}) {
			t.Errorf("lease of job %s.0: sm %d on GPUs %v; want 60 on [0]", idA, l.SM, l.GPUIndexes)
		}
		waitFile(t, filepath.Join(dir, "mps-a.out"), "allocated 536870912 bytes")
		if out := c.read("mps-a.out"); !regexp.MustCompile(`mpsemu-client: pid=\d+ server=\d+ sm=60\.0 devices=1 mem0=1024M`).MatchString(out) {
			t.Errorf("job %s's client saw other limits:\n%s", idA, out)
		}

		// b asks for 60% of GPU 0 too: Slurm runs it, mpsd queues it.
		doneB := c.srun("mps-b", &codeB, "mps-launch", "--sm", "60", "--gpu", "0", "--", "mpsemu-client")
		idB := c.jobID("mps-b")
		e.waitStatus("job "+idB+"'s lease queued", func(st api.Status) bool {
			l, ok := leaseOfJob(st, idB+".0")
			return ok && l.State == api.LeaseQueued
		})
		if state := c.job(idB)["JobState"]; state != "RUNNING" {
			t.Errorf("job %s is %s in Slurm while queued in mpsd; want RUNNING", idB, state)
		}
		openA()
		if code := c.wait("mps-a", doneA, &codeA); code != 0 {
			t.Errorf("job %s exited %d; stderr:\n%s", idA, code, c.read("mps-a.err"))
		}
		if code := c.wait("mps-b", doneB, &codeB); code != 0 {
			t.Errorf("job %s exited %d; stderr:\n%s", idB, code, c.read("mps-b.err"))
		}
		if out := c.read("mps-b.out"); !strings.Contains(out, " sm=60.0 devices=1 mem0=1024M") {
			t.Errorf("job %s's client saw other limits:\n%s", idB, out)
		}
	})

	t.Run("gres/gpu confines the lease", func(t *testing.T) {
		var code int
		done := c.srun("gpu", &code, "--gres=gpu:1", "mps-launch", "--",
			"sh", "-c", `echo "slurm=$SLURM_STEP_GPUS visible=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY"; exec mpsemu-client`)
		if code := c.wait("gpu", done, &code); code != 0 {
			t.Fatalf("exit %d; stderr:\n%s", code, c.read("gpu.err"))
		}
		out := c.read("gpu.out")
		m := regexp.MustCompile(`slurm=(\d+) visible=(\S+) pipe=\S+/slurm/(GPU-[0-9a-f-]+)/pipe`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("output:\n%s", out)
		}
		st, err := e.status()
		if err != nil {
			t.Fatal(err)
		}
		idx, _ := strconv.Atoi(m[1])
		var uuid string
		for _, in := range st.Instances {
			if in.GPUIndex == idx {
				uuid = in.GPUUUID
			}
		}
		// The lease is on the GPU Slurm gave, and the client sees it by
		// UUID: under an MPS server, Slurm's index would name no device.
		if m[3] != uuid || m[2] != uuid {
			t.Errorf("Slurm gave GPU %d (%s); the lease ran on %s, the client saw CUDA_VISIBLE_DEVICES=%s", idx, uuid, m[3], m[2])
		}
	})

	t.Run("mpsd relaunches after a crashed MPS server", func(t *testing.T) {
		var code int
		done := c.srun("relaunch", &code, "mps-launch", "--requeue", "1", "--", "sh", "-c",
			`echo "attempt $MPSD_ATTEMPT"; if [ "$MPSD_ATTEMPT" = 1 ]; then exec mpsemu-client --duration 1h; fi; exec mpsemu-client`)
		id := c.jobID("relaunch")
		e.waitStatus("job "+id+"'s lease running", func(st api.Status) bool {
			l, ok := leaseOfJob(st, id+".0")
			return ok && l.State == api.LeaseRunning
		})
		crashServer(t, e, waitFile(t, filepath.Join(dir, "relaunch.out"), "mpsemu-client: pid="))
		if code := c.wait("relaunch", done, &code); code != 0 {
			t.Fatalf("exit %d; stderr:\n%s", code, c.read("relaunch.err"))
		}
		if out := c.read("relaunch.out"); !strings.Contains(out, "attempt 1\n") || !strings.Contains(out, "attempt 2\n") {
			t.Errorf("output:\n%s", out)
		}
		want := regexp.MustCompile(`(?m)^mps-launch: job ` + id + `\.0: lease \S+ revoked \(.+\); requeued, attempt 2$`)
		if errOut := c.read("relaunch.err"); !want.MatchString(errOut) {
			t.Errorf("stderr has no line matching %s:\n%s", want, errOut)
		}
	})

	t.Run("requeue exhausted: Slurm requeues the batch job", func(t *testing.T) {
		out := filepath.Join(dir, "batch.out")
		script := filepath.Join(dir, "batch.sh")
		// The first run's client holds on until its server is killed;
		// mps-launch may not relaunch it, so it exits 75 and Slurm
		// requeues the job; the second run completes.
		if err := os.WriteFile(script, []byte(`#!/bin/sh
echo "run ${SLURM_RESTART_COUNT:-0}"
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
	exec mps-launch --no-requeue -- mpsemu-client --duration 1h
fi
exec mps-launch --no-requeue -- mpsemu-client
`), 0o755); err != nil {
			t.Fatal(err)
		}
		id := strings.TrimSpace(c.mustRun("sbatch", "--parsable", "--job-name=batch", "--output="+out, "--open-mode=append", script))
		e.waitStatus("job "+id+"'s lease running", func(st api.Status) bool {
			l, ok := leaseOfJob(st, id)
			return ok && l.State == api.LeaseRunning
		})
		crashServer(t, e, waitFile(t, out, "mpsemu-client: pid="))
		c.waitJob(id, "requeued", func(j map[string]string) bool { return j["Restarts"] == "1" && j["JobState"] == "PENDING" })
		requeued := time.Now()
		log := waitFile(t, out, "no requeue attempts left")
		if !regexp.MustCompile(`(?m)^mps-launch: job ` + id + `: lease revoked: .+; no requeue attempts left \(0 used\)$`).MatchString(log) {
			t.Errorf("the batch job's output does not name the job in the failure:\n%s", log)
		}
		// Slurm holds a requeued job back (EligibleTime, two minutes in
		// 22.05); move it to now, as an operator may. Not within the
		// second of the requeue, though: slurmd revokes the first run's
		// job credential, to the second, and kills a run whose credential
		// was made in that same second ("Job credential revoked", exit 1).
		// This waits for the clock, not for a state.
		time.Sleep(time.Until(requeued.Truncate(time.Second).Add(2 * time.Second)))
		c.mustRun("scontrol", "update", "JobId="+id, "StartTime=now")
		j := c.waitJob(id, "ended", func(j map[string]string) bool { return ended[j["JobState"]] })
		if j["JobState"] != "COMPLETED" || j["ExitCode"] != "0:0" || j["Restarts"] != "1" {
			t.Errorf("job %s: %s exit %s after %s restarts; want COMPLETED 0:0 after 1\n%s", id, j["JobState"], j["ExitCode"], j["Restarts"], c.read("batch.out"))
		}
		log = c.read("batch.out")
		if !strings.Contains(log, "run 0\n") || !strings.Contains(log, "run 1\n") || strings.Count(log, "mpsemu-client: pid=") != 2 {
			t.Errorf("batch output:\n%s", log)
		}
	})

	// Every job passed the prolog and the epilog: a failing one drains
	// the node. The last epilog may still run (the node is "comp").
	c.waitFor("node "+c.node+" idle after the jobs", func() bool {
		out := strings.TrimSpace(c.mustRun("sinfo", "-h", "-N", "-n", c.node, "-o", "%t %E"))
		if strings.HasPrefix(out, "drain") {
			t.Fatalf("node %s: %s; a prolog or epilog failed (slurmd's log has its output)", c.node, out)
		}
		return out == "idle none"
	})
	// No lease outlived its job.
	if st, err := e.status(); err != nil || len(st.Leases) != 0 {
		t.Errorf("leases left: %+v, %v", st.Leases, err)
	}
	t.Logf("Slurm test done in %s", time.Since(start).Round(time.Millisecond))
}

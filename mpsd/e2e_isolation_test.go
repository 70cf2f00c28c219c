package mpsd

import (
	"bytes"
	"encoding/json"
	"fmt"
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
)

// Real uids of these tests; none needs a passwd entry (the config takes
// numeric uids, asUID runs a command as one).
const (
	isoUIDA    = 64001 // member of group a
	isoUIDB    = 64002 // member of group b
	isoUIDNone = 64003 // member of no group
	isoUIDAStr = "64001"
	isoUIDBStr = "64002"
	isoGroups  = `  a:
    users: ["` + isoUIDAStr + `"]
    memory: 10G
  b:
    users: ["` + isoUIDBStr + `"]
    memory: 10G
`
)

// isoGroupInstances returns the instances of group in st.
func isoGroupInstances(st api.Status, group string) []api.InstanceStatus {
	var out []api.InstanceStatus
	for _, in := range st.Instances {
		if in.Group == group {
			out = append(out, in)
		}
	}
	return out
}

// isoAllReady holds when every instance (and there is at least one) is ready.
func isoAllReady(st api.Status) bool {
	return len(st.Instances) > 0 && !slices.ContainsFunc(st.Instances, func(in api.InstanceStatus) bool {
		return in.State != api.InstanceReady
	})
}

// isoOneLine checks that s is exactly one non-empty line and returns it.
func isoOneLine(t *testing.T, what, s string) string {
	t.Helper()
	line := strings.TrimSuffix(s, "\n")
	if line == "" || strings.Contains(line, "\n") {
		t.Errorf("%s: want exactly one line, got %q", what, s)
	}
	return line
}

// A uid that is a member of neither group is refused at once, in one line
// that says what is wrong, and nothing is queued or started for it.
func TestLaunchRefusesNonMember(t *testing.T) {
	e := newEnv(t, isoGroups, "")
	e.start()

	r := run(t, asUID(e.launch("--group", "a", "--", "/bin/true"), isoUIDNone))
	if r.code != 125 {
		t.Fatalf("--group a as uid %d: exit %d, want 125; stderr %q", isoUIDNone, r.code, r.stderr)
	}
	line := isoOneLine(t, "stderr of the refusal", r.stderr)
	if !regexp.MustCompile(`group "?a\b"?`).MatchString(line) {
		t.Errorf("refusal does not name group a: %q", line)
	}
	if !strings.Contains(line, "not a member") {
		t.Errorf("refusal does not say the caller is not a member: %q", line)
	}

	r = run(t, asUID(e.launch("--", "/bin/true"), isoUIDNone))
	if r.code != 125 {
		t.Fatalf("no --group as uid %d: exit %d, want 125; stderr %q", isoUIDNone, r.code, r.stderr)
	}
	line = isoOneLine(t, "stderr of the refusal without --group", r.stderr)
	if low := strings.ToLower(line); !strings.Contains(low, "any group") && !strings.Contains(low, "no group") {
		t.Errorf("refusal without --group does not say the caller is in no group: %q", line)
	}

	// A member of b naming a is refused the same way.
	r = run(t, asUID(e.launch("--group", "a", "--", "/bin/true"), isoUIDB))
	if r.code != 125 {
		t.Fatalf("--group a as uid %d (member of b): exit %d, want 125; stderr %q", isoUIDB, r.code, r.stderr)
	}

	st := e.d.Status()
	if len(st.Leases) != 0 || st.Queue["a"] != 0 || st.Queue["b"] != 0 {
		t.Errorf("refused requests left leases or queue entries: %+v", st)
	}
}

// isoProcUID is the real uid of a live process.
func isoProcUID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read status of pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, err := strconv.Atoi(f[0])
				if err == nil {
					return n
				}
			}
		}
	}
	t.Fatalf("pid %d status has no Uid line:\n%s", pid, b)
	return -1
}

// A member runs a workload end to end under its own uid: the lease is its
// own, and the MPS server that serves it runs as that uid, not root.
func TestMemberRunsWorkload(t *testing.T) {
	e := newEnv(t, isoGroups, "")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")

	p := startProc(t, asUID(e.launch("--sm", "20", "--mem", "1G", "--", client, "--alloc", "512M", "--duration", "2s"), isoUIDA))
	var serverPID int
	st := e.waitStatus("a running lease of uid 64001 served by an MPS server", func(st api.Status) bool {
		if len(st.Leases) != 1 || st.Leases[0].State != api.LeaseRunning {
			return false
		}
		l := st.Leases[0]
		for _, in := range isoGroupInstances(st, "a") {
			if len(l.GPUIndexes) > 0 && in.GPUIndex == l.GPUIndexes[0] && len(in.ServerPIDs) > 0 {
				serverPID = in.ServerPIDs[0]
				return true
			}
		}
		return false
	})
	l := st.Leases[0]
	if l.Group != "a" || l.UID != isoUIDA || l.SM != 20 || l.MemBytes != 1<<30 {
		t.Errorf("lease %+v: want group a, uid %d, sm 20, mem 1GiB", l, isoUIDA)
	}
	if got := isoProcUID(t, serverPID); got != isoUIDA {
		t.Errorf("MPS server pid %d runs as uid %d, want the client's uid %d", serverPID, got, isoUIDA)
	}
	r := p.wait(t)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if want := "allocated 536870912 bytes"; !strings.Contains(r.stdout+r.stderr, want) {
		t.Errorf("client output lacks %q:\n%s%s", want, r.stdout, r.stderr)
	}
	e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// A member of one group cannot reach another group's pipe directory, by
// path or through its control socket; the other group's members can.
func TestPipeDirClosedToOtherGroups(t *testing.T) {
	e := newEnv(t, isoGroups, "")
	e.start()
	st := e.waitStatus("every instance ready", isoAllReady)
	layout := Layout{RunDir: filepath.Join(e.dir, "run"), LogDir: filepath.Join(e.dir, "log")}
	control := filepath.Join(e.emu, "nvidia-cuda-mps-control")

	for _, tc := range []struct {
		group string
		in    uint32 // a member
		out   []uint32
	}{
		{"b", isoUIDB, []uint32{isoUIDA, isoUIDNone}},
		{"a", isoUIDA, []uint32{isoUIDB, isoUIDNone}},
	} {
		insts := isoGroupInstances(st, tc.group)
		if len(insts) == 0 {
			t.Fatalf("group %s has no instance: %+v", tc.group, st.Instances)
		}
		pipe := layout.PipeDir(tc.group, insts[0].GPUUUID)
		if _, err := os.Stat(pipe); err != nil {
			t.Fatalf("pipe dir of group %s: %v", tc.group, err)
		}
		ls := func(uid uint32) result { return run(t, asUID(exec.Command("/bin/ls", pipe), uid)) }
		ctl := func(uid uint32) result {
			cmd := asUID(exec.Command(control), uid)
			cmd.Env = append(os.Environ(), api.EnvPipeDirectory+"="+pipe)
			cmd.Stdin = strings.NewReader("get_server_list\n")
			return run(t, cmd)
		}

		logFile := filepath.Join(layout.InstanceLogDir(tc.group, insts[0].GPUUUID), "control.log")
		readLog := func(uid uint32) result { return run(t, asUID(exec.Command("/bin/cat", logFile), uid)) }

		if r := ls(tc.in); r.code != 0 {
			t.Errorf("ls %s as uid %d (member of %s): exit %d, stderr %q", pipe, tc.in, tc.group, r.code, r.stderr)
		}
		if r := readLog(tc.in); r.code != 0 {
			t.Errorf("cat %s as uid %d (member of %s): exit %d, stderr %q", logFile, tc.in, tc.group, r.code, r.stderr)
		}
		if r := ctl(tc.in); r.code != 0 {
			t.Errorf("get_server_list on %s as uid %d (member of %s): exit %d, stdout %q, stderr %q", pipe, tc.in, tc.group, r.code, r.stdout, r.stderr)
		}
		for _, uid := range tc.out {
			r := ls(uid)
			if r.code == 0 {
				t.Errorf("ls %s as uid %d (not a member of %s) succeeded: %q", pipe, uid, tc.group, r.stdout)
			} else if !strings.Contains(r.stderr, "Permission denied") {
				t.Errorf("ls %s as uid %d: exit %d, want permission denied; stderr %q", pipe, uid, r.code, r.stderr)
			}
			// A CUDA client of a non-member pointed at the pipe
			// directory cannot reach MPS (805, exit 85 in the emulator).
			cl := asUID(exec.Command(filepath.Join(e.emu, "mpsemu-client"), "--duration", "10ms"), uid)
			cl.Env = append(os.Environ(), api.EnvPipeDirectory+"="+pipe)
			if r := run(t, cl); r.code != 85 {
				t.Errorf("CUDA client of uid %d on %s: exit %d, want 85 (805); stderr %q", uid, pipe, r.code, r.stderr)
			}
			// The group's MPS logs name its users, pids and limits.
			if r := readLog(uid); r.code == 0 {
				t.Errorf("cat %s as uid %d (not a member of %s) succeeded", logFile, uid, tc.group)
			}
			if r := ctl(uid); r.code == 0 {
				t.Errorf("get_server_list on %s as uid %d (not a member of %s) succeeded: %q", pipe, uid, tc.group, r.stdout)
			}
			// Not even the group's directory can be looked into.
			if r := run(t, asUID(exec.Command("/bin/ls", layout.GroupRunDir(tc.group)), uid)); r.code == 0 {
				t.Errorf("ls %s as uid %d (not a member) succeeded: %q", layout.GroupRunDir(tc.group), uid, r.stdout)
			}
		}
	}
}

// isoBuildAPICall puts the API caller (apiCallMain, the test binary
// itself), which speaks to mpsd's socket through package client as
// whichever uid runs it, into the env's directory (reachable by test
// uids).
func (e *testEnv) isoBuildAPICall() string {
	e.t.Helper()
	out, err := apiCallBinary(e.dir)
	if err != nil {
		e.t.Fatalf("API caller: %v", err)
	}
	return out
}

// isoAPICall posts body to path as uid and returns mpsd's error code (""
// when it accepted the request) and the answer's body or the error's
// message. With child, the caller starts a child of its own first,
// {child} in body becomes its pid, and childCgroup is where that child
// was after the answer.
func (e *testEnv) isoAPICall(helper string, uid uint32, path, body string, child bool) (code api.ErrorCode, resp []byte, childCgroup string) {
	e.t.Helper()
	args := []string{"-socket", e.socket, "-path", path, "-body", body}
	if child {
		args = append(args, "-child")
	}
	r := run(e.t, asUID(apiCallCmd(helper, args...), uid))
	if r.code != 0 {
		e.t.Fatalf("apicall %s as uid %d: exit %d, stderr %q", path, uid, r.code, r.stderr)
	}
	first, rest, _ := strings.Cut(r.stdout, "\n")
	if first != "ok" {
		code = api.ErrorCode(first)
	}
	for _, line := range strings.Split(r.stderr, "\n") {
		if cg, ok := strings.CutPrefix(line, "cgroup "); ok {
			childCgroup = cg
		}
	}
	if child && childCgroup == "" {
		e.t.Fatalf("apicall did not report its child's cgroup: %q", r.stderr)
	}
	return code, []byte(rest), childCgroup
}

// A user cannot move a process into another user's lease, not even its
// own child; the lease's owner can.
func TestAttachOtherUsersLeaseForbidden(t *testing.T) {
	// 64004 shares group a with the lease's owner but not the lease.
	e := newEnv(t, `  a:
    users: ["`+isoUIDAStr+`", "64004"]
    memory: 10G
  b:
    users: ["`+isoUIDBStr+`"]
    memory: 10G
`, "")
	e.start()
	helper := e.isoBuildAPICall()
	gateArgs, open := e.gate("attach")
	p := startProc(t, asUID(e.launch(append([]string{"--sm", "10", "--mem", "1G", "--"}, gateArgs...)...), isoUIDA))
	// Granted first, attached a moment later: wait for the workload.
	st := e.waitStatus("a running workload", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 1 && len(st.Leases[0].PIDs) > 0
	})
	l := st.Leases[0]
	if l.UID != isoUIDA || len(l.PIDs) == 0 {
		t.Fatalf("lease %+v: want uid %d and its workload's pids", l, isoUIDA)
	}
	leaseCgroup := e.leaseCgroup("a", l.ID)
	if got := cgroupOf(t, l.PIDs[0]); got != leaseCgroup {
		t.Fatalf("workload pid %d is in %s, want %s", l.PIDs[0], got, leaseCgroup)
	}
	attach := api.AttachPath(l.ID)

	// uid 64002 (group b), 64004 (group a, not the lease's owner) and
	// 64003 (no group) each name their own child, which would be
	// accepted but for the lease belonging to someone else.
	for _, uid := range []uint32{isoUIDB, 64004, isoUIDNone} {
		code, body, cg := e.isoAPICall(helper, uid, attach, `{"pid":{child}}`, true)
		if code != api.CodeForbidden {
			t.Errorf("attach to uid %d's lease as uid %d: %q %s, want %q", isoUIDA, uid, code, body, api.CodeForbidden)
		}
		if cg == leaseCgroup {
			t.Errorf("uid %d's child was moved into uid %d's lease cgroup", uid, isoUIDA)
		}
	}
	// Nor may another user name the owner's own workload.
	code, body, _ := e.isoAPICall(helper, isoUIDB, attach, fmt.Sprintf(`{"pid":%d}`, l.PIDs[0]), false)
	if code != api.CodeForbidden {
		t.Errorf("attach of the owner's pid as uid %d: %q %s, want forbidden", isoUIDB, code, body)
	}
	// Nor may another user take the lease over by "resuming" it.
	code, body, _ = e.isoAPICall(helper, isoUIDB, api.PathLeases, fmt.Sprintf(`{"group":"a","resume_lease_id":%q,"attempt":1}`, l.ID), false)
	if code != api.CodeForbidden {
		t.Errorf("resume of uid %d's lease as uid %d: %q %s, want forbidden", isoUIDA, isoUIDB, code, body)
	}
	code, body, _ = e.isoAPICall(helper, 64004, api.PathLeases, fmt.Sprintf(`{"resume_lease_id":%q,"attempt":1}`, l.ID), false)
	if code != api.CodeForbidden {
		t.Errorf("resume of uid %d's lease as uid 64004: %q %s, want forbidden", isoUIDA, code, body)
	}
	// The control: the owner attaching its own child the same way is
	// accepted and the child lands in the lease cgroup, so the refusals
	// above were for the lease's owner, not for the request.
	code, body, cg := e.isoAPICall(helper, isoUIDA, attach, `{"pid":{child}}`, true)
	if code != "" {
		t.Errorf("attach of its own child as the owner uid %d: %q %s, want it accepted", isoUIDA, code, body)
	}
	if cg != leaseCgroup {
		t.Errorf("owner's attached child is in %s, want %s", cg, leaseCgroup)
	}

	open()
	if r := p.wait(t); r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("the lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// mpsctl drain and resume are for admins only; a drained group refuses
// --no-wait launches as temporary (75) until it is resumed.
func TestDrainAdminOnly(t *testing.T) {
	e := newEnv(t, isoGroups, "")
	e.start()
	e.waitStatus("every instance ready", isoAllReady)
	mpsctl := func(uid uint32, args ...string) result {
		cmd := exec.Command(filepath.Join(e.bin, "mpsctl"), append([]string{"--socket", e.socket}, args...)...)
		if uid != 0 {
			asUID(cmd, uid)
		}
		return run(t, cmd)
	}

	r := mpsctl(isoUIDA, "drain", "--group", "a")
	if r.code != 1 {
		t.Fatalf("drain as uid %d: exit %d, want 1; stdout %q stderr %q", isoUIDA, r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(isoOneLine(t, "stderr of the refused drain", r.stderr), "not an mpsd admin") {
		t.Errorf("refused drain does not say the caller is not an admin: %q", r.stderr)
	}
	for _, in := range isoGroupInstances(e.d.Status(), "a") {
		if in.State != api.InstanceReady {
			t.Errorf("after a refused drain instance %s of a is %s", in.GPUUUID, in.State)
		}
	}

	if r := mpsctl(0, "drain", "--group", "a"); r.code != 0 {
		t.Fatalf("drain as root: exit %d, stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	st := e.d.Status()
	for _, in := range st.Instances {
		want := api.InstanceReady
		if in.Group == "a" {
			want = api.InstanceDrained // no lease runs there
		}
		if in.State != want {
			t.Errorf("after drain --group a: instance %s/%d is %s, want %s", in.Group, in.GPUIndex, in.State, want)
		}
	}
	// mpsctl status --json shows the same.
	r = mpsctl(isoUIDA, "status", "--json")
	if r.code != 0 {
		t.Fatalf("status --json as uid %d: exit %d, stderr %q", isoUIDA, r.code, r.stderr)
	}
	var js api.Status
	if err := json.Unmarshal([]byte(r.stdout), &js); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r.stdout)
	}
	if a := isoGroupInstances(js, "a"); len(a) == 0 || slices.ContainsFunc(a, func(in api.InstanceStatus) bool { return in.State != api.InstanceDrained }) {
		t.Errorf("status --json instances of a: %+v, want all drained", a)
	}

	r = run(t, asUID(e.launch("--group", "a", "--no-wait", "--", "/bin/true"), isoUIDA))
	if r.code != 75 {
		t.Fatalf("--no-wait launch in drained a: exit %d, want 75; stderr %q", r.code, r.stderr)
	}
	// Group b is not affected.
	if r := run(t, asUID(e.launch("--no-wait", "--", "/bin/true"), isoUIDB)); r.code != 0 {
		t.Errorf("--no-wait launch in b while a is drained: exit %d, stderr %q", r.code, r.stderr)
	}

	if r := mpsctl(isoUIDA, "resume", "--group", "a"); r.code != 1 {
		t.Errorf("resume as uid %d: exit %d, want 1; stderr %q", isoUIDA, r.code, r.stderr)
	}
	if r := mpsctl(0, "resume", "--group", "a"); r.code != 0 {
		t.Fatalf("resume as root: exit %d, stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	e.waitStatus("instances of a ready again", func(st api.Status) bool {
		a := isoGroupInstances(st, "a")
		return len(a) > 0 && !slices.ContainsFunc(a, func(in api.InstanceStatus) bool { return in.State != api.InstanceReady })
	})
	if r := run(t, asUID(e.launch("--group", "a", "--no-wait", "--", "/bin/true"), isoUIDA)); r.code != 0 {
		t.Fatalf("--no-wait launch in a after resume: exit %d, stderr %q", r.code, r.stderr)
	}
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// Membership by unix group: a caller whose supplementary groups include
// the group's gid is admitted and its workload reaches the pipe directory
// and the MPS server; the same uid without that group is refused.
func TestMemberByUnixGroup(t *testing.T) {
	e := newEnv(t, `  a:
    unix_groups: ["64006"]
    memory: 10G
  b:
    users: ["`+isoUIDBStr+`"]
    memory: 10G
`, "")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	withGroup := func(cmd *exec.Cmd, groups ...uint32) *exec.Cmd {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 64007, Gid: 64007, Groups: groups}}
		return cmd
	}

	script := `ls "$` + api.EnvPipeDirectory + `" >/dev/null && exec "$0" --alloc 64M`
	r := run(t, withGroup(e.launch("--sm", "10", "--mem", "1G", "--", "/bin/sh", "-c", script, client), 64006))
	if r.code != 0 {
		t.Fatalf("uid 64007 in unix group 64006: exit %d, stderr %q", r.code, r.stderr)
	}
	if want := "allocated 67108864 bytes"; !strings.Contains(r.stdout+r.stderr, want) {
		t.Errorf("client output lacks %q:\n%s%s", want, r.stdout, r.stderr)
	}
	r = run(t, withGroup(e.launch("--group", "a", "--", "/bin/true")))
	if r.code != 125 {
		t.Errorf("uid 64007 without unix group 64006: exit %d, want 125; stderr %q", r.code, r.stderr)
	}
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// isoWaitLog waits until mpsd's log holds s.
func (e *testEnv) isoWaitLog(s string) {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		b, _ := os.ReadFile(e.log.Name())
		if bytes.Contains(b, []byte(s)) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("mpsd did not log %q within %s", s, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A membership change in the config applies to the pipe directories
// without a restart: the member who left loses access, the one who joined
// gains it, and the instances keep running.
func TestMembershipReloadUpdatesPipeAccess(t *testing.T) {
	e := newEnv(t, isoGroups, "")
	e.start()
	st := e.waitStatus("every instance ready", isoAllReady)
	pipes := map[string]string{}
	daemons := map[string]int{}
	for _, in := range isoGroupInstances(st, "a") {
		pipes[in.GPUUUID] = Layout{RunDir: filepath.Join(e.dir, "run")}.PipeDir("a", in.GPUUUID)
		daemons[in.GPUUUID] = in.DaemonPID
	}
	ls := func(uid uint32) int {
		n := 0
		for _, p := range pipes {
			if run(t, asUID(exec.Command("/bin/ls", p), uid)).code == 0 {
				n++
			}
		}
		return n
	}
	if n := ls(isoUIDA); n != len(pipes) {
		t.Fatalf("before the change uid %d reaches %d of %d pipe dirs of a", isoUIDA, n, len(pipes))
	}
	if n := ls(64004); n != 0 {
		t.Fatalf("before the change uid 64004 reaches %d pipe dirs of a", n)
	}

	e.writeConfig(`  a:
    users: ["64004"]
    memory: 10G
  b:
    users: ["`+isoUIDBStr+`"]
    memory: 10G
`, "")
	e.isoWaitLog(`msg="config reloaded"`)
	if n := ls(isoUIDA); n != 0 {
		t.Errorf("after leaving a, uid %d still reaches %d pipe dirs of a", isoUIDA, n)
	}
	if n := ls(64004); n != len(pipes) {
		t.Errorf("after joining a, uid 64004 reaches %d of %d pipe dirs of a", n, len(pipes))
	}
	if r := run(t, asUID(e.launch("--group", "a", "--", "/bin/true"), isoUIDA)); r.code != 125 {
		t.Errorf("launch in a by uid %d after it left: exit %d, want 125; stderr %q", isoUIDA, r.code, r.stderr)
	}
	if r := run(t, asUID(e.launch("--group", "a", "--", "/bin/true"), 64004)); r.code != 0 {
		t.Errorf("launch in a by uid 64004 after it joined: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, in := range isoGroupInstances(e.d.Status(), "a") {
		if in.DaemonPID != daemons[in.GPUUUID] {
			t.Errorf("instance of a on %s: control daemon %d replaced by %d on a membership change", in.GPUUUID, daemons[in.GPUUUID], in.DaemonPID)
		}
	}
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

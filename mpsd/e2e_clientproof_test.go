package mpsd

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// MPS's client list is what the clients told their server. In a
// multiuser group under reconcile: terminate, member A's client tells the
// shared server it is member B's innocent process (a sleep run as B):
// MPS lists B's pid as an unleased client. mpsd reports it (metric, log
// line saying it is not proven a client of that server) and never
// signals it, nor asks MPS to terminate it. A's genuinely unleased
// client, which holds a connection to the server, is still ended, and
// A's leased client runs on.
func TestReconcileEndsOnlyProvenClients(t *testing.T) {
	a, b := emutest.User(t, reconUID), emutest.User(t, reconOtherUID)
	e := newEnv(t, fmt.Sprintf(`  a:
    users: [%s, %s]
    memory: 10G
    gpus: ["0"]
    multiuser: true
    reconcile: terminate
`, a, b), "")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")
	by := startProc(t, asUID(e.launch("--sm", "10", "--mem", "1G", "--", client, "--duration", "1m"), reconUID))
	st := e.waitStatus("the member's client on a live shared server", func(st api.Status) bool {
		in0 := instanceOf(st, "a", 0)
		return countLeases(st, api.LeaseRunning) == 1 && len(in0.ServerPIDs) == 1 && e.mpsClients(in0) == 1
	})
	in0 := instanceOf(st, "a", 0)
	server := in0.ServerPIDs[0]
	pipe := Layout{RunDir: filepath.Join(e.dir, "run")}.PipeDir("a", in0.GPUUUID)
	clientAs := func(uid uint32, args ...string) *proc {
		cmd := asUID(exec.Command(client, append([]string{"--duration", "1m"}, args...)...), uid)
		cmd.Env = append(os.Environ(), api.EnvPipeDirectory+"="+pipe)
		return startProc(t, cmd)
	}

	// The attack: B's process, claimed by A's client.
	victim := startProc(t, asUID(exec.Command("sleep", "300"), reconOtherUID))
	claimer := clientAs(reconUID, "--claim-pid", strconv.Itoa(victim.pid()))
	e.reconWaitMetric("mpsd_unreconciled_clients_total", "a", map[string]float64{reconUnleased: 1})
	e.waitLogAny(fmt.Sprintf("MPS lists a pid not proven to be a client of that server; reported, never signalled\" group=a gpu=%s gpu_index=0 server=%d pid=%d uid=%d kind=%s",
		in0.GPUUUID, server, victim.pid(), reconOtherUID, reconUnleased))
	victimExe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", victim.pid()))
	if err != nil {
		t.Fatal(err)
	}
	e.waitLogAny(fmt.Sprintf("kind=%s group=a gpu=%s gpu_index=0 instance=a/0 pid=%d uid=%d exe=%s action=reported server=%d",
		reconUnleased, in0.GPUUUID, victim.pid(), reconOtherUID, victimExe, server))

	// A proven client of the same server is still ended.
	genuine := clientAs(reconUID)
	if r := genuine.wait(t); r.code != 90 && r.code != 128+int(syscall.SIGKILL) {
		t.Errorf("the member's unleased client: exit %d (stderr %q), want 90 (terminated, CUDA error 810) or SIGKILL", r.code, r.stderr)
	}
	e.reconWaitMetric("mpsd_unreconciled_clients_total", "a", map[string]float64{reconUnleased: 2})
	e.reconWaitMetric("mpsd_unreconciled_clients_terminated_total", "a", map[string]float64{reconUnleased: 1})
	e.waitLogAny(fmt.Sprintf("pid=%d uid=%d exe=%s action=terminated server=%d", genuine.pid(), reconUID, client, server))

	if !alive(victim.pid()) {
		t.Errorf("B's process %d, which MPS listed on A's client's word, was ended", victim.pid())
	}
	if n := e.limSum("mpsd_unreconciled_clients_terminated_total"); n != 1 {
		t.Errorf("mpsd_unreconciled_clients_terminated_total = %v, want 1 (the proven client only)", n)
	}
	lb, _ := os.ReadFile(e.log.Name())
	if bytes.Contains(lb, []byte(fmt.Sprintf("pid=%d uid=%d exe=%s action=terminated", victim.pid(), reconOtherUID, victimExe))) ||
		bytes.Contains(lb, []byte(fmt.Sprintf("terminate_client failed; killing the process\" pid=%d", victim.pid()))) {
		t.Errorf("mpsd acted on B's process %d", victim.pid())
	}
	if !alive(claimer.pid()) {
		t.Errorf("A's claiming client %d was ended: MPS names it nowhere", claimer.pid())
	}
	if l := e.d.Status().Leases; len(l) != 1 || l[0].Attempt != 1 || !alive(by.pid()) {
		t.Errorf("the member's lease: %+v; want it running at its first attempt", l)
	}
	for _, p := range []*proc{claimer, victim} {
		_ = p.cmd.Process.Kill()
		p.wait(t)
	}
	_ = by.cmd.Process.Signal(syscall.SIGTERM)
	by.wait(t)
}

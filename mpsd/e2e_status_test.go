package mpsd

import (
	"slices"
	"testing"

	"github.com/mpsd/mpsd/api"
)

// Status tells what MPS serves that no lease accounts for. Alice runs a
// lease and, beside it, a client of her server with no lease holding
// 512 MiB; Bob asks and waits behind it. An admin's status shows her
// client (pid, uid, server, memory), its memory within the instance's
// used memory, the uid MPS serves, and each lease's launcher pid beside
// its workload's; Bob's own view shows his lease and launcher, and
// nothing of Alice's client. Once the client has gone, status shows none;
// after an mpsd restart, Alice's lease shows the launcher that resumed it.
func TestStatusShowsUnleasedClientsAndLaunchers(t *testing.T) {
	e := newEnvGPUs(t, 1, tenGroup, faultWatchdog)
	in0, client := e.tenReady()
	alice := startProc(t, asUID(e.launch("--sm", "20", "--mem", "1G", "--", client, "--alloc", "256M", "--duration", "1m"), tenUIDAlice))
	e.waitServerOf(t, "a", tenUIDAlice)
	hp := e.unleasedClient(t, tenUIDAlice, in0, client, "--alloc", "512M", "--duration", "1m")
	bob := startProc(t, asUID(e.launch("--sm", "20", "--mem", "1G", "--", client, "--duration", "100ms"), tenUIDBob))

	const aliceMem, freeMem uint64 = 256 << 20, 512 << 20
	st := e.waitStatus("alice's client of no lease in status, bob queued", func(st api.Status) bool {
		in := instanceOf(st, "a", 0)
		return len(in.Unleased) == 1 && in.Unleased[0].MemBytes != nil && *in.Unleased[0].MemBytes == freeMem &&
			in.MemUsedBytes != nil && *in.MemUsedBytes == aliceMem+freeMem && st.Queue["a"] == 1
	})
	in := instanceOf(st, "a", 0)
	c := in.Unleased[0]
	if c.PID != hp.cmd.Process.Pid || c.UID != tenUIDAlice || !slices.Contains(in.ServerPIDs, c.Server) {
		t.Errorf("unleased client %+v; want pid %d, uid %d, a server of %v", c, hp.cmd.Process.Pid, tenUIDAlice, in.ServerPIDs)
	}
	if in.UnleasedMemBytes != int64(freeMem) {
		t.Errorf("unleased memory %d; want %d", in.UnleasedMemBytes, freeMem)
	}
	if in.ServingUID == nil || *in.ServingUID != tenUIDAlice {
		t.Errorf("serving uid %v; want alice's %d", in.ServingUID, tenUIDAlice)
	}
	launchers := map[uint32]int{}
	for _, l := range st.Leases {
		launchers[l.UID] = l.LauncherPID
		if l.UID == tenUIDAlice && (l.State != api.LeaseRunning || slices.Contains(l.PIDs, l.LauncherPID)) {
			t.Errorf("alice's lease %s, launcher %d among its pids %v; want running, the launcher apart", l.State, l.LauncherPID, l.PIDs)
		}
	}
	if launchers[tenUIDAlice] != alice.cmd.Process.Pid || launchers[tenUIDBob] != bob.cmd.Process.Pid {
		t.Errorf("launcher pids %v; want alice %d, bob %d", launchers, alice.cmd.Process.Pid, bob.cmd.Process.Pid)
	}

	own := ownView(st, tenUIDBob)
	oin := instanceOf(own, "a", 0)
	if oin.Unleased != nil || oin.UnleasedMemBytes != 0 || oin.MemUsedBytes != nil || oin.ServingUID != nil {
		t.Errorf("bob's view shows what MPS serves beside the leases: %+v", oin)
	}
	if len(own.Leases) != 1 || own.Leases[0].UID != tenUIDBob || own.Leases[0].LauncherPID != bob.cmd.Process.Pid {
		t.Errorf("bob's view of the leases %+v; want his own with his launcher %d", own.Leases, bob.cmd.Process.Pid)
	}

	_ = hp.cmd.Process.Kill()
	hp.wait(t)
	e.waitStatus("the client of no lease gone from status", func(st api.Status) bool {
		in := instanceOf(st, "a", 0)
		return len(in.Unleased) == 0 && in.UnleasedMemBytes == 0
	})
	// Across a restart of mpsd the lease shows the launcher that holds
	// it again, once it has resumed it.
	e.stop()
	e.start()
	e.waitStatus("alice's launcher resumed her lease", func(st api.Status) bool {
		return slices.ContainsFunc(st.Leases, func(l api.LeaseStatus) bool {
			return l.UID == tenUIDAlice && l.State == api.LeaseRunning && l.LauncherPID == alice.cmd.Process.Pid
		})
	})
	_ = alice.cmd.Process.Kill()
	alice.wait(t)
	if r := bob.wait(t); r.code != 0 {
		t.Fatalf("bob: exit %d, stderr %q", r.code, r.stderr)
	}
}

package mpsd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
)

// procsGroup is one instance (GPU 0) with room for a lease of several
// processes and a bystander, a default sm to divide, and a small client
// budget.
const procsGroup = `  a:
    users: [root]
    memory: 10G
    gpus: ["0"]
    default_sm: 10
    max_clients: 8
`

// procsWorkers is a server of workers under one lease: it starts n
// mpsemu-clients, each writing its limits line to <dir>/w<i>; once
// <dir>/more exists it starts one more (w<n+1>) than it declared; once
// <dir>/end exists it ends them all and exits 0.
func procsWorkers(client, dir string, n int) []string {
	script := fmt.Sprintf(`pids=""
for i in $(seq 1 %d); do "$0" --duration 5m > "$1/w$i" & pids="$pids $!"; done
while [ ! -e "$1/more" ] && [ ! -e "$1/end" ]; do sleep 0.02; done
if [ ! -e "$1/end" ]; then "$0" --duration 5m > "$1/w%d" & pids="$pids $!"; fi
while [ ! -e "$1/end" ]; do sleep 0.02; done
kill $pids; wait; exit 0`, n, n+1)
	return []string{"/bin/sh", "-c", script, client, dir}
}

// limitsLine is the line an mpsemu-client printed to file, once it has.
func limitsLine(file string) string {
	b, _ := os.ReadFile(file)
	line, _, _ := strings.Cut(string(b), "\n")
	return line
}

// A server of 4 workers under one lease of --sm 30 --procs 4: each worker
// gets 7% (30/4 rounded down), the lease is admitted with its 30% and
// charged 4 of the instance's clients, and status shows its share, its
// processes and the 4 MPS clients seen. A bystander lease on the same
// instance keeps its own 20%. A fifth worker the lease starts beyond its
// declaration gets 7% too (MPS limits each process; mpsd cannot stop the
// fork): status shows 5 clients, mpsd logs it, mpsctl flags it, and the
// bystander is untouched; a restart of mpsd keeps the lease's processes.
// Requests whose share cannot be divided, or
// whose processes exceed max_clients, are refused naming the bound.
func TestProcsDivideTheShare(t *testing.T) {
	e := newEnv(t, procsGroup, "")
	e.start()
	client := filepath.Join(e.emu, "mpsemu-client")

	// Refused before anything runs: mpsd names the bound.
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--procs", "11"}, "procs 11 is more than sm 10"},
		{[]string{"--sm", "50", "--procs", "9"}, `procs 9 is more than group "a" serves per instance (max_clients 8)`},
	} {
		r := run(t, e.launch(append(tc.args, "--", "/bin/true")...))
		if r.code != 125 || !strings.Contains(r.stderr, tc.says) {
			t.Errorf("mps-launch %v: exit %d, stderr %q; want 125 saying %q", tc.args, r.code, r.stderr, tc.says)
		}
	}

	dir := filepath.Join(e.dir, "procs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	byOut := filepath.Join(e.dir, "bystander")
	byStop := filepath.Join(e.dir, "bystander-stop")
	bystander := startProc(t, e.launch("--sm", "20", "--mem", "1G", "--", "/bin/sh", "-c",
		`"$0" --duration 5m > "$1" & c=$!; while [ ! -e "$2" ]; do sleep 0.02; done; kill $c; wait; exit 0`, client, byOut, byStop))
	server := startProc(t, e.launch(append([]string{"--sm", "30", "--procs", "4", "--mem", "2G", "--"}, procsWorkers(client, dir, 4)...)...))

	st := e.waitStatus("the server's 4 workers and the bystander seen as MPS clients", func(st api.Status) bool {
		n := 0
		for _, l := range st.Leases {
			if l.Clients != nil {
				n += *l.Clients
			}
		}
		return countLeases(st, api.LeaseRunning) == 2 && n == 5
	})
	var srv, by api.LeaseStatus
	for _, l := range st.Leases {
		if l.Procs == 4 {
			srv = l
		} else {
			by = l
		}
	}
	if srv.SM != 30 || srv.Procs != 4 || srv.SMPerProcess != 7 || srv.Clients == nil || *srv.Clients != 4 {
		t.Errorf("the server's lease in status: sm %d procs %d sm_per_process %d clients %v; want 30, 4, 7, 4", srv.SM, srv.Procs, srv.SMPerProcess, srv.Clients)
	}
	if by.SM != 20 || by.Procs != 1 || by.SMPerProcess != 20 || by.Clients == nil || *by.Clients != 1 {
		t.Errorf("the bystander in status: sm %d procs %d sm_per_process %d clients %v; want 20, 1, 20, 1", by.SM, by.Procs, by.SMPerProcess, by.Clients)
	}
	in := instanceOf(st, "a", 0)
	if in.SMAllocated != 50 || in.Clients != 2 || in.ClientsAllocated != 5 {
		t.Errorf("instance: sm_allocated %d, clients %d, clients_allocated %d; want 50 (the whole shares), 2 leases, 5 clients charged", in.SMAllocated, in.Clients, in.ClientsAllocated)
	}
	for i := 1; i <= 4; i++ {
		if line := limitsLine(filepath.Join(dir, fmt.Sprintf("w%d", i))); !strings.Contains(line, " sm=7.0 ") || !strings.Contains(line, " mem0=2048M") {
			t.Errorf("worker %d: %q, want sm=7.0 (30%% / 4) and mem0=2048M", i, line)
		}
	}
	if line := limitsLine(byOut); !strings.Contains(line, " sm=20.0 ") {
		t.Errorf("bystander: %q, want sm=20.0", line)
	}
	if r := e.mpsctl(0, "status"); r.code != 0 || !strings.Contains(r.stdout, " 4x7% ") {
		t.Errorf("mpsctl status: exit %d, want the lease's 4x7%%:\n%s%s", r.code, r.stdout, r.stderr)
	}

	// One more worker than declared: it is held to 7% as well, and the
	// lease is shown and logged as over its declaration.
	if err := os.WriteFile(filepath.Join(dir, "more"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	st = e.waitStatus("the fifth worker seen", func(st api.Status) bool {
		for _, l := range st.Leases {
			if l.ID == srv.ID {
				return l.Clients != nil && *l.Clients == 5
			}
		}
		return false
	})
	if line := limitsLine(filepath.Join(dir, "w5")); !strings.Contains(line, " sm=7.0 ") {
		t.Errorf("the fifth worker: %q, want sm=7.0", line)
	}
	e.waitLogAny("lease runs more MPS clients than the processes it declared")
	if r := e.mpsctl(0, "status"); !strings.Contains(r.stdout, "5!") ||
		!strings.Contains(r.stdout, srv.ID+": 5 MPS clients, more than its 4 declared processes (--procs): at 7% each they can take 35%, over its sm 30%") {
		t.Errorf("mpsctl status does not flag the lease over its processes:\n%s", r.stdout)
	}
	for _, l := range st.Leases {
		if l.ID == by.ID && (l.State != api.LeaseRunning || l.Attempt != 1 || l.Clients == nil || *l.Clients != 1) {
			t.Errorf("bystander after the fifth worker: %+v, want running, attempt 1, one client", l)
		}
	}
	if in := instanceOf(st, "a", 0); in.Restarts != 0 || in.SMAllocated != 50 {
		t.Errorf("instance after the fifth worker: %d restarts, sm_allocated %d; want 0, 50", in.Restarts, in.SMAllocated)
	}

	// A restart of mpsd keeps the lease's processes: its share is still
	// divided, and it is still charged its 4 clients.
	e.stop()
	e.start()
	e.waitStatus("both leases taken back with their processes", func(st api.Status) bool {
		for _, l := range st.Leases {
			if l.ID == srv.ID && (l.Procs != 4 || l.SMPerProcess != 7) {
				return false
			}
		}
		in := instanceOf(st, "a", 0)
		return countLeases(st, api.LeaseRunning) == 2 && in.SMAllocated == 50 && in.ClientsAllocated == 5
	})

	if err := os.WriteFile(filepath.Join(dir, "end"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(byStop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*proc{server, bystander} {
		if r := p.wait(t); r.code != 0 {
			t.Errorf("%v: exit %d, stderr %q", p.cmd.Args, r.code, r.stderr)
		}
	}
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

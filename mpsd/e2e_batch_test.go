package mpsd

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/gpu"
)

// batchLease posts a LeaseRequest and reads its stream until the grant,
// leaving the stream open (the lease lives while it is); cancel ends it.
func batchLease(t *testing.T, socket string, req api.LeaseRequest) (*api.Lease, context.CancelFunc) {
	t.Helper()
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://mpsd"+api.PathLeases, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	hreq.Header.Set("Content-Type", api.ContentTypeJSON)
	resp, err := inpClient(socket).Do(hreq)
	if err != nil {
		t.Fatalf("POST %s: %v", api.PathLeases, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s %+v: status %d", api.PathLeases, req, resp.StatusCode)
	}
	dec := api.NewEventDecoder(resp.Body)
	deadline := time.AfterFunc(15*time.Second, cancel)
	defer deadline.Stop()
	for {
		ev, err := dec.Next()
		if err != nil {
			t.Fatalf("lease %+v: stream ended before the grant: %v", req, err)
		}
		if ev.Type == api.EventGranted {
			return ev.Lease, func() { cancel(); _ = resp.Body.Close() }
		}
		if ev.Type == api.EventError {
			t.Fatalf("lease %+v: %s: %s", req, ev.Code, ev.Message)
		}
	}
}

// A batch system hands a job particular GPUs and a job id: the lease is
// confined to those GPUs even where placement alone would choose another,
// carries the job id in status and across an mpsd restart, and GPUs the
// host does not have are refused by name.
func TestGPUSelectAndJobID(t *testing.T) {
	e := newEnvGPUs(t, 3, `  a:
    users: [root]
    sm_percent: 100
    memory: 20G
    max_clients: 8
    default_sm: 10
    default_mem: 1G
`, "")
	e.start()

	// Binpack would put the second lease next to the first on GPU 0;
	// confinement puts it on GPU 2 (named by UUID prefix) and GPU 1.
	first, _ := batchLease(t, e.socket, api.LeaseRequest{Group: "a", JobID: "17"})
	onTwo, _ := batchLease(t, e.socket, api.LeaseRequest{Group: "a", JobID: "18.0", GPUSelect: []string{gpu.SimUUID(2)[:12]}})
	onOne, _ := batchLease(t, e.socket, api.LeaseRequest{Group: "a", GPUSelect: []string{"1"}})
	for _, c := range []struct {
		l    *api.Lease
		want int
	}{{first, 0}, {onTwo, 2}, {onOne, 1}} {
		if !slices.Equal(c.l.GPUIndexes, []int{c.want}) {
			t.Errorf("lease %s: GPUs %v, want [%d]", c.l.ID, c.l.GPUIndexes, c.want)
		}
	}
	jobs := func(st api.Status) map[string]string {
		m := map[string]string{}
		for _, l := range st.Leases {
			m[l.ID] = l.JobID
		}
		return m
	}
	want := map[string]string{first.ID: "17", onTwo.ID: "18.0", onOne.ID: ""}
	if got := jobs(e.d.Status()); !maps.Equal(got, want) {
		t.Errorf("status job ids %v, want %v", got, want)
	}

	for _, c := range []struct {
		name string
		sel  []string
		want []string
	}{
		{"unknown index", []string{"1", "7"}, []string{"gpu_select", `"7"`, "no GPU with index 7 (this host has 3 GPUs)"}},
		{"unknown UUID", []string{"GPU-ffffffff"}, []string{"gpu_select", "GPU-ffffffff"}},
		{"not a selector", []string{"one"}, []string{"gpu_select", `"one"`}},
	} {
		body, _ := json.Marshal(api.LeaseRequest{Group: "a", GPUSelect: c.sel})
		status, hdr, b := inpPost(t, e.socket, api.PathLeases, body)
		inpWantError(t, c.name, status, hdr, b, http.StatusUnprocessableEntity, api.CodeRefused, c.want...)
		// The host's GPU count is said once, by the selector's reason.
		if n := strings.Count(string(b), "this host has"); n > 1 {
			t.Errorf("%s: the refusal says the host's GPU count %d times: %s", c.name, n, b)
		}
	}

	// The job ids and the confinement are in the state file: after a
	// restart the re-adopted leases still carry them.
	e.stop()
	e.start()
	if got := jobs(e.d.Status()); !maps.Equal(got, want) {
		t.Errorf("after a restart, status job ids %v, want %v", got, want)
	}
	e.d.mu.Lock()
	only := e.d.leases[onTwo.ID].req.Only
	e.d.mu.Unlock()
	if !slices.Equal(only, []int{2}) {
		t.Errorf("after a restart, lease %s is confined to %v, want [2]", onTwo.ID, only)
	}
}

// A job confined to a drained GPU waits for it, keeping its place, without
// holding back the group's other requests: they are placed on the open GPU.
func TestConfinedToClosedGPUDoesNotBlockTheQueue(t *testing.T) {
	e := newEnvGPUs(t, 2, `  a:
    users: [root]
    sm_percent: 100
    memory: 20G
    default_sm: 10
    default_mem: 1G
`, "")
	e.start()
	body, _ := json.Marshal(api.AdminTarget{GPU: "0", Group: "a"})
	if status, _, b := inpPost(t, e.socket, api.PathDrain, body); status != http.StatusOK {
		t.Fatalf("drain: %d %s", status, b)
	}
	// The confined request is queued first.
	req, _ := json.Marshal(api.LeaseRequest{Group: "a", GPUSelect: []string{"0"}})
	hreq, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://mpsd"+api.PathLeases, bytes.NewReader(req))
	if err != nil {
		t.Fatal(err)
	}
	hreq.Header.Set("Content-Type", api.ContentTypeJSON)
	resp, err := inpClient(e.socket).Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	ev, err := api.NewEventDecoder(resp.Body).Next()
	if err != nil || ev.Type != api.EventQueued || ev.Position != 1 {
		t.Fatalf("confined to the drained GPU: first event %+v, %v; want queued at position 1", ev, err)
	}
	l, _ := batchLease(t, e.socket, api.LeaseRequest{Group: "a"})
	if !slices.Equal(l.GPUIndexes, []int{1}) {
		t.Errorf("the unconfined lease runs on %v, want [1]", l.GPUIndexes)
	}
	st := e.d.Status()
	if countLeases(st, api.LeaseQueued) != 1 {
		t.Errorf("want the confined lease still queued: %+v", st.Leases)
	}
}

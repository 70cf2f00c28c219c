package mpsd

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

const (
	capUIDHog   = 64173 // a member who fills an instance with tiny leases
	capUIDOther = 64174 // a member who still wants one
)

// One member's many small leases stop at limits.running_per_user (by
// default half of max_clients: 4 of 8): the rest wait, saying so, and are
// not refused; another member of the group is granted at once (--no-wait)
// while they wait, and they run once the first have ended.
func TestRunningPerUserCap(t *testing.T) {
	emutest.User(t, capUIDHog)
	emutest.User(t, capUIDOther)
	e := newEnvGPUs(t, 1, fmt.Sprintf(`  a:
    users: ["%d", "%d"]
    memory: 10G
    multiuser: true
    max_clients: 8
`, capUIDHog, capUIDOther), "")
	e.start()
	gateArgs, open := e.gate("hog")
	var hogs []*proc
	for range 8 {
		hogs = append(hogs, startProc(t, asUID(e.launch(append([]string{"--sm", "1", "--mem", "1M", "--"}, gateArgs...)...), capUIDHog)))
	}
	st := e.waitStatus("4 of the member's 8 leases running and 4 waiting", func(st api.Status) bool {
		return countLeases(st, api.LeaseRunning) == 4 && countLeases(st, api.LeaseQueued) == 4
	})
	for _, l := range st.Leases {
		if l.State == api.LeaseQueued && !strings.Contains(l.WaitReason, "limits.running_per_user (4)") {
			t.Errorf("queued lease %s waits with reason %q; want it to name limits.running_per_user (4)", l.ID, l.WaitReason)
		}
	}
	r := run(t, asUID(e.launch("--sm", "1", "--mem", "1M", "--no-wait", "--", "/bin/true"), capUIDOther))
	if r.code != 0 {
		t.Errorf("another member's lease beside the capped one: exit %d, stderr %q; want granted and exit 0", r.code, r.stderr)
	}
	open()
	for _, p := range hogs {
		if r := p.wait(t); r.code != 0 {
			t.Errorf("capped member's lease: exit %d, stderr %q; want it to wait, run and exit 0", r.code, r.stderr)
		}
	}
	e.waitStatus("every lease released", func(st api.Status) bool { return len(st.Leases) == 0 })
}

// One uid cannot hold every metrics connection: past
// limits.metrics_connections_per_user (on TCP loopback the uid owning the
// peer's socket) its connections are answered 503 over_limit naming the
// key, while another uid's connections and root's scrape are served.
func TestMetricsConnectionsPerUser(t *testing.T) {
	emutest.User(t, capUIDHog)
	emutest.User(t, capUIDOther)
	e := newEnv(t, fmt.Sprintf(`  a:
    users: ["%d", "%d"]
    memory: 10G
`, capUIDHog, capUIDOther), "limits:\n  metrics_connections: 8\n  metrics_connections_per_user: 3\n")
	e.opts.RequestTimeout = waitFor
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.opts.MetricsListener = mln
	e.start()
	helper := e.limBuild("connflood")
	hog := limStartFlood(t, helper, capUIDHog, "-tcp", mln.Addr().String(), "-n", "10")
	if hog.held != 3 || hog.refused != 7 {
		t.Errorf("metrics flood of 10 by uid %d: %d held, %d refused; want 3 and 7", capUIDHog, hog.held, hog.refused)
	}
	if me := api.DecodeError(503, strings.NewReader(hog.answer)); me.Code != api.CodeOverLimit ||
		!strings.Contains(me.Message, "limits.metrics_connections_per_user (3)") || !strings.Contains(me.Message, "uid "+strconv.Itoa(capUIDHog)) {
		t.Errorf("refused metrics connection: %q %q; want over_limit naming uid %d and limits.metrics_connections_per_user (3)", hog.status, hog.answer, capUIDHog)
	}
	other := limStartFlood(t, helper, capUIDOther, "-tcp", mln.Addr().String(), "-n", "2")
	if other.held != 2 || other.refused != 0 {
		t.Errorf("2 metrics connections of uid %d beside the capped one: %d held, %d refused; want both served", capUIDOther, other.held, other.refused)
	}
	resp, err := http.Get("http://" + mln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatalf("root's scrape beside them: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `mpsd_connections_refused_total{listener="metrics",reason="per_user"} 7`) {
		t.Errorf("root's scrape: %s; want 200 with 7 metrics connections refused per user", resp.Status)
	}
	hog.stop(t)
	other.stop(t)
}

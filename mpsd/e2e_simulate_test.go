package mpsd

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
)

// A multiuser group (the Kubernetes example's) comes up under --simulate:
// the simulated a100-40g reports driver 570, so the emulated control
// daemon behaves as 570's and takes -multiuser-server. Were it to imitate
// 550 whatever the model says, `-d -multiuser-server` would run as a
// client, exit "Cannot find MPS control daemon process", and mpsd would
// retry for ever without becoming ready.
func TestSimulateMultiuserGroup(t *testing.T) {
	e := newEnv(t, `  inference:
    users: [root]
    memory: 20G
    multiuser: true
`, "")
	e.start()
	st := e.d.Status()
	if len(st.Instances) != 2 {
		t.Fatalf("instances %+v; want one per simulated GPU", st.Instances)
	}
	for _, in := range st.Instances {
		if in.State != api.InstanceReady {
			t.Errorf("instance %s/%d: %s", in.Group, in.GPUIndex, in.State)
		}
	}
	r := run(t, e.launch("--sm", "30", "--", filepath.Join(e.emu, "mpsemu-client"), "--duration", "10ms"))
	if r.code != 0 || !strings.Contains(r.stdout+r.stderr, "sm=30.0") {
		t.Fatalf("launch on the multiuser instance: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

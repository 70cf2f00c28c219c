package mpsd

import (
	"net"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/api"
)

// mpsd shows each instance's driver and MPS binary version (the driver's
// CUDA version from 580 on), both from NVML, in status and in
// mpsd_mps_info, and sets CUDA_MPS_CLIENT_PRIORITY from the group's
// priority where the driver's MPS has it: below normal (1) for the group
// of priority -1, normal (0) for its neighbour of priority 0. On a 550
// host the status names the driver but no MPS version, and the priority
// is still set.
func TestMPSVersionAndClientPriority(t *testing.T) {
	for _, tt := range []struct {
		model, driver, mpsVersion string
	}{
		{"h200-141g", "580.159.04", "13000"},
		{"h100-80g", "550.163.01", ""},
	} {
		t.Run(tt.model, func(t *testing.T) {
			e := newEnvGPUs(t, 1, `  low:
    users: [root]
    memory: 10G
    priority: -1
  normal:
    users: [root]
    memory: 10G
`, "")
			e.simulateModel(tt.model)
			mln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			e.opts.MetricsListener = mln
			e.start()
			st := e.waitStatus("both instances with their versions", func(st api.Status) bool {
				n := 0
				for _, in := range st.Instances {
					if in.DriverVersion == tt.driver && in.MPSVersion == tt.mpsVersion {
						n++
					}
				}
				return n == 2
			})
			if got := e.admin(t, "status"); !strings.Contains(got, "MPS "+orDash(tt.mpsVersion)+" (driver "+tt.driver+"): 2 instances\n") {
				t.Errorf("mpsctl status does not show the versions %q/%q:\n%s", tt.mpsVersion, tt.driver, got)
			}
			fams := scrape(t, mln.Addr().String())
			for _, in := range st.Instances {
				if v, ok := value(fams, "mpsd_mps_info", map[string]string{"group": in.Group, "driver_version": tt.driver, "mps_version": tt.mpsVersion}); !ok || v != 1 {
					t.Errorf("mpsd_mps_info for %s: %v, %v; want 1", in.Group, v, ok)
				}
			}
			for group, want := range map[string]string{"low": "1", "normal": "0"} {
				r := run(t, e.launch("--group", group, "--", "/bin/sh", "-c", `echo "prio=${`+api.EnvClientPriority+`-unset}"`))
				if r.code != 0 || !strings.Contains(r.stdout, "prio="+want+"\n") {
					t.Errorf("group %s: exit %d, stdout %q; want prio=%s", group, r.code, r.stdout, want)
				}
			}
		})
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

package policy

import (
	"slices"
	"strings"
	"testing"
)

// A multiuser group needs a control daemon that takes -multiuser-server
// (driver 555 on): on an older driver the config is refused with one
// line naming the group, the key and the driver, whichever way it is
// read (Parse, LoadFile, CheckFile, the Watcher's reload); on a newer
// one, or when the driver is unknown, it is accepted.
func TestMultiuserNeedsDriver(t *testing.T) {
	const cfg = "version: 1\ngroups:\n  shared:\n    users: [alice, bob]\n    memory: 1G\n    multiuser: true\n  solo:\n    users: [alice, bob]\n    memory: 1G\n"
	const want = "groups.shared.multiuser: true needs NVIDIA driver 555 or newer (its MPS control daemon's -multiuser-server); this host runs 550.163.01"
	for _, tc := range []struct {
		driver string
		ok     bool
	}{
		{"550.163.01", false},
		{"535.261.03", false},
		{"555.58.02", true},
		{"570.172.08", true},
		{"580.159.04", true},
		{"", true},        // NVML did not say: nothing to check against
		{"garbage", true}, // likewise
	} {
		t.Run(tc.driver, func(t *testing.T) {
			_, err := Parse(strings.NewReader(cfg), Host{Users: testUsers, Driver: tc.driver})
			if tc.ok {
				if err != nil {
					t.Fatalf("driver %q: %v", tc.driver, err)
				}
				return
			}
			got := problemsOf(t, err)
			if tc.driver == "550.163.01" && !slices.Equal(got, []string{want}) {
				t.Errorf("problems %q\nwant    [%q]", got, want)
			}
			if len(got) != 1 || !strings.HasPrefix(got[0], "groups.shared.multiuser: ") || !strings.HasSuffix(got[0], "this host runs "+tc.driver) {
				t.Errorf("problems %q: want one line on groups.shared.multiuser naming %s", got, tc.driver)
			}
		})
	}

	path := writeFile(t, t.TempDir(), "mpsd.yaml", cfg)
	err := CheckFile(path, Host{Users: testUsers, GPUs: testGPUs, Driver: "550.163.01"})
	if got := problemsOf(t, err); !slices.Equal(got, []string{want}) {
		t.Errorf("CheckFile: problems %q, want [%q]", got, want)
	}
	if err := CheckFile(path, Host{Users: testUsers, GPUs: testGPUs, Driver: "555.58.02"}); err != nil {
		t.Errorf("CheckFile on 555: %v", err)
	}
}

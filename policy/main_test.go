package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeUsers is a user database for tests; a missing name is unknown.
type fakeUsers struct {
	users, groups map[string]uint32
}

var _ Users = fakeUsers{}

func (f fakeUsers) UserID(name string) (uint32, error) {
	if id, ok := f.users[name]; ok {
		return id, nil
	}
	return 0, fmt.Errorf("unknown user %q", name)
}

func (f fakeUsers) GroupID(name string) (uint32, error) {
	if id, ok := f.groups[name]; ok {
		return id, nil
	}
	return 0, fmt.Errorf("unknown unix group %q", name)
}

var testUsers = fakeUsers{
	users:  map[string]uint32{"root": 0, "svc-infer": 1500, "alice": 1001, "bob": 1002, "carol": 1003, "ops": 900},
	groups: map[string]uint32{"ml": 3000, "batch": 3001, "wheel": 10},
}

const gib = int64(1) << 30

// testGPUs is a host with two 40 GiB and two 80 GiB GPUs.
var testGPUs = []GPU{
	{Index: 0, UUID: "GPU-0aaaaaaa-1111-2222-3333-444444444444", Memory: 40 * gib},
	{Index: 1, UUID: "GPU-1bbbbbbb-1111-2222-3333-444444444444", Memory: 40 * gib},
	{Index: 2, UUID: "GPU-2ccccccc-1111-2222-3333-444444444444", Memory: 80 * gib},
	{Index: 3, UUID: "GPU-2cdddddd-1111-2222-3333-444444444444", Memory: 80 * gib},
}

// mustParse parses YAML that the test expects to be valid.
func mustParse(t testing.TB, yaml string, h Host) *Config {
	t.Helper()
	if h.Users == nil {
		h.Users = testUsers
	}
	cfg, err := Parse(strings.NewReader(yaml), h)
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, yaml)
	}
	return cfg
}

// writeFile writes data to dir/name and returns the path.
func writeFile(t testing.TB, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// minimal is the smallest valid config: a version and one group.
const minimal = `version: 1
groups:
  inference:
    users: [alice]
    memory: 16G
`

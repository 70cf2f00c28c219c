package policy

import (
	"fmt"
	"os"
	"testing"
)

// The example operators copy must stay valid: against the schema, and
// against the host it describes (8 H100 80GB, as NVML reports their memory).
func TestShippedExampleConfigIsValid(t *testing.T) {
	const h100 = 85520809984 // bytes NVML reports for an H100 SXM5 80GB
	gpus := make([]GPU, 8)
	for i := range gpus {
		gpus[i] = GPU{Index: i, UUID: fmt.Sprintf("GPU-%08x-0000-4000-8000-000000000000", i), Memory: h100}
	}
	f, err := os.Open("../examples/mpsd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := Parse(f, Host{GPUs: gpus, Users: testUsers})
	if err != nil {
		t.Fatalf("examples/mpsd.yaml: %v", err)
	}
	if len(c.Groups) != 2 {
		t.Fatalf("groups = %d, want the example's 2", len(c.Groups))
	}
	// The comment in the example promises two-GPU batch instances on 4-5 and 6-7.
	for _, g := range c.Groups {
		if g.Name == "batch" && fmt.Sprint(g.Instances) != "[[4 5] [6 7]]" {
			t.Errorf("batch instances = %v, want [[4 5] [6 7]]", g.Instances)
		}
	}
}

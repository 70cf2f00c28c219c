package policy

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/mpsd/mpsd/internal/units"
)

// Demand is what a client asks for (mps-launch --sm, --mem, --gpus);
// zero means "the group's default".
type Demand struct {
	// SM is the percent of each GPU's SMs, 1-100.
	SM int
	// Mem is the pinned device memory per GPU, in bytes.
	Mem int64
	// GPUs is how many GPUs: the group's gpus_per_instance, its
	// default, is the only number allowed.
	GPUs int
	// Procs is how many MPS client processes the lease runs (mps-launch
	// --procs), among which its SM share is divided; default 1.
	Procs int
}

// NewRequest checks a demand of uid against the group and completes it
// into a Request (Seq is left for mpsd to set). Zero fields take the
// group's defaults; mem is rounded down to a whole MiB, the granularity of
// MPS's limit, so what a lease is charged is what MPS enforces.
//
// A demand the group never allows fails with an error wrapping
// ErrInvalidRequest that lists every reason in plain words: sm outside
// 1-100 or above max_sm, mem negative, below 1M or above max_mem, gpus
// negative or other than the size of the group's instances
// (gpus_per_instance, also the default), procs outside 1 to
// MaxClientsLimit, above sm (each process's share, sm/procs, would be
// under 1%) or above max_clients (each process is a client of the
// server).
func (g *Group) NewRequest(uid uint32, d Demand) (Request, error) {
	var why []string
	sm := d.SM
	switch {
	case sm == 0:
		sm = g.DefaultSM
	case sm < 1 || sm > 100:
		why = append(why, fmt.Sprintf("sm %d is not a percentage from 1 to 100", sm))
	case sm > g.MaxSM:
		why = append(why, fmt.Sprintf("sm %d is more than group %q allows one client (max_sm %d)", sm, g.Name, g.MaxSM))
	}
	mem := d.Mem
	switch {
	case mem == 0:
		mem = g.DefaultMem
	case mem < 0:
		why = append(why, fmt.Sprintf("mem %d is negative", mem))
	case mem < units.MiB:
		why = append(why, fmt.Sprintf("mem %s is below 1M, the smallest limit MPS enforces", units.FormatSize(mem)))
	case mem > g.MaxMem:
		why = append(why, fmt.Sprintf("mem %s is more than group %q allows one client (max_mem %s)",
			units.FormatSize(mem), g.Name, units.FormatSize(g.MaxMem)))
	}
	mem = mem / units.MiB * units.MiB
	gpus := d.GPUs
	switch {
	case gpus == 0:
		gpus = g.GPUsPerInstance
	case gpus < 0:
		why = append(why, fmt.Sprintf("gpus %d is negative", gpus))
	case gpus != g.GPUsPerInstance:
		// A lease has its instance's GPUs, all of them: fewer would be
		// widened without the user knowing, more never fit.
		why = append(why, fmt.Sprintf("gpus %d: group %s's instances have %d GPU%s each; ask --gpus %d",
			gpus, g.Name, g.GPUsPerInstance, plural(g.GPUsPerInstance), g.GPUsPerInstance))
	}
	procs := d.Procs
	switch {
	case procs == 0:
		procs = 1
	case procs < 1 || procs > MaxClientsLimit:
		why = append(why, fmt.Sprintf("procs %d: want 1 to %d processes (MPS serves at most %d clients per GPU)", procs, MaxClientsLimit, MaxClientsLimit))
	case procs > sm && sm >= 1:
		why = append(why, fmt.Sprintf("procs %d is more than sm %d: each process would get sm/procs, under 1%% of the SMs (at most %d processes for sm %d)", procs, sm, sm, sm))
	case procs > g.MaxClients:
		why = append(why, fmt.Sprintf("procs %d is more than group %q serves per instance (max_clients %d)", procs, g.Name, g.MaxClients))
	}
	if len(why) > 0 {
		return Request{}, fmt.Errorf("%w: %s", ErrInvalidRequest, strings.Join(why, "; "))
	}
	return Request{Group: g.Name, UID: uid, SM: sm, Mem: mem, GPUs: gpus, Procs: procs, Priority: g.Priority}, nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// WithinAny reports whether r may run on one of sets (instances' GPU
// index sets): always without Only; with it, whether some set has every
// GPU in Only. A request confined to GPUs where its group has no whole
// instance can never run.
func (r *Request) WithinAny(sets [][]int) bool {
	for _, s := range sets {
		if r.allows(s) {
			return true
		}
	}
	return r.Only == nil
}

// DescribeSets words instances' GPU index sets for a user: "GPU 0, GPU 1"
// for one GPU each, "GPUs 0,1; GPUs 2,3" for pairs.
func DescribeSets(sets [][]int) string {
	words := make([]string, len(sets))
	for i, s := range sets {
		idx := make([]string, len(s))
		for j, g := range s {
			idx[j] = strconv.Itoa(g)
		}
		words[i] = "GPU" + plural(len(s)) + " " + strings.Join(idx, ",")
	}
	sep := ", "
	for _, s := range sets {
		if len(s) > 1 {
			sep = "; "
		}
	}
	return strings.Join(words, sep)
}

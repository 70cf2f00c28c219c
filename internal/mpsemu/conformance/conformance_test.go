package conformance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/mpsd/mpsd/internal/mpsemu/emutest"
)

// table collects scenario × generation outcomes for `make conformance`.
type table struct {
	mu      sync.Mutex
	cells   map[string]map[string]string // scenario -> gen -> outcome
	missing map[string]string            // gen -> why the real daemon is absent
}

func (tb *table) set(sc, gen, v string) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.cells[sc] == nil {
		tb.cells[sc] = map[string]string{}
	}
	tb.cells[sc][gen] = v
}

func (tb *table) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-34s", "scenario")
	for _, g := range emutest.Generations {
		fmt.Fprintf(&b, " %-22s", g+" "+emutest.RealVersion(g))
	}
	b.WriteString("\n")
	for _, sc := range Scenarios {
		fmt.Fprintf(&b, "%-34s", sc.Name)
		for _, g := range emutest.Generations {
			v := tb.cells[sc.Name][g]
			if v == "" {
				v = "-"
			}
			fmt.Fprintf(&b, " %-22s", v)
		}
		b.WriteString("\n")
	}
	gens := make([]string, 0, len(tb.missing))
	for g := range tb.missing {
		gens = append(gens, g)
	}
	sort.Strings(gens)
	for _, g := range gens {
		fmt.Fprintf(&b, "real %s not compared: %s\n", g, tb.missing[g])
	}
	return b.String()
}

func targets(bin, gen, realPath string) (real, emu Target) {
	real = Target{Name: "real-" + gen, Gen: gen, Control: realPath, BinDir: bin}
	emu = Target{
		Name: "emu-" + gen, Gen: gen,
		Control: filepath.Join(bin, emutest.ControlName), BinDir: bin,
		Env: []string{"MPSEMU_DRIVER=" + gen},
	}
	return real, emu
}

func applies(sc Scenario, gen string) bool {
	if sc.Gens == nil {
		return true
	}
	for _, g := range sc.Gens {
		if g == gen {
			return true
		}
	}
	return false
}

// TestConformance runs every scenario against NVIDIA's real daemon of each
// fetched generation and the emulator in that generation's mode.
func TestConformance(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("conformance scenarios start servers for uid 0 and 65534: run as root")
	}
	bin := emutest.BinDir(t)
	tb := &table{cells: map[string]map[string]string{}, missing: map[string]string{}}
	t.Cleanup(func() {
		out := tb.String()
		t.Logf("conformance table (identical / allowed: GPU-only difference / DIFFERS):\n%s", out)
		if path := os.Getenv("MPSD_CONFORMANCE_TABLE"); path != "" {
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				t.Errorf("write %s: %v", path, err)
			}
		}
	})
	for _, gen := range emutest.Generations {
		t.Run(gen, func(t *testing.T) {
			t.Parallel()
			realPath, err := emutest.RealControlPath(gen)
			if err != nil {
				tb.mu.Lock()
				tb.missing[gen] = err.Error()
				tb.mu.Unlock()
			}
			realPath = emutest.RealControl(t, gen) // skips, or fails in CI, with the reason
			realT, emuT := targets(bin, gen, realPath)
			for _, sc := range Scenarios {
				if !applies(sc, gen) {
					continue
				}
				t.Run(sc.Name, func(t *testing.T) {
					ctx := context.Background()
					a, err := Run(ctx, realT, sc, t.TempDir())
					if err != nil {
						t.Fatal(err)
					}
					b, err := Run(ctx, emuT, sc, t.TempDir())
					if err != nil {
						t.Fatal(err)
					}
					dump(t, gen, sc.Name, a, b)
					res := Compare(a, b)
					switch {
					case !res.Identical:
						tb.set(sc.Name, gen, "DIFFERS")
						t.Errorf("emulator differs from NVIDIA %s: %s", emutest.RealVersion(gen), res.Diff)
					case len(res.AllowedDiffs) > 0:
						tb.set(sc.Name, gen, "allowed")
						t.Logf("GPU-only differences: %s", strings.Join(res.AllowedDiffs, "; "))
					default:
						tb.set(sc.Name, gen, "identical")
					}
				})
			}
		})
	}
}

// TestHarnessIsDeterministic runs the real daemon twice per scenario: if the
// two transcripts differ, the harness (not the emulator) is at fault, and
// every emulator verdict would be noise.
func TestHarnessIsDeterministic(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("scenarios start servers for uid 0 and 65534: run as root")
	}
	bin := emutest.BinDir(t)
	realT, _ := targets(bin, "550", emutest.RealControl(t, "550"))
	for _, sc := range Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			a, err := Run(ctx, realT, sc, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			b, err := Run(ctx, realT, sc, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if res := Compare(a, b); !res.Identical {
				t.Errorf("two runs of the real daemon differ: %s", res.Diff)
			}
		})
	}
}

func TestCompareFlagsDifferences(t *testing.T) {
	a := Transcript{{What: "cmd", Text: "x"}, {What: "cmd2", Text: "y", Allowed: "gpu"}}
	for _, tc := range []struct {
		name      string
		b         Transcript
		identical bool
		allowed   int
	}{
		{"same", Transcript{{What: "cmd", Text: "x"}, {What: "cmd2", Text: "y", Allowed: "gpu"}}, true, 0},
		{"allowed step differs", Transcript{{What: "cmd", Text: "x"}, {What: "cmd2", Text: "z", Allowed: "gpu"}}, true, 1},
		{"plain step differs", Transcript{{What: "cmd", Text: "X"}, {What: "cmd2", Text: "y", Allowed: "gpu"}}, false, 0},
		{"missing step", Transcript{{What: "cmd", Text: "x"}}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Compare(a, tc.b)
			if res.Identical != tc.identical || len(res.AllowedDiffs) != tc.allowed {
				t.Errorf("Compare = %+v, want identical=%v allowed=%d", res, tc.identical, tc.allowed)
			}
		})
	}
}

func TestGroupByProcessKeepsEachProcessOrder(t *testing.T) {
	in := "[TS Control P1] a\n[TS Control P2] x\n[TS Control P1] b\n[TS Server P3] s\n[TS Control P2] y\n"
	want := "[TS Control P1] a\n[TS Control P1] b\n[TS Control P2] x\n[TS Control P2] y\n[TS Server P3] s\n"
	if got := groupByProcess(in); got != want {
		t.Errorf("groupByProcess:\n%s\nwant\n%s", got, want)
	}
}

// dump writes both transcripts under $MPSD_CONFORMANCE_DUMP, for comparing
// by eye while working on the emulator.
func dump(t *testing.T, gen, name string, real, emu Transcript) {
	dir := os.Getenv("MPSD_CONFORMANCE_DUMP")
	if dir == "" {
		return
	}
	dir = filepath.Join(dir, gen)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for suffix, tr := range map[string]Transcript{"real": real, "emu": emu} {
		if err := os.WriteFile(filepath.Join(dir, name+"."+suffix+".txt"), []byte(tr.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

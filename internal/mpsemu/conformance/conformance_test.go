package conformance

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
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
	for _, byGen := range tb.cells {
		if slices.Contains(slices.Collect(maps.Values(byGen)), "identical*") {
			b.WriteString("identical*: the first run differed and the second did not (a race of NVIDIA's daemon or the emulator; the difference is in the test log)\n")
			break
		}
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

// targets pairs NVIDIA's daemon with the emulator's. Both spawn the
// emulator's server in standalone mode: it never registers with a daemon,
// so to either one it is what a server without a GPU is to NVIDIA's daemon.
// The emulator's daemon is then judged on exactly what the real one can show.
// With a scenario setup (users), the programs run from its shared copy.
func targets(bin, gen, realPath string, su *setup) (real, emu Target) {
	standalone := "MPSEMU_SERVER_STANDALONE=1"
	if su != nil {
		bin, realPath = su.emuBin, su.real[gen]
	}
	real = Target{Name: "real-" + gen, Gen: gen, Control: realPath, BinDir: bin, Env: []string{standalone}}
	emu = Target{
		Name: "emu-" + gen, Gen: gen,
		Control: filepath.Join(bin, emutest.ControlName), BinDir: bin,
		Env: []string{"MPSEMU_DRIVER=" + gen, standalone},
	}
	if su != nil {
		real.Users, emu.Users, real.RunDir, emu.RunDir = su.users, su.users, su.base, su.base
	}
	return real, emu
}

// Test users, from the range this package's tests own.
const (
	uidOwner    = 64800
	uidMember   = 64801
	uidStranger = 64802
)

// setup is what scenarios run as other users need: the users (owner;
// member, whose process is in owner's group; stranger), a directory they
// may enter to run scenarios in, and copies there of the programs (the
// real daemons are fetched under root's home, which others cannot enter).
type setup struct {
	base   string
	emuBin string
	real   map[string]string // generation → its control program's copy
	users  map[string]Cred
}

func newSetup(t *testing.T, bin string) *setup {
	t.Helper()
	for _, uid := range []uint32{uidOwner, uidMember, uidStranger} {
		emutest.User(t, uid)
	}
	base := t.TempDir()
	// t.TempDir's parent is the test's own, made 0700.
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	su := &setup{base: base, emuBin: filepath.Join(base, "emu"), real: map[string]string{}, users: map[string]Cred{
		"owner":    {UID: uidOwner, GID: uidOwner, Groups: []uint32{}},
		"member":   {UID: uidMember, GID: uidMember, Groups: []uint32{uidOwner}},
		"stranger": {UID: uidStranger, GID: uidStranger, Groups: []uint32{}},
	}}
	copyProgram(t, filepath.Join(bin, emutest.ControlName), su.emuBin)
	copyProgram(t, filepath.Join(bin, emutest.ServerName), su.emuBin)
	for _, gen := range emutest.Generations {
		if path, err := emutest.RealControlPath(gen); err == nil {
			dir := filepath.Join(base, "real-"+gen)
			copyProgram(t, path, dir)
			su.real[gen] = filepath.Join(dir, emutest.ControlName)
		}
	}
	return su
}

// copyProgram copies the executable src into dir (made 0755), mode 0755.
func copyProgram(t *testing.T, src, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(src)), b, 0o755); err != nil {
		t.Fatal(err)
	}
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
	su := newSetup(t, bin)
	tb := &table{cells: map[string]map[string]string{}, missing: map[string]string{}}
	t.Cleanup(func() {
		out := tb.String()
		t.Logf("conformance table, NVIDIA's daemon vs the emulator in its mode (identical / DIFFERS; identical* = a first run differed, the second did not, difference logged):\n%s", out)
		if path := os.Getenv("MPSD_CONFORMANCE_TABLE"); path != "" {
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				t.Errorf("write %s: %v", path, err)
			}
		}
	})
	for _, gen := range emutest.Generations {
		t.Run(gen, func(t *testing.T) {
			t.Parallel()
			if _, err := emutest.RealControlPath(gen); err != nil {
				tb.mu.Lock()
				tb.missing[gen] = err.Error()
				tb.mu.Unlock()
			}
			realPath := emutest.RealControl(t, gen) // skips, or fails in CI, with the reason
			realT, emuT := targets(bin, gen, realPath, su)
			for _, sc := range Scenarios {
				if !applies(sc, gen) {
					continue
				}
				t.Run(sc.Name, func(t *testing.T) {
					res, once := runPair(t, realT, emuT, sc, func(a, b Transcript) { dump(t, gen, sc.Name, a, b) })
					switch {
					case !res.Identical:
						tb.set(sc.Name, gen, "DIFFERS")
						t.Errorf("emulator differs from NVIDIA %s, twice: %s", emutest.RealVersion(gen), res.Diff)
					case once != "":
						tb.set(sc.Name, gen, "identical*")
						t.Logf("first run differed, second identical: %s", once)
					default:
						tb.set(sc.Name, gen, "identical")
					}
				})
			}
		})
	}
}

// runPair runs sc on x and on y and compares the transcripts. NVIDIA's
// daemon has rare races no normalisation removes (doc.go), so a difference
// counts only if a second run shows one too; a difference that did not
// repeat is returned in once, for the log and the table (identical*), never
// dropped silently. each, if set, sees every pair of transcripts.
func runPair(t *testing.T, x, y Target, sc Scenario, each func(a, b Transcript)) (res Result, once string) {
	t.Helper()
	ctx := context.Background()
	for attempt := 1; attempt <= 2; attempt++ {
		a, err := Run(ctx, x, sc, runDir(t, x))
		if err != nil {
			t.Fatal(err)
		}
		b, err := Run(ctx, y, sc, runDir(t, y))
		if err != nil {
			t.Fatal(err)
		}
		if each != nil {
			each(a, b)
		}
		if res = Compare(a, b); res.Identical {
			return res, once
		}
		once = res.Diff
	}
	return res, ""
}

// runDir is a fresh directory for one run of a scenario on x: under its
// RunDir (where other users may enter), else the test's own.
func runDir(t *testing.T, x Target) string {
	t.Helper()
	if x.RunDir == "" {
		return t.TempDir()
	}
	d, err := os.MkdirTemp(x.RunDir, "run")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestHarnessIsDeterministic runs the real daemon twice per scenario: if the
// two transcripts differ, the harness (not the emulator) is at fault, and
// every emulator verdict would be noise.
func TestHarnessIsDeterministic(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("scenarios start servers for uid 0 and 65534: run as root")
	}
	bin := emutest.BinDir(t)
	path := emutest.RealControl(t, "550")
	realT, _ := targets(bin, "550", path, newSetup(t, bin))
	for _, sc := range Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			res, once := runPair(t, realT, realT, sc, nil)
			if !res.Identical {
				t.Errorf("two runs of the real daemon differ, twice: %s", res.Diff)
			} else if once != "" {
				t.Logf("two runs of the real daemon differed once: %s", once)
			}
		})
	}
}

func TestCompareFlagsDifferences(t *testing.T) {
	a := Transcript{{What: "cmd", Text: "x"}, {What: "cmd2", Text: "y"}}
	for _, tc := range []struct {
		name      string
		b         Transcript
		identical bool
	}{
		{"same", Transcript{{What: "cmd", Text: "x"}, {What: "cmd2", Text: "y"}}, true},
		{"output differs", Transcript{{What: "cmd", Text: "X"}, {What: "cmd2", Text: "y"}}, false},
		{"step differs", Transcript{{What: "cmd", Text: "x"}, {What: "other", Text: "y"}}, false},
		{"missing step", Transcript{{What: "cmd", Text: "x"}}, false},
		{"extra step", append(Transcript{{What: "cmd", Text: "x"}, {What: "cmd2", Text: "y"}}, Entry{What: "more"}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Compare(a, tc.b)
			if res.Identical != tc.identical || (!res.Identical && res.Diff == "") {
				t.Errorf("Compare = %+v, want identical=%v", res, tc.identical)
			}
		})
	}
}

func TestCloseUIEarlyOrdersTheRace(t *testing.T) {
	a := "[TS Control P1] Cmd:shutdown_server P2 -f\n[TS Control P1] UI closed\n[TS Control P1] Server P2 exited with status 0\n[TS Control P1] Removed Shm file at \n"
	b := "[TS Control P1] Cmd:shutdown_server P2 -f\n[TS Control P1] Server P2 exited with status 0\n[TS Control P1] Removed Shm file at \n[TS Control P1] UI closed\n"
	if ga, gb := groupByProcess(a), groupByProcess(b); ga != gb {
		t.Errorf("the two orders normalise differently:\n%s\n%s", ga, gb)
	}
	// A plain command's lines keep their order.
	c := "[TS Control P1] NEW UI\n[TS Control P1] Cmd:get_server_list\n[TS Control P1] UI closed\n"
	if got := groupByProcess(c); got != c {
		t.Errorf("groupByProcess reordered a plain command:\n%s", got)
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

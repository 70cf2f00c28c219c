package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// module is the import path of the repository's module.
const module = "github.com/mpsd/mpsd"

// composer is the only composition root: the mpsd command
// builds the daemon's parts and runs the daemon beside them.
const composer = "cmd/mpsd"

// daemonMustNotImport are the imports (a path and everything under it)
// that package mpsd's non-test code must not have: the daemon takes no
// flags, does not speak to systemd, does not serve the kubelet and does
// not know whether it is simulated. cmd/mpsd composes all of that.
var daemonMustNotImport = []string{
	"flag",
	"github.com/coreos/go-systemd",
	module + "/cmd",
	module + "/deviceplugin",
	module + "/internal/mpsemu",
	module + "/internal/sdnotify",
	module + "/internal/simhost",
}

// composedOnly are the packages whose only non-test importer is the
// composition root (besides their own subpackages): the daemon, and what
// cmd/mpsd puts beside it.
var composedOnly = []string{
	module + "/mpsd",
	module + "/deviceplugin",
	module + "/dra",
	module + "/internal/sdnotify",
	module + "/internal/simhost",
}

// besides are the packages that run beside the daemon and share a
// composed-only package's code: the DRA driver gives a claim's container
// what the device plugin gives a pod's (deviceplugin.ContainerEdits),
// through the same client of mpsd's API. Neither builds the daemon.
var besides = map[string][]string{
	module + "/dra": {module + "/deviceplugin"},
}

// under reports whether import path p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// simulationRefs lists what f names of the simulation: the gpu package's
// simulated host (any name with Sim in it: gpu.Sim, gpu.NewSim,
// gpu.SimSpec, gpu.ErrSimNotWatched..., and gpu.EnvXidSocket)
// and the config's simulate section (a field or method named Simulate).
func simulationRefs(fset *token.FileSet, f *ast.File) []string {
	gpuName := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == module+"/gpu" {
			gpuName = "gpu"
			if imp.Name != nil {
				gpuName = imp.Name.Name
			}
		}
	}
	var refs []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		name := sel.Sel.Name
		if x, ok := sel.X.(*ast.Ident); ok && gpuName != "" && x.Name == gpuName && (strings.Contains(name, "Sim") || name == "EnvXidSocket") {
			refs = append(refs, fset.Position(sel.Pos()).String()+": gpu."+name)
		} else if name == "Simulate" {
			refs = append(refs, fset.Position(sel.Pos()).String()+": ."+name)
		}
		return true
	})
	return refs
}

// Package mpsd is the daemon only: no flags, no systemd, no kubelet
// plugin, nothing that knows it is simulated.
func TestDaemonIsComposedElsewhere(t *testing.T) {
	root := repoRoot(t)
	checked := 0
	walkGo(t, root, func(rel string) {
		if strings.HasSuffix(rel, "_test.go") || !under(filepath.Dir(rel), "mpsd") {
			return
		}
		checked++
		src, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, rel, src, parser.SkipObjectResolution)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			for _, bad := range daemonMustNotImport {
				if under(p, bad) {
					t.Errorf("%s imports %s: package mpsd is the daemon only; flags, systemd, the kubelet plugin and simulation are composed in %s", rel, p, composer)
				}
			}
		}
		for _, ref := range simulationRefs(fset, f) {
			t.Errorf("%s names the simulation (%s): %s builds the simulated host and gives mpsd.New only its NVML, MPS programs and Xid injector", rel, ref, composer)
		}
	})
	if checked == 0 {
		t.Fatal("no Go files of package mpsd checked")
	}
}

// cmd/mpsd is the only composition root: nothing else builds the daemon
// or what runs beside it.
func TestOneCompositionRoot(t *testing.T) {
	root := repoRoot(t)
	importers := map[string]int{}
	walkGo(t, root, func(rel string) {
		if strings.HasSuffix(rel, "_test.go") {
			return
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, rel), nil, parser.ImportsOnly)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return
		}
		dir := module + "/" + filepath.ToSlash(filepath.Dir(rel))
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			for _, c := range composedOnly {
				if !under(p, c) {
					continue
				}
				if under(dir, c) || slices.Contains(besides[dir], c) {
					continue // its own subpackages, or a package beside it
				}
				if !under(dir, module+"/"+composer) {
					t.Errorf("%s imports %s: only %s composes the daemon and what runs beside it", rel, p, composer)
					continue
				}
				importers[c]++
			}
		}
	})
	for _, c := range composedOnly {
		if importers[c] == 0 {
			t.Errorf("%s does not import %s: the composition root has moved and this test checks nothing", composer, c)
		}
	}
}

// The checks see what they are meant to see.
func TestCompositionChecks(t *testing.T) {
	src := `package mpsd

import (
	g "github.com/mpsd/mpsd/gpu"
	"github.com/mpsd/mpsd/policy"
)

func f(c *policy.Config) {
	s, _ := g.NewSim(g.SimSpec{GPUs: c.Simulate.GPUs})
	_ = g.EnvXidSocket
	_ = s
	_ = g.ErrBadSelector
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range simulationRefs(fset, f) {
		got = append(got, r[strings.LastIndex(r, " ")+1:])
	}
	want := []string{"gpu.NewSim", "gpu.SimSpec", ".Simulate", "gpu.EnvXidSocket"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("simulationRefs = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		p, dir string
		want   bool
	}{
		{module + "/mpsd", module + "/mpsd", true},
		{module + "/mpsd/statefile", module + "/mpsd", true},
		{module + "/mpsdx", module + "/mpsd", false},
		{"github.com/coreos/go-systemd/v22/daemon", "github.com/coreos/go-systemd", true},
	} {
		if got := under(tc.p, tc.dir); got != tc.want {
			t.Errorf("under(%q, %q) = %v, want %v", tc.p, tc.dir, got, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(repoRoot(t), composer, "main.go")); err != nil {
		t.Errorf("the composition root %s: %v", composer, err)
	}
}

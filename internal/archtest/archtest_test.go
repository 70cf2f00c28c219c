package archtest

import (
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// execAllowed lists the directories whose non-test code may import os/exec.
// mps/ and internal/mpsemu/ run the MPS binaries; launcher/ runs the user's
// command; cgroup/ starts a command given to it directly inside a cgroup;
// internal/testrun is test tooling (make test's runner, the leftover
// check), which no product binary links (TestTestRunOnlyInTests).
var execAllowed = []string{"mps", "internal/mpsemu", "launcher", "cgroup", "internal/testrun"}

// testRunUsers are the directories whose non-test code may import
// internal/testrun: itself and the emulator's test helpers.
var testRunUsers = []string{"internal/testrun", "internal/mpsemu/emutest"}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s: %v", dir, err)
	}
	return dir
}

type pkgInfo struct {
	hasDoc bool
	files  int
}

// walkGo calls fn for every non-generated .go file outside testdata and
// hidden directories, with its path relative to the repository root.
func walkGo(t *testing.T, root string, fn func(rel string)) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") {
			rel, _ := filepath.Rel(root, path)
			fn(filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestEveryPackageHasDocComment(t *testing.T) {
	root := repoRoot(t)
	pkgs := map[string]*pkgInfo{}
	walkGo(t, root, func(rel string) {
		if strings.HasSuffix(rel, "_test.go") {
			return
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, rel), nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return
		}
		dir := filepath.Dir(rel)
		p := pkgs[dir]
		if p == nil {
			p = &pkgInfo{}
			pkgs[dir] = p
		}
		p.files++
		if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
			p.hasDoc = true
		}
	})
	if len(pkgs) == 0 {
		t.Fatal("no Go packages found")
	}
	for dir, p := range pkgs {
		if !p.hasDoc {
			t.Errorf("package %s has no package doc comment (put one in doc.go saying what it owns)", dir)
		}
	}
}

// productImports calls fn with each import of every non-test .go file
// and returns how many files it read.
func productImports(t *testing.T, fn func(rel, path string)) int {
	t.Helper()
	root := repoRoot(t)
	checked := 0
	walkGo(t, root, func(rel string) {
		if strings.HasSuffix(rel, "_test.go") {
			return
		}
		checked++
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, rel), nil, parser.ImportsOnly)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			fn(rel, path)
		}
	})
	if checked == 0 {
		t.Fatal("no Go files checked")
	}
	return checked
}

func TestOnlyAllowedPackagesRunPrograms(t *testing.T) {
	productImports(t, func(rel, path string) {
		if path == "os/exec" && !allowed(rel) {
			t.Errorf("%s imports os/exec; only %v may run external programs (docs/architecture.md#packages)", rel, execAllowed)
		}
	})
}

func TestTestRunOnlyInTests(t *testing.T) {
	root := repoRoot(t)
	walkGo(t, root, func(rel string) {
		if strings.HasSuffix(rel, "_test.go") {
			return
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, rel), nil, parser.ImportsOnly)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return
		}
		for _, imp := range f.Imports {
			if path, _ := strconv.Unquote(imp.Path.Value); path != "github.com/mpsd/mpsd/internal/testrun" {
				continue
			}
			ok := false
			for _, dir := range testRunUsers {
				ok = ok || strings.HasPrefix(rel, dir+"/")
			}
			if !ok {
				t.Errorf("%s imports internal/testrun, test tooling; only tests and %v may", rel, testRunUsers)
			}
		}
	})
}

func allowed(rel string) bool {
	for _, dir := range execAllowed {
		if strings.HasPrefix(rel, dir+"/") {
			return true
		}
	}
	return false
}

func TestAllowed(t *testing.T) {
	for _, tc := range []struct {
		rel  string
		want bool
	}{
		{"mps/daemon.go", true},
		{"internal/mpsemu/control/control.go", true},
		{"mpsd/instance.go", false},
		{"mpsx/a.go", false},
		{"cmd/mpsd/main.go", false},
	} {
		if got := allowed(tc.rel); got != tc.want {
			t.Errorf("allowed(%q) = %v, want %v", tc.rel, got, tc.want)
		}
	}
}

// TestNoKubernetesAPITypesInProducts: no product code imports Kubernetes'
// API types (k8s.io/api, k8s.io/apimachinery). Linked into mpsd they
// cost megabytes of every mpsd's resident memory (make bench's Footprint:
// 38 MiB idle became 45 with core/v1 for a pod's few fields); the device
// plugin decodes what it reads of a pod into its own types
// (internal/kubeinfo/pod.go). Tests may use them. The DRA driver (package
// dra, on client-go and the kubeletplugin helper: some 40 MiB more) is
// the one exception, built into mpsd only with the build tag dra: no file
// of the default build imports it.
func TestNoKubernetesAPITypesInProducts(t *testing.T) {
	root := repoRoot(t)
	optIn := 0
	productImports(t, func(rel, path string) {
		if strings.HasPrefix(rel, draDir+"/") {
			return
		}
		if !inDefaultBuild(t, filepath.Join(root, rel)) {
			optIn++
			return
		}
		if path == "k8s.io/api" || strings.HasPrefix(path, "k8s.io/api/") || strings.HasPrefix(path, "k8s.io/apimachinery/") ||
			path == "k8s.io/client-go" || strings.HasPrefix(path, "k8s.io/client-go/") || strings.HasPrefix(path, "k8s.io/dynamic-resource-allocation/") {
			t.Errorf("%s imports %s; product code decodes the few Kubernetes fields it reads into its own types", rel, path)
		}
		if path == module+"/"+draDir {
			t.Errorf("%s imports %s in mpsd's default build; only files built with the tag dra may", rel, path)
		}
	})
	if optIn == 0 {
		t.Errorf("no product file is built only with the tag dra: the DRA driver's composition has moved and this test checks nothing")
	}
}

// draDir is the DRA driver's package, linked only into builds with the
// tag dra.
const draDir = "dra"

// inDefaultBuild reports whether the file's //go:build constraint (if
// any) holds without build tags, on linux.
func inDefaultBuild(t *testing.T, file string) bool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "package ") {
			break
		}
		if constraint.IsGoBuild(line) {
			expr, err := constraint.Parse(line)
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			return expr.Eval(func(tag string) bool { return tag == "linux" || tag == "unix" || tag == "cgo" })
		}
	}
	return true
}

package policy

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestImportsStayPure keeps decisions independent of the rest of the
// project: policy may use the pure leaves internal/units and
// internal/gpusel and nothing else of it, so mpsd copies gpu/ and instance
// state into policy's own types, and the selector grammar gpu/ shares
// comes from internal/gpusel rather than from gpu/, which needs cgo.
func TestImportsStayPure(t *testing.T) {
	allowedImports := []string{"github.com/mpsd/mpsd/internal/units", "github.com/mpsd/mpsd/internal/gpusel"}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(path, "github.com/mpsd/mpsd/") && !slices.Contains(allowedImports, path) {
				t.Errorf("%s imports %s; policy may import only %v of this project", name, path, allowedImports)
			}
			if path == "os/exec" || path == "log" || path == "log/slog" {
				t.Errorf("%s imports %s; policy neither runs programs nor logs", name, path)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no files checked")
	}
}

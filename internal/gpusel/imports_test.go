package gpusel

import (
	"go/build"
	"strings"
	"testing"
)

// TestStaysLeaf keeps the package importable from policy/, which must stay
// pure: no cgo, only the standard library, nothing that does I/O or logs.
func TestStaysLeaf(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkg.CgoFiles) > 0 {
		t.Errorf("%v use cgo; gpusel is pure Go so policy/ stays free of it", pkg.CgoFiles)
	}
	if len(pkg.Imports) == 0 {
		t.Fatal("no imports found; the check would pass without looking")
	}
	for _, path := range pkg.Imports {
		first, _, _ := strings.Cut(path, "/")
		switch {
		case strings.Contains(first, "."):
			t.Errorf("imports %s; gpusel imports only the standard library", path)
		case path == "C" || path == "unsafe":
			t.Errorf("imports %s; gpusel is pure Go so policy/ stays free of cgo", path)
		case first == "os" || first == "io" || first == "net" || first == "log" || first == "syscall":
			t.Errorf("imports %s; gpusel does no I/O and never logs", path)
		}
	}
}

package mpsd

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The MPS model's fields are its own: no product file of package mpsd but
// mpsmodel.go reads or writes one; they ask and tell it through its
// methods. The check is syntactic: a selector .mps.<field>, or a field of
// a value of the model's type named so, outside mpsmodel.go.
func TestMPSModelFieldsAreItsOwn(t *testing.T) {
	fset := token.NewFileSet()
	model, err := parser.ParseFile(fset, "mpsmodel.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var fields []string
	ast.Inspect(model, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "mpsModel" {
			return true
		}
		for _, f := range ts.Type.(*ast.StructType).Fields.List {
			for _, name := range f.Names {
				fields = append(fields, name.Name)
			}
		}
		return false
	})
	if len(fields) == 0 {
		t.Fatal("no fields found in mpsModel: the check checks nothing")
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, file := range files {
		if file == "mpsmodel.go" || strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok || !slices.Contains(fields, sel.Sel.Name) {
				return true
			}
			if inner, ok := sel.X.(*ast.SelectorExpr); ok && inner.Sel.Name == "mps" {
				t.Errorf("%s: %s.%s reaches into the MPS model's field %s; ask it through a method of mpsModel", fset.Position(sel.Pos()), exprString(inner), sel.Sel.Name, sel.Sel.Name)
			}
			return true
		})
	}
	if checked < 10 {
		t.Fatalf("only %d product files checked", checked)
	}
}

// exprString is a short rendering of a selector chain.
func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	}
	return "…"
}

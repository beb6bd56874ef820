package otelretry

import (
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestPackageCommentNames checks that the package comment names every
// instrument New creates (without its "retryhttp." prefix), as
// TestGuideNames checks docs/guide-metrics.md.
func TestPackageCommentNames(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "otelretry.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.SelectorExpr); !ok || x.Sel.Name != "meter" {
			return true
		}
		if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			name, _ := strconv.Unquote(lit.Value)
			names = append(names, name)
		}
		return true
	})
	if len(names) != 14 {
		t.Fatalf("got %d instruments created in New; want 14 (update this test and the package comment together)", len(names))
	}
	doc := f.Doc.Text()
	for _, name := range names {
		short := strings.TrimPrefix(name, "retryhttp.")
		if !regexp.MustCompile(`(?:^|[\s(])` + regexp.QuoteMeta(short) + `(?:[\s,():]|$)`).MatchString(doc) {
			t.Errorf("%s: created by New, not in the package comment", name)
		}
	}
}

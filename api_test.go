package retryhttp

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"slices"
	"strings"
	"testing"
)

// The exported API's size, held so that it cannot grow back unnoticed
// (docs/design.md, "An API half the size"). A name is counted once: a
// top-level type, func, const or var; a method of an exported type; an
// exported field of an exported struct; a method of an exported
// interface.
const (
	maxRootTopLevel = 50
	maxRootNames    = 120
	maxLibraryNames = 220
)

// libraryDirs are the library's packages: the root, its test kit and the
// nested modules a user imports. The lab (lab/), internal/, docs/ and
// examples/ are not counted.
var libraryDirs = []string{".", "retryhttptest", "otelretry", "redisbudget", "integration"}

// apiNames are the exported names of the package in dir, from its non-test
// files: top-level names, then methods and fields as Type.Name.
type apiNames struct{ top, members []string }

func (a apiNames) total() int { return len(a.top) + len(a.members) }

func exportedNames(t *testing.T, dir string) apiNames {
	t.Helper()
	fset := token.NewFileSet()
	notTest := func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }
	pkgs, err := parser.ParseDir(fset, dir, notTest, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var a apiNames
	for _, p := range pkgs {
		exported := map[string]bool{}
		for _, f := range p.Files {
			for _, d := range f.Decls {
				if g, ok := d.(*ast.GenDecl); ok {
					for _, s := range g.Specs {
						if ts, ok := s.(*ast.TypeSpec); ok && ts.Name.IsExported() {
							exported[ts.Name.Name] = true
						}
					}
				}
			}
		}
		for _, f := range p.Files {
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if !d.Name.IsExported() {
						continue
					}
					if d.Recv == nil {
						a.top = append(a.top, d.Name.Name)
						continue
					}
					if recv := receiverName(d.Recv.List[0].Type); exported[recv] {
						a.members = append(a.members, recv+"."+d.Name.Name)
					}
				case *ast.GenDecl:
					for _, s := range d.Specs {
						a.addSpec(s)
					}
				}
			}
		}
	}
	slices.Sort(a.top)
	slices.Sort(a.members)
	return a
}

func (a *apiNames) addSpec(s ast.Spec) {
	switch s := s.(type) {
	case *ast.ValueSpec:
		for _, n := range s.Names {
			if n.IsExported() {
				a.top = append(a.top, n.Name)
			}
		}
	case *ast.TypeSpec:
		if !s.Name.IsExported() {
			return
		}
		a.top = append(a.top, s.Name.Name)
		var list *ast.FieldList
		switch t := s.Type.(type) {
		case *ast.StructType:
			list = t.Fields
		case *ast.InterfaceType:
			list = t.Methods
		}
		if list == nil {
			return
		}
		for _, f := range list.List {
			for _, n := range f.Names {
				if n.IsExported() {
					a.members = append(a.members, s.Name.Name+"."+n.Name)
				}
			}
		}
	}
}

// receiverName is the type a method's receiver names, without * or type
// parameters.
func receiverName(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	switch x := e.(type) {
	case *ast.IndexExpr:
		e = x.X
	case *ast.IndexListExpr:
		e = x.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

func TestRootAPISize(t *testing.T) {
	a := exportedNames(t, ".")
	t.Logf("root: %d top-level, %d in all\ntop: %v\nmembers: %v", len(a.top), a.total(), a.top, a.members)
	if len(a.top) > maxRootTopLevel {
		t.Errorf("got %d top-level names; want at most %d", len(a.top), maxRootTopLevel)
	}
	if a.total() > maxRootNames {
		t.Errorf("got %d exported names; want at most %d", a.total(), maxRootNames)
	}
}

func TestLibraryAPISize(t *testing.T) {
	total := 0
	for _, dir := range libraryDirs {
		a := exportedNames(t, dir)
		t.Logf("%s: %d top-level, %d in all", dir, len(a.top), a.total())
		total += a.total()
	}
	if total > maxLibraryNames {
		t.Errorf("got %d exported names in the library's packages; want at most %d", total, maxLibraryNames)
	}
}

// TestAPICounter checks the counter on a package of known shape.
func TestAPICounter(t *testing.T) {
	a := exportedNames(t, "testdata/apicount")
	want := apiNames{
		top:     []string{"C", "F", "I", "T", "V"},
		members: []string{"I.M", "T.Field", "T.Hidden", "T.Method"},
	}
	if !slices.Equal(a.top, want.top) || !slices.Equal(a.members, want.members) {
		t.Errorf("got %v %v; want %v %v", a.top, a.members, want.top, want.members)
	}
}

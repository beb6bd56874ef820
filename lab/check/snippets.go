package check

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// imports are the package names a snippet may use without importing them:
// the checker adds the import of each one the snippet uses. A snippet that
// uses another package fails with "undefined"; add it here (and, outside
// the standard library, to deps.go).
var imports = map[string]string{
	"bytes":         "bytes",
	"context":       "context",
	"errors":        "errors",
	"fmt":           "fmt",
	"io":            "io",
	"json":          "encoding/json",
	"log":           "log",
	"net":           "net",
	"os":            "os",
	"slog":          "log/slog",
	"strings":       "strings",
	"sync":          "sync",
	"synctest":      "testing/synctest",
	"testing":       "testing",
	"time":          "time",
	"url":           "net/url",
	"http":          "net/http",
	"httptest":      "net/http/httptest",
	"httputil":      "net/http/httputil",
	"retryhttp":     "github.com/herdproof/retryhttp",
	"retryhttptest": "github.com/herdproof/retryhttp/retryhttptest",
	"otelretry":     "github.com/herdproof/retryhttp/otelretry",
	"redisbudget":   "github.com/herdproof/retryhttp/redisbudget",
	"integration":   "github.com/herdproof/retryhttp/integration",
	"redis":         "github.com/redis/go-redis/v9",
	"otel":          "go.opentelemetry.io/otel",
	"attribute":     "go.opentelemetry.io/otel/attribute",
	"aws":           "github.com/aws/aws-sdk-go-v2/aws",
	"retry":         "github.com/aws/aws-sdk-go-v2/aws/retry",
	"dynamodb":      "github.com/aws/aws-sdk-go-v2/service/dynamodb",
	"stripe":        "github.com/stripe/stripe-go/v82",
}

// A Go snippet's directive, the HTML comment right before its fence:
//
//	<!--go var req *http.Request-->        declarations the snippet needs (a hidden prelude)
//	<!--go quote: example_test.go ExampleReport-->  the snippet is that function's body, verbatim
//	<!--go skip: why-->                    not compiled (say why)
func goDirective(f Fence) (kind, arg string) {
	d := strings.TrimSpace(f.Directive)
	if d != "go" && !strings.HasPrefix(d, "go ") && !strings.HasPrefix(d, "go\n") {
		return "prelude", ""
	}
	d = strings.TrimSpace(d[2:])
	for _, k := range []string{"skip:", "quote:"} {
		if strings.HasPrefix(d, k) {
			return strings.TrimSuffix(k, ":"), strings.TrimSpace(d[len(k):])
		}
	}
	return "prelude", d
}

var (
	placeholderLine  = regexp.MustCompile(`(?m)^(\s*)\.\.\.\s*$`)
	placeholderBlock = regexp.MustCompile(`\{ \.\.\. \}`)
)

// unplaceholder turns the "..." that stand for omitted code into comments,
// so that the snippet parses.
func unplaceholder(code string) string {
	code = placeholderLine.ReplaceAllString(code, "$1//…")
	return placeholderBlock.ReplaceAllString(code, "{ /*…*/ }")
}

func replaceholder(code string) string {
	code = regexp.MustCompile(`(?m)^(\s*)//…$`).ReplaceAllString(code, "$1...")
	return strings.ReplaceAll(code, "{ /*…*/ }", "{ ... }")
}

// Gofmt checks that a snippet is as gofmt would print it.
func Gofmt(d *Doc, f Fence) error {
	src := unplaceholder(f.Code)
	out, err := format.Source([]byte(src))
	if err != nil {
		return d.Errorf(f.Line, "gofmt: %v", err)
	}
	if got := replaceholder(string(out)); got != f.Code {
		return d.Errorf(f.Line, "not gofmt-clean; gofmt prints:\n%s", got)
	}
	return nil
}

// Quote checks a snippet that quotes a Go file (path relative to root),
// or one function's body in it, verbatim. The quoted file is built and
// tested where it lives (an Example's Output is checked by go test).
func Quote(root string, d *Doc, f Fence, arg string) error {
	fields := strings.Fields(arg)
	if len(fields) == 0 || len(fields) > 2 {
		return d.Errorf(f.DirectiveLine, "quote: want a file and optionally a function, got %q", arg)
	}
	b, err := os.ReadFile(filepath.Join(root, fields[0]))
	if err != nil {
		return d.Errorf(f.DirectiveLine, "quote: %v", err)
	}
	want := string(b)
	if len(fields) == 2 {
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, fields[0], b, parser.ParseComments)
		if err != nil {
			return d.Errorf(f.DirectiveLine, "quote: %v", err)
		}
		want = ""
		for _, decl := range file.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Name.Name == fields[1] && fn.Body != nil {
				body := string(b[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset])
				want = dedent(strings.TrimPrefix(body, "\n"))
			}
		}
		if want == "" {
			return d.Errorf(f.DirectiveLine, "quote: no function %s in %s", fields[1], fields[0])
		}
	}
	if f.Code != want {
		return d.Errorf(f.Line, "differs from %s; it should read:\n%s", arg, want)
	}
	return nil
}

// dedent removes one tab from every line.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	return strings.Join(lines, "\n")
}

// snippetSource makes a compilable file of a snippet: its package clause,
// the imports of the package names it uses, its prelude, and its code,
// wrapped in a function when it is statements. Names a statement snippet
// declares and leaves unused (a fragment often does) are used, as are
// those of a block whose code is "...". //line comments keep positions
// those of the markdown file.
func snippetSource(d *Doc, f Fence, prelude string) (string, error) {
	code := unplaceholder(f.Code)
	var body strings.Builder
	if prelude != "" {
		fmt.Fprintf(&body, "//line %s:%d\n%s\n", d.Path, f.DirectiveLine, prelude)
	}
	stmts := false
	switch {
	case strings.HasPrefix(code, "package "):
	case parses("package p\n" + prelude + "\n" + code):
		fmt.Fprintf(&body, "//line %s:%d\n%s", d.Path, f.Line+1, code)
	default:
		// Statements, in a function that may return an error.
		stmts = true
		fmt.Fprintf(&body, "func _() (err error) {\n//line %s:%d\n%s}\n", d.Path, f.Line+1, code)
	}
	if strings.HasPrefix(code, "package ") {
		return code, nil
	}
	src := "package snippet\n\n" + body.String()
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "", src, parser.ParseComments)
	if err != nil {
		return "", d.Errorf(f.Line, "does not parse: %v", err)
	}
	// The imports of the package names used and not declared.
	var paths []string
	seen := map[string]bool{}
	for _, id := range file.Unresolved {
		if p, ok := imports[id.Name]; ok && !seen[p] && usedAsPackage(file, id.Name) {
			seen[p] = true
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	// Uses of declared names, inserted without a newline so that positions
	// stay right.
	type insert struct {
		at   int
		text string
	}
	var inserts []insert
	var placeholders []token.Pos
	for _, c := range file.Comments {
		for _, cm := range c.List {
			if cm.Text == "//…" || cm.Text == "/*…*/" {
				placeholders = append(placeholders, cm.Pos())
			}
		}
	}
	useDeclared := func(b *ast.BlockStmt, tail string) {
		var names []string
		for _, s := range b.List {
			switch s := s.(type) {
			case *ast.AssignStmt:
				if s.Tok == token.DEFINE {
					for _, e := range s.Lhs {
						if id, ok := e.(*ast.Ident); ok && id.Name != "_" {
							names = append(names, id.Name)
						}
					}
				}
			case *ast.DeclStmt:
				if g, ok := s.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
					for _, sp := range g.Specs {
						for _, id := range sp.(*ast.ValueSpec).Names {
							if id.Name != "_" {
								names = append(names, id.Name)
							}
						}
					}
				}
			}
		}
		if len(names) == 0 && tail == "" {
			return
		}
		at := b.Rbrace
		if n := len(b.List); n > 0 {
			switch b.List[n-1].(type) {
			case *ast.ReturnStmt, *ast.BranchStmt:
				at = b.List[n-1].Pos()
			}
		}
		var text strings.Builder
		for _, n := range names {
			fmt.Fprintf(&text, "_ = %s; ", n)
		}
		if at == b.Rbrace {
			text.WriteString(tail)
		}
		inserts = append(inserts, insert{fset.Position(at).Offset, text.String()})
	}
	ast.Inspect(file, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			if stmts && n.Name.Name == "_" && n.Body != nil {
				useDeclared(n.Body, "return; ") // the function's end, if the snippet's is not a return
			}
		case *ast.BlockStmt:
			for _, p := range placeholders {
				if n.Lbrace < p && p < n.Rbrace && innermost(n, p) {
					useDeclared(n, "")
					break
				}
			}
		}
		return true
	})
	sort.Slice(inserts, func(i, j int) bool { return inserts[i].at > inserts[j].at })
	out := src
	for _, in := range inserts {
		out = out[:in.at] + in.text + out[in.at:]
	}
	if len(paths) > 0 {
		var imp strings.Builder
		imp.WriteString("import (\n")
		for _, p := range paths {
			fmt.Fprintf(&imp, "\t%q\n", p)
		}
		imp.WriteString(")\n\n")
		out = strings.Replace(out, "package snippet\n\n", "package snippet\n\n"+imp.String(), 1)
	}
	return out, nil
}

// innermost reports whether no block inside b also contains p.
func innermost(b *ast.BlockStmt, p token.Pos) bool {
	inner := false
	ast.Inspect(b, func(n ast.Node) bool {
		if c, ok := n.(*ast.BlockStmt); ok && c != b && c.Lbrace < p && p < c.Rbrace {
			inner = true
		}
		return !inner
	})
	return !inner
}

func usedAsPackage(file *ast.File, name string) bool {
	used := false
	ast.Inspect(file, func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := s.X.(*ast.Ident); ok && id.Name == name {
				used = true
			}
		}
		return !used
	})
	return used
}

func parses(src string) bool {
	_, err := parser.ParseFile(token.NewFileSet(), "", src, 0)
	return err == nil
}

// Snippets checks every Go snippet of docs: gofmt, the quotes, and one
// go vet over all the others, each built as a package of its own in a
// module made from this one's go.mod (with its replace directives made
// absolute, so that the snippets build against this checkout). checkDir is
// this module's folder, root the repository's.
func Snippets(root, checkDir string, docs []*Doc) []error {
	var errs []error
	type built struct {
		doc  *Doc
		line int
		src  string
	}
	var pkgs []built
	for _, d := range docs {
		for _, f := range d.Fences {
			if f.Lang != "go" {
				continue
			}
			kind, arg := goDirective(f)
			switch kind {
			case "skip":
				if arg == "" {
					errs = append(errs, d.Errorf(f.DirectiveLine, "go skip: say why"))
				}
				continue
			case "quote":
				if err := Quote(root, d, f, arg); err != nil {
					errs = append(errs, err)
				}
			}
			if err := Gofmt(d, f); err != nil {
				errs = append(errs, err)
			}
			if kind == "quote" {
				continue
			}
			src, err := snippetSource(d, f, arg)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			pkgs = append(pkgs, built{d, f.Line, src})
		}
	}
	if len(pkgs) == 0 {
		return errs
	}
	dir, err := os.MkdirTemp("", "docscheck-")
	if err != nil {
		return append(errs, err)
	}
	defer os.RemoveAll(dir)
	if err := writeModule(checkDir, dir); err != nil {
		return append(errs, err)
	}
	var index strings.Builder
	for i, p := range pkgs {
		pkg := filepath.Join(dir, fmt.Sprintf("s%02d", i))
		if err := os.Mkdir(pkg, 0o755); err != nil {
			return append(errs, err)
		}
		if err := os.WriteFile(filepath.Join(pkg, "snippet.go"), []byte(p.src), 0o644); err != nil {
			return append(errs, err)
		}
		fmt.Fprintf(&index, "  s%02d: %s:%d\n", i, p.doc.Path, p.line)
	}
	cmd := exec.Command("go", "vet", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("go vet of the snippets: %v\n%s\n(packages: the snippet at)\n%s", err, out, index.String()))
	}
	return errs
}

// writeModule writes dir/go.mod and dir/go.sum: this module's, renamed,
// with its relative replace directives made absolute.
func writeModule(checkDir, dir string) error {
	mod, err := os.ReadFile(filepath.Join(checkDir, "go.mod"))
	if err != nil {
		return err
	}
	abs, err := filepath.Abs(checkDir)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(string(mod), "\n") {
		switch {
		case strings.HasPrefix(line, "module "):
			line = "module docscheck/snippets\n"
		case strings.Contains(line, "=> ."):
			i := strings.Index(line, "=> ") + 3
			line = line[:i] + filepath.Join(abs, strings.TrimSpace(line[i:])) + "\n"
		}
		out.WriteString(line)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), out.Bytes(), 0o644); err != nil {
		return err
	}
	sum, err := os.ReadFile(filepath.Join(checkDir, "go.sum"))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644)
}

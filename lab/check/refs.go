package check

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

var (
	numbered = regexp.MustCompile(`^(\d+)\. `)
	link     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// A section reference: "docs/herd.md §4", "[herd.md](herd.md) §4",
	// "§4" (this file's), "sections 1 and 2"; not "RFC 9110 §10.2.3".
	sectionRef = regexp.MustCompile(`(?:([\w./-]+\.md)\)?\s+)?§(\d+)\b|(RFC \d+ )§`)
)

// sections returns a doc's numbered sections ("## 4. Layers") by number.
func sections(d *Doc) map[int]Heading {
	out := map[int]Heading{}
	for _, h := range d.Headings {
		if m := numbered.FindStringSubmatch(h.Text); m != nil {
			n, _ := strconv.Atoi(m[1])
			out[n] = h
		}
	}
	return out
}

// References checks, in every doc: that numbered sections are numbered 1,
// 2, 3 ... once each; that every "§N" names a section of the file it is
// about (its own, or the .md file named right before it); and that every
// relative link names a file that exists and, with #anchor, a heading in
// it.
func References(root string, docs []*Doc) []error {
	var errs []error
	byPath := map[string]*Doc{}
	for _, d := range docs {
		byPath[filepath.Clean(d.Path)] = d
	}
	find := func(from *Doc, name string) *Doc {
		for _, p := range []string{filepath.Join(filepath.Dir(from.Path), name), name} {
			if d, ok := byPath[filepath.Clean(p)]; ok {
				return d
			}
		}
		return nil
	}
	for _, d := range docs {
		next := 1
		for _, h := range d.Headings {
			m := numbered.FindStringSubmatch(h.Text)
			if m == nil {
				continue
			}
			if n, _ := strconv.Atoi(m[1]); n != next {
				errs = append(errs, d.Errorf(h.Line, "section %d after section %d; want %d", n, next-1, next))
			}
			next++
		}
		inFence := fenceLines(d)
		for i, line := range d.Lines {
			if inFence[i+1] {
				continue
			}
			for _, m := range sectionRef.FindAllStringSubmatch(line, -1) {
				if m[3] != "" {
					continue // an RFC's section
				}
				target := d
				if m[1] != "" {
					if target = find(d, m[1]); target == nil {
						errs = append(errs, d.Errorf(i+1, "§%s of %s: no such doc", m[2], m[1]))
						continue
					}
				}
				n, _ := strconv.Atoi(m[2])
				if _, ok := sections(target)[n]; !ok {
					errs = append(errs, d.Errorf(i+1, "§%d: %s has no section %d", n, target.Path, n))
				}
			}
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				td := d
				if file != "" {
					path := filepath.Join(filepath.Dir(d.Path), file)
					if _, err := os.Stat(filepath.Join(root, path)); err != nil {
						errs = append(errs, d.Errorf(i+1, "link to %s: no such file", target))
						continue
					}
					td = byPath[filepath.Clean(path)]
				}
				if anchor == "" || td == nil {
					continue
				}
				found := false
				for _, h := range td.Headings {
					found = found || slug(h.Text) == anchor
				}
				if !found {
					errs = append(errs, d.Errorf(i+1, "link to %s: no heading with that anchor", target))
				}
			}
		}
	}
	return errs
}

func fenceLines(d *Doc) map[int]bool {
	in := map[int]bool{}
	for _, f := range d.Fences {
		for l := f.Line; l <= f.Line+strings.Count(f.Code, "\n")+1; l++ {
			in[l] = true
		}
	}
	return in
}

// api is what a package exports: its top-level names, and the fields and
// methods of its types.
type api struct {
	names   map[string]bool
	members map[string]map[string]bool // by type
}

// Packages whose names the prose may quote, by package name: folder.
var apiPackages = map[string]string{
	"retryhttp":     ".",
	"retryhttptest": "retryhttptest",
	"otelretry":     "otelretry",
	"redisbudget":   "redisbudget",
	"integration":   "integration",
}

func loadAPI(dir string) (*api, error) {
	a := &api{names: map[string]bool{}, members: map[string]map[string]bool{}}
	member := func(typ, name string) {
		if a.members[typ] == nil {
			a.members[typ] = map[string]bool{}
		}
		a.members[typ][name] = true
	}
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return nil, err
		}
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv == nil {
					a.names[decl.Name.Name] = true
					continue
				}
				t := decl.Recv.List[0].Type
				if s, ok := t.(*ast.StarExpr); ok {
					t = s.X
				}
				if id, ok := t.(*ast.Ident); ok {
					member(id.Name, decl.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch s := spec.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							a.names[n.Name] = true
						}
					case *ast.TypeSpec:
						a.names[s.Name.Name] = true
						switch t := s.Type.(type) {
						case *ast.StructType:
							for _, fl := range t.Fields.List {
								for _, n := range fl.Names {
									member(s.Name.Name, n.Name)
								}
								if len(fl.Names) == 0 { // embedded
									e := fl.Type
									if st, ok := e.(*ast.StarExpr); ok {
										e = st.X
									}
									if sel, ok := e.(*ast.SelectorExpr); ok {
										member(s.Name.Name, sel.Sel.Name)
									} else if id, ok := e.(*ast.Ident); ok {
										member(s.Name.Name, id.Name)
									}
								}
							}
						case *ast.InterfaceType:
							for _, m := range t.Methods.List {
								for _, n := range m.Names {
									member(s.Name.Name, n.Name)
								}
							}
						}
					}
				}
			}
		}
	}
	return a, nil
}

var (
	codeSpan   = regexp.MustCompile("`([^`]+)`")
	methodExpr = regexp.MustCompile(`^\(\*?([a-z]\w*)\.([A-Z]\w*)\)\.([A-Z]\w*)`)
	qualified  = regexp.MustCompile(`^([a-z]\w*)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`)
	typeMember = regexp.MustCompile(`^([A-Z]\w*)\.([A-Z]\w*)`)
	testName   = regexp.MustCompile(`^(?:[\w/]+[./])?((Test|Benchmark|Example|Fuzz)[A-Z_]\w*)$`)
)

// testFuncs lists the tests, benchmarks, examples and fuzz targets of
// every module in the repository.
func testFuncs(root string) (map[string]bool, error) {
	out := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && path != root && (strings.HasPrefix(e.Name(), ".") || e.Name() == "testdata") {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil {
				out[fn.Name.Name] = true
			}
		}
		return nil
	})
	return out, err
}

// Names checks the Go names that the prose quotes in code spans:
// pkg.Name, pkg.Type.Member, (*pkg.Type).Method and Type.Member, for this
// repository's packages, and the tests they name (TestX, pkg.TestX,
// folder/TestX): each must exist.
func Names(root string, docs []*Doc) []error {
	apis := map[string]*api{}
	for pkg, dir := range apiPackages {
		a, err := loadAPI(filepath.Join(root, dir))
		if err != nil {
			return []error{err}
		}
		apis[pkg] = a
	}
	tests, err := testFuncs(root)
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, d := range docs {
		inFence := fenceLines(d)
		for i, line := range d.Lines {
			if inFence[i+1] {
				continue
			}
			for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
				span := m[1]
				var pkg, name, mem string
				if s := testName.FindStringSubmatch(span); s != nil {
					if !tests[s[1]] {
						errs = append(errs, d.Errorf(i+1, "`%s`: no such test, benchmark, example or fuzz target in the repository", span))
					}
					continue
				}
				if s := methodExpr.FindStringSubmatch(span); s != nil {
					pkg, name, mem = s[1], s[2], s[3]
				} else if s := qualified.FindStringSubmatch(span); s != nil {
					pkg, name, mem = s[1], s[2], s[3]
				} else if s := typeMember.FindStringSubmatch(span); s != nil {
					// Unqualified: fine if any package's type of that name has it.
					for p, a := range apis {
						if a.names[s[1]] && a.members[s[1]] != nil {
							pkg, name, mem = p, s[1], s[2]
							if a.members[s[1]][s[2]] {
								break
							}
						}
					}
				}
				a, ok := apis[pkg]
				if !ok {
					continue
				}
				switch {
				case !a.names[name]:
					errs = append(errs, d.Errorf(i+1, "`%s`: package %s has no %s", span, pkg, name))
				case mem != "" && !a.members[name][mem]:
					errs = append(errs, d.Errorf(i+1, "`%s`: %s.%s has no field or method %s", span, pkg, name, mem))
				}
			}
		}
	}
	return errs
}

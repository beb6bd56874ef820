package check

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

var marker = regexp.MustCompile(`<!--(n|n-source|n-let|table|json):(.*?)-->`)

// numbers checks the markers of one doc against the saved runs they name.
type numbers struct {
	root    string // the repository
	d       *Doc
	cache   map[string]any
	source  string // the n-source file, relative to the doc's folder
	lets    map[string]any
	errs    []error
	checked int
}

// Numbers checks every figure that README.md and docs/*.md mark as coming
// from a saved run, and returns how many it checked.
func Numbers(root string, docs []*Doc) (int, []error) {
	cache := map[string]any{}
	var errs []error
	total := 0
	for _, d := range docs {
		n := &numbers{root: root, d: d, cache: cache, lets: map[string]any{}}
		n.run()
		errs = append(errs, n.errs...)
		total += n.checked
	}
	return total, errs
}

func (n *numbers) errorf(line int, format string, args ...any) {
	n.errs = append(n.errs, n.d.Errorf(line, format, args...))
}

// split separates "file.json:expr" into its file (or the n-source one)
// and its expression.
func (n *numbers) split(s string) (file, expr string) {
	s = strings.TrimSpace(s)
	if f, rest, ok := strings.Cut(s, ":"); ok && !strings.ContainsAny(f, `"[ `) && regexp.MustCompile(`\.(json|md|txt)$`).MatchString(f) {
		return f, strings.TrimSpace(rest)
	}
	return n.source, s
}

func (n *numbers) load(file string) (any, error) {
	if file == "" {
		return nil, fmt.Errorf("no saved run named (file.json:expr, or an n-source before)")
	}
	path := filepath.Join(n.root, filepath.Dir(n.d.Path), file)
	if v, ok := n.cache[path]; ok {
		return v, nil
	}
	v, err := loadSource(path)
	if err != nil {
		return nil, err
	}
	n.cache[path] = v
	return v, nil
}

func (n *numbers) value(s string, row any) (any, error) {
	file, expr := n.split(s)
	var root any // none: the expression must start at an n-let name
	if file != "" {
		var err error
		if root, err = n.load(file); err != nil {
			return nil, err
		}
	}
	return eval(expr, &env{root: root, row: row, lets: n.lets})
}

func (n *numbers) run() {
	inFence := map[int]bool{}
	for _, f := range n.d.Fences {
		for l := f.Line; l <= f.Line+strings.Count(f.Code, "\n")+1; l++ {
			inFence[l] = true
		}
	}
	tables := map[int]Table{} // by the line of their directive's end
	for _, t := range n.d.Tables {
		if strings.HasPrefix(strings.TrimSpace(t.Directive), "table:") {
			tables[t.DirectiveLine] = t
		}
	}
	fences := map[int]Fence{}
	for _, f := range n.d.Fences {
		if strings.HasPrefix(strings.TrimSpace(f.Directive), "json:") {
			fences[f.DirectiveLine] = f
		}
	}
	for i, line := range n.d.Lines {
		ln := i + 1
		if inFence[ln] {
			continue
		}
		for _, m := range marker.FindAllStringSubmatchIndex(line, -1) {
			kind, arg := line[m[2]:m[3]], line[m[4]:m[5]]
			switch kind {
			case "n-source":
				n.source = strings.TrimSpace(arg)
				if _, err := n.load(n.source); err != nil {
					n.errorf(ln, "%v", err)
				}
			case "n-let":
				name, expr, ok := strings.Cut(arg, "=")
				if !ok {
					n.errorf(ln, "n-let: want name=expr")
					continue
				}
				v, err := n.value(expr, nil)
				if err != nil {
					n.errorf(ln, "n-let %s: %v", name, err)
					continue
				}
				n.lets[strings.TrimSpace(name)] = v
			case "n":
				n.inline(ln, arg, line[m[1]:])
			case "table":
				t, ok := tables[ln]
				if !ok {
					n.errorf(ln, "table: no table right after the marker")
					continue
				}
				n.table(t, arg)
			case "json":
				f, ok := fences[ln]
				if !ok {
					n.errorf(ln, "json: no code block right after the marker")
					continue
				}
				n.json(f, arg)
			}
		}
	}
}

// inline checks the number right after a marker.
func (n *numbers) inline(ln int, arg, after string) {
	v, err := n.value(arg, nil)
	if err != nil {
		n.errorf(ln, "%s: %v", arg, err)
		return
	}
	qs := numbersIn(after)
	if len(qs) == 0 || !strings.HasPrefix(strings.TrimLeft(after, " "), strings.TrimLeft(qs[0].text, " ")) {
		n.errorf(ln, "%s: no number right after the marker", arg)
		return
	}
	n.checked++
	if err := matches(qs[0], v); err != nil {
		n.errorf(ln, "%s: %v", arg, err)
	}
}

// table checks a table row by row against the elements of a list: each
// column's expressions (separated by commas; _ for none) against the
// numbers in its cells, in order. A cell with one number stands for all
// its column's expressions (they must all read it); a cell with none,
// for a null; a column that reads a string, for a cell with that text. A
// cell of as many parts separated by " / " as its column has expressions,
// each with one number at most, is read part by part: a part with no
// number stands for a null ("1.2 / - / 0.9").
func (n *numbers) table(t Table, arg string) {
	specs := strings.Split(arg, "|")
	file, rowsExpr := n.split(specs[0])
	root, err := n.load(file)
	if err != nil {
		n.errorf(t.DirectiveLine, "table: %v", err)
		return
	}
	v, err := eval(rowsExpr, &env{root: root, lets: n.lets})
	if err != nil {
		n.errorf(t.DirectiveLine, "table: %v", err)
		return
	}
	rows, ok := v.([]any)
	if !ok {
		n.errorf(t.DirectiveLine, "table: %s is not a list", rowsExpr)
		return
	}
	cols := specs[1:]
	if len(cols) != len(t.Header) {
		n.errorf(t.DirectiveLine, "table: %d columns named, the table has %d", len(cols), len(t.Header))
		return
	}
	if len(rows) != len(t.Rows) {
		n.errorf(t.Line, "table: %d rows, the saved run has %d", len(t.Rows), len(rows))
		return
	}
	for i, row := range t.Rows {
		for j, spec := range cols {
			spec = strings.TrimSpace(spec)
			if spec == "_" || j >= len(row) {
				continue
			}
			var want []any
			for _, e := range splitTop(spec) {
				w, err := eval(e, &env{root: root, row: rows[i], lets: n.lets})
				if err != nil {
					n.errorf(t.RowLines[i], "column %q: %v", t.Header[j], err)
					continue
				}
				want = append(want, w)
			}
			n.cell(t.RowLines[i], t.Header[j], row[j], want)
		}
	}
}

func (n *numbers) cell(ln int, col, cell string, want []any) {
	if len(want) == 1 {
		switch w := want[0].(type) {
		case string:
			n.checked++
			if strings.Trim(cell, "`*") != w {
				n.errorf(ln, "column %q: %q; the saved run says %q", col, cell, w)
			}
			return
		case nil:
			n.checked++
			if len(numbersIn(cell)) > 0 {
				n.errorf(ln, "column %q: %q; the saved run has no figure (null)", col, cell)
			}
			return
		}
	}
	if parts := strings.Split(cell, " / "); len(want) > 1 && len(parts) == len(want) && onePerPart(parts) {
		// "0.9 / - / 1.2": one figure, or a null, per part.
		for k, part := range parts {
			n.cell(ln, col, part, want[k:k+1])
		}
		return
	}
	got := numbersIn(cell)
	switch {
	case len(got) == 1 && len(want) > 1:
		for range want[1:] {
			got = append(got, got[0])
		}
	case len(got) != len(want):
		n.errorf(ln, "column %q: %q has %d numbers; want %d", col, cell, len(got), len(want))
		return
	}
	for k := range want {
		n.checked++
		if err := matches(got[k], want[k]); err != nil {
			n.errorf(ln, "column %q: %v", col, err)
		}
	}
}

// splitTop splits at the commas outside brackets and quotes.
func splitTop(s string) []string {
	var out []string
	depth, quote, start := 0, false, 0
	for i, c := range s {
		switch {
		case c == '"':
			quote = !quote
		case quote:
		case c == '[' || c == '(':
			depth++
		case c == ']' || c == ')':
			depth--
		case c == ',' && depth == 0:
			out = append(out, strings.TrimSpace(s[start:i]))
			start = i + 1
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

// json checks a JSON block that shows (part of) a saved run: every value
// in it is the run's at the same place, numbers to the decimals shown.
func (n *numbers) json(f Fence, arg string) {
	root, err := n.load(strings.TrimSpace(arg))
	if err != nil {
		n.errorf(f.DirectiveLine, "json: %v", err)
		return
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(f.Code)))
	dec.UseNumber()
	var shown any
	if err := dec.Decode(&shown); err != nil {
		n.errorf(f.Line, "json: %v", err)
		return
	}
	var walk func(path string, shown, saved any)
	walk = func(path string, shown, saved any) {
		switch s := shown.(type) {
		case map[string]any:
			m, ok := saved.(map[string]any)
			if !ok {
				n.errorf(f.Line, "json: %s: the saved run has %v", path, saved)
				return
			}
			var ks []string
			for k := range s {
				ks = append(ks, k)
			}
			sort.Strings(ks)
			for _, k := range ks {
				sv, ok := m[k]
				if !ok {
					n.errorf(f.Line, "json: %s.%s: not in the saved run", path, k)
					continue
				}
				walk(path+"."+k, s[k], sv)
			}
		case json.Number:
			n.checked++
			decimals := 0
			if _, frac, ok := strings.Cut(s.String(), "."); ok {
				decimals = len(frac)
			}
			v, _ := strconv.ParseFloat(s.String(), 64)
			if err := matches(quoted{value: v, decimals: decimals, text: s.String()}, saved); err != nil {
				n.errorf(f.Line, "json: %s: %v", path, err)
			}
		default:
			n.checked++
			if fmt.Sprint(shown) != fmt.Sprint(saved) {
				n.errorf(f.Line, "json: %s: %v; the saved run says %v", path, shown, saved)
			}
		}
	}
	walk("", shown, root)
}

// onePerPart reports whether each part holds one number at most.
func onePerPart(parts []string) bool {
	for _, p := range parts {
		if len(numbersIn(p)) > 1 {
			return false
		}
	}
	return true
}

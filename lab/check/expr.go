package check

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// An expression names figures of a saved run and may combine them:
//
//	runs[name=retryhttp].throttled              a member, an element whose name is retryhttp, a member
//	runs[3].throttled  runs.3.throttled         an element by index
//	"sec/op"."Retry/retryhttp-2"                quoted names, for any characters
//	runs[name=aws-adaptive].throttled / runs[name=retryhttp].throttled
//	(a - b) * 100                               + - * / and parentheses
//	$.capacity                                  the run's top level (inside a table's columns)
//
// A path starts at a name bound by n-let, at the current table row (in a
// table's columns), or at the saved run's top level.

type env struct {
	root any            // the saved run
	row  any            // the current table row, if any
	lets map[string]any // n-let names
}

type exprParser struct {
	s   string
	pos int
	env *env
}

func eval(s string, e *env) (any, error) {
	p := &exprParser{s: s, env: e}
	v, err := p.expr()
	if err != nil {
		return nil, err
	}
	p.space()
	if p.pos != len(p.s) {
		return nil, fmt.Errorf("unexpected %q in %q", p.s[p.pos:], s)
	}
	return v, nil
}

func (p *exprParser) space() {
	for p.pos < len(p.s) && p.s[p.pos] == ' ' {
		p.pos++
	}
}

func (p *exprParser) peek() byte {
	p.space()
	if p.pos < len(p.s) {
		return p.s[p.pos]
	}
	return 0
}

func (p *exprParser) expr() (any, error) {
	v, err := p.term()
	for err == nil {
		op := p.peek()
		if op != '+' && op != '-' {
			break
		}
		p.pos++
		var w any
		if w, err = p.term(); err == nil {
			v, err = arith(op, v, w)
		}
	}
	return v, err
}

func (p *exprParser) term() (any, error) {
	v, err := p.factor()
	for err == nil {
		op := p.peek()
		if op != '*' && op != '/' {
			break
		}
		p.pos++
		var w any
		if w, err = p.factor(); err == nil {
			v, err = arith(op, v, w)
		}
	}
	return v, err
}

func (p *exprParser) factor() (any, error) {
	switch c := p.peek(); {
	case c == '(':
		p.pos++
		v, err := p.expr()
		if err != nil {
			return nil, err
		}
		if p.peek() != ')' {
			return nil, fmt.Errorf("missing ) in %q", p.s)
		}
		p.pos++
		return v, nil
	case c == '-':
		p.pos++
		v, err := p.factor()
		if err != nil {
			return nil, err
		}
		return arith('*', -1.0, v)
	case c >= '0' && c <= '9':
		start := p.pos
		for p.pos < len(p.s) && (p.s[p.pos] >= '0' && p.s[p.pos] <= '9' || p.s[p.pos] == '.' || p.s[p.pos] == 'e') {
			p.pos++
		}
		return strconv.ParseFloat(p.s[start:p.pos], 64)
	case c == 0:
		return nil, fmt.Errorf("%q ends early", p.s)
	}
	return p.path()
}

// name reads an identifier or a quoted name.
func (p *exprParser) name() (string, error) {
	p.space()
	if p.pos < len(p.s) && p.s[p.pos] == '"' {
		end := strings.IndexByte(p.s[p.pos+1:], '"')
		if end < 0 {
			return "", fmt.Errorf("unterminated quote in %q", p.s)
		}
		n := p.s[p.pos+1 : p.pos+1+end]
		p.pos += end + 2
		return n, nil
	}
	start := p.pos
	for p.pos < len(p.s) {
		r := rune(p.s[p.pos])
		if !(r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r)) {
			break
		}
		p.pos++
	}
	if start == p.pos {
		return "", fmt.Errorf("want a name at %q in %q", p.s[p.pos:], p.s)
	}
	return p.s[start:p.pos], nil
}

func (p *exprParser) path() (any, error) {
	var v any
	if p.peek() == '$' {
		p.pos++
		v = p.env.root
	} else {
		n, err := p.name()
		if err != nil {
			return nil, err
		}
		if l, ok := p.env.lets[n]; ok {
			v = l
		} else if m, ok := p.env.row.(map[string]any); ok {
			if v, ok = m[n]; !ok {
				return nil, fmt.Errorf("no %q in the row (%s)", n, keys(m))
			}
		} else if p.env.root == nil {
			return nil, fmt.Errorf("%s: no saved run named (file.json:expr, or an n-source before) and no n-let of that name", n)
		} else if v, err = member(p.env.root, n); err != nil {
			return nil, err
		}
	}
	for {
		switch p.peek() {
		case '.':
			p.pos++
			n, err := p.name()
			if err != nil {
				return nil, err
			}
			if v, err = member(v, n); err != nil {
				return nil, err
			}
		case '[':
			p.pos++
			end := strings.IndexByte(p.s[p.pos:], ']')
			if end < 0 {
				return nil, fmt.Errorf("missing ] in %q", p.s)
			}
			sel := p.s[p.pos : p.pos+end]
			p.pos += end + 1
			var err error
			if k, want, ok := strings.Cut(sel, "="); ok {
				v, err = where(v, strings.TrimSpace(k), strings.Trim(strings.TrimSpace(want), `"`))
			} else {
				v, err = member(v, strings.TrimSpace(sel))
			}
			if err != nil {
				return nil, err
			}
		default:
			return v, nil
		}
	}
}

// member is v's member n, or its element n when v is a list.
func member(v any, n string) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		x, ok := v[n]
		if !ok {
			return nil, fmt.Errorf("no %q (there are %s)", n, keys(v))
		}
		return x, nil
	case []any:
		i, err := strconv.Atoi(n)
		if err != nil || i < 0 || i >= len(v) {
			return nil, fmt.Errorf("no element %q of a list of %d", n, len(v))
		}
		return v[i], nil
	}
	return nil, fmt.Errorf("%q of %v, which has no members", n, v)
}

// where is the first element of the list v whose member k reads want.
func where(v any, k, want string) (any, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("[%s=%s] of something that is not a list", k, want)
	}
	for _, x := range list {
		if m, ok := x.(map[string]any); ok && fmt.Sprint(m[k]) == want {
			return x, nil
		}
	}
	return nil, fmt.Errorf("no element with %s = %s", k, want)
}

func keys(m map[string]any) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	if len(ks) > 12 {
		ks = append(ks[:12], "...")
	}
	return strings.Join(ks, ", ")
}

// number reads a figure: a number, a quantity, or the first number in a
// string (a cell of a generated table).
func number(v any) (float64, string, error) {
	switch v := v.(type) {
	case float64:
		return v, "", nil
	case quantity:
		return v.n, v.dim, nil
	case string:
		if ns := numbersIn(v); len(ns) > 0 {
			return ns[0].value, "", nil
		}
	}
	return 0, "", fmt.Errorf("%v is not a number", v)
}

func arith(op byte, a, b any) (any, error) {
	x, dx, err := number(a)
	if err != nil {
		return nil, err
	}
	y, dy, err := number(b)
	if err != nil {
		return nil, err
	}
	var r float64
	dim := ""
	switch op {
	case '+', '-':
		if dx != dy {
			return nil, fmt.Errorf("%c of %s and %s", op, unitName(dx), unitName(dy))
		}
		r, dim = x+y, dx
		if op == '-' {
			r = x - y
		}
	case '*':
		if dx != "" && dy != "" {
			return nil, fmt.Errorf("* of two quantities")
		}
		r, dim = x*y, dx+dy
	case '/':
		r = x / y
		switch {
		case dx == dy:
		case dy == "":
			dim = dx
		default:
			return nil, fmt.Errorf("/ of %s by %s", unitName(dx), unitName(dy))
		}
	}
	if dim == "" {
		return r, nil
	}
	return quantity{r, dim}, nil
}

func unitName(dim string) string {
	switch dim {
	case "s":
		return "a time"
	case "B":
		return "bytes"
	}
	return "a plain number"
}

// quoted is a number as the prose writes it.
type quoted struct {
	value    float64
	decimals int
	unit     string // ns, µs, ms, s, B, KiB, MiB, %, x, ×; or none
	text     string
}

var unitScale = map[string]struct {
	dim   string
	scale float64
}{
	"ns": {"s", 1e-9}, "µs": {"s", 1e-6}, "us": {"s", 1e-6}, "ms": {"s", 1e-3}, "s": {"s", 1},
	"B": {"B", 1}, "KiB": {"B", 1024}, "MiB": {"B", 1024 * 1024},
}

// numbersIn finds the numbers in prose: 1,234.5 with an optional sign and
// unit; not the digits of a word (p99, HTTP/2, go1.26) nor of a range's
// second end's sign (4.5-9).
func numbersIn(s string) []quoted {
	var out []quoted
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		if !unicode.IsDigit(r) {
			continue
		}
		if i > 0 && (unicode.IsLetter(rs[i-1]) || rs[i-1] == '_' || rs[i-1] == '.' || rs[i-1] == '/') {
			for i < len(rs) && (unicode.IsDigit(rs[i]) || rs[i] == '.') {
				i++
			}
			continue
		}
		start := i
		sign := 1.0
		if i > 0 && (rs[i-1] == '-' || rs[i-1] == '−') && (i == 1 || !unicode.IsDigit(rs[i-2])) {
			sign, start = -1, i-1
		}
		if i > 0 && rs[i-1] == '+' {
			start = i - 1
		}
		var digits strings.Builder
		decimals := -1
		for ; i < len(rs); i++ {
			c := rs[i]
			switch {
			case unicode.IsDigit(c):
				digits.WriteRune(c)
				if decimals >= 0 {
					decimals++
				}
				continue
			case c == ',' && decimals < 0 && i+3 <= len(rs)-1 && allDigits(rs[i+1:i+4]) && (i+4 == len(rs) || !unicode.IsDigit(rs[i+4])):
				continue // a thousands separator
			case c == '.' && decimals < 0 && i+1 < len(rs) && unicode.IsDigit(rs[i+1]):
				digits.WriteRune(c)
				decimals = 0
				continue
			}
			break
		}
		v, err := strconv.ParseFloat(digits.String(), 64)
		if err != nil {
			continue
		}
		q := quoted{value: sign * v, decimals: max(decimals, 0)}
		// A unit: x, × and % right after the number; the others after a
		// space or, but for s and B, right after it. A number followed by
		// other letters is part of a word (429s, 5xx).
		unit := func(u string, j int) bool {
			ur := []rune(u)
			return j+len(ur) <= len(rs) && string(rs[j:j+len(ur)]) == u && (j+len(ur) == len(rs) || !unicode.IsLetter(rs[j+len(ur)]))
		}
		found := false
		for _, u := range []string{"KiB", "MiB", "ns", "µs", "us", "ms", "s", "B", "%", "x", "×"} {
			spaced := i < len(rs) && rs[i] == ' ' && u != "%" && u != "x" && u != "×"
			tight := u != "s" && u != "B"
			if spaced && unit(u, i+1) {
				q.unit, i, found = u, i+1+len([]rune(u)), true
				break
			}
			if tight && unit(u, i) {
				q.unit, i, found = u, i+len([]rune(u)), true
				break
			}
		}
		if !found && i < len(rs) && unicode.IsLetter(rs[i]) {
			for i < len(rs) && (unicode.IsLetter(rs[i]) || unicode.IsDigit(rs[i])) {
				i++
			}
			continue
		}
		q.text = string(rs[start:i])
		out = append(out, q)
		i--
	}
	return out
}

func allDigits(rs []rune) bool {
	for _, r := range rs {
		if !unicode.IsDigit(r) {
			return false
		}
	}
	return len(rs) > 0
}

// matches reports whether prose that quotes q is right about v: v rounded
// to q's decimals (in q's unit, for a quantity) is q. A value exactly half
// way rounds either way.
func matches(q quoted, v any) error {
	x, dim, err := number(v)
	if err != nil {
		return err
	}
	if dim != "" {
		u, ok := unitScale[q.unit]
		if !ok || u.dim != dim {
			return fmt.Errorf("%q: the saved figure is %s; say its unit", q.text, unitName(dim))
		}
		x /= u.scale
	}
	scale := math.Pow(10, float64(q.decimals))
	y := x * scale
	lo, hi := math.Floor(y), math.Ceil(y)
	want := math.Round(q.value * scale)
	ok := math.Round(y) == want
	if !ok && math.Abs(y-lo-0.5) < 1e-6 { // a tie, up to floating-point error
		ok = lo == want || hi == want
	}
	if !ok {
		return fmt.Errorf("%q: the saved run says %s", q.text, strconv.FormatFloat(x, 'f', q.decimals, 64))
	}
	return nil
}

package check

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// Doc is a markdown file, split into what the checks read: fenced code
// blocks, headings, tables and the HTML comments in front of them.
type Doc struct {
	Path     string // as given to Load
	Lines    []string
	Fences   []Fence
	Headings []Heading
	Tables   []Table
}

// Fence is a fenced code block.
type Fence struct {
	Lang string
	Line int // of the opening fence, from 1
	Code string
	// Directive is the HTML comment right before the fence (blank lines
	// may separate them), without <!-- and -->; empty if none.
	Directive     string
	DirectiveLine int // where the directive starts
}

// Heading is a markdown heading.
type Heading struct {
	Level int
	Text  string
	Line  int
}

// Table is a markdown table: its header, and its rows after the
// delimiter row.
type Table struct {
	Line          int // of the header row
	Header        []string
	Rows          [][]string
	RowLines      []int
	Directive     string // the HTML comment right before the table, if any
	DirectiveLine int
}

// Errorf formats a problem at a line of d.
func (d *Doc) Errorf(line int, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", d.Path, line, fmt.Sprintf(format, args...))
}

// Load reads and splits a markdown file.
func Load(path string) (*Doc, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, string(b)), nil
}

// Parse splits markdown text.
func Parse(path, text string) *Doc {
	d := &Doc{Path: path, Lines: strings.Split(text, "\n")}
	var comment string                 // the last HTML comment block that ended
	commentStart, commentEnd := -1, -1 // the lines it started and ended on (indexes)
	lastContent := -1                  // the last non-blank line outside comments (index)
	// attached returns the comment right before the current line, if
	// nothing but blank lines separate them, and its line (from 1).
	attached := func() (string, int) {
		if commentEnd >= 0 && commentEnd > lastContent {
			return comment, commentStart + 1
		}
		return "", 0
	}
	for i := 0; i < len(d.Lines); i++ {
		line := d.Lines[i]
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~"):
			mark := trimmed[:3]
			f := Fence{Lang: strings.TrimSpace(trimmed[3:]), Line: i + 1}
			f.Directive, f.DirectiveLine = attached()
			var code []string
			for i++; i < len(d.Lines) && !strings.HasPrefix(strings.TrimSpace(d.Lines[i]), mark); i++ {
				code = append(code, d.Lines[i])
			}
			if len(code) > 0 {
				f.Code = strings.Join(code, "\n") + "\n"
			}
			d.Fences = append(d.Fences, f)
			lastContent = i
		case strings.HasPrefix(trimmed, "<!--") && !strings.Contains(trimmed[4:], "-->") || trimmed == "<!--":
			// A comment block over several lines.
			var body []string
			commentStart = i
			body = append(body, strings.TrimPrefix(trimmed, "<!--"))
			for i++; i < len(d.Lines) && !strings.Contains(d.Lines[i], "-->"); i++ {
				body = append(body, d.Lines[i])
			}
			if i < len(d.Lines) {
				body = append(body, strings.TrimSpace(strings.Split(d.Lines[i], "-->")[0]))
			}
			comment, commentEnd = strings.Join(body, "\n"), i
		case strings.HasPrefix(trimmed, "<!--") && strings.HasSuffix(trimmed, "-->") && strings.Count(trimmed, "<!--") == 1:
			comment, commentStart, commentEnd = strings.TrimSuffix(strings.TrimPrefix(trimmed, "<!--"), "-->"), i, i
		case strings.HasPrefix(trimmed, "#"):
			level := len(trimmed) - len(strings.TrimLeft(trimmed, "#"))
			d.Headings = append(d.Headings, Heading{Level: level, Text: strings.TrimSpace(trimmed[level:]), Line: i + 1})
			lastContent = i
		case strings.HasPrefix(trimmed, "|"):
			t := Table{Line: i + 1, Header: cells(trimmed)}
			t.Directive, t.DirectiveLine = attached()
			if i+1 < len(d.Lines) && isDelimiterRow(d.Lines[i+1]) {
				i++
			}
			for i+1 < len(d.Lines) && strings.HasPrefix(strings.TrimSpace(d.Lines[i+1]), "|") {
				i++
				t.Rows = append(t.Rows, cells(strings.TrimSpace(d.Lines[i])))
				t.RowLines = append(t.RowLines, i+1)
			}
			d.Tables = append(d.Tables, t)
			lastContent = i
		case trimmed != "":
			lastContent = i
		}
	}
	return d
}

var delimiterRow = regexp.MustCompile(`^\|(\s*:?-+:?\s*\|)+$`)

func isDelimiterRow(s string) bool { return delimiterRow.MatchString(strings.TrimSpace(s)) }

// cells splits a table row into its cells, trimmed. A | inside a code span
// does not split (GitHub needs it escaped as \| there; both are accepted).
func cells(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimPrefix(row, "|")
	row = strings.TrimSuffix(row, "|")
	var out []string
	var cur strings.Builder
	inCode := false
	for i := 0; i < len(row); i++ {
		c := row[i]
		switch {
		case c == '\\' && i+1 < len(row) && row[i+1] == '|':
			cur.WriteByte('|')
			i++
		case c == '`':
			inCode = !inCode
			cur.WriteByte(c)
		case c == '|' && !inCode:
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	return append(out, strings.TrimSpace(cur.String()))
}

// Docs lists the markdown files the checks cover: README.md and docs/*.md
// under root, as paths relative to root.
func Docs(root string) ([]string, error) {
	files := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	for _, f := range more {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			return nil, err
		}
		files = append(files, rel)
	}
	return files, nil
}

// slug is GitHub's anchor for a heading: lower case, spaces to hyphens,
// punctuation other than hyphens and underscores dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

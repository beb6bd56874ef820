package check

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// A saved run is read into plain values: float64, string, nil,
// map[string]any, []any, and quantity for figures with a unit.

// quantity is a figure in seconds ("s") or bytes ("B"), as read from
// benchmark output; text quoting it says its unit (ns, µs, ms, s; B, KiB,
// MiB) and is compared in that unit.
type quantity struct {
	n   float64
	dim string
}

// loadSource reads a saved run: JSON (.json), the output of
// go test -bench (.txt: each benchmark's median for each unit, as benchstat
// takes it), or a markdown file written by a script (.md: the benchstat
// blocks in it by unit and then benchmark name, and its tables by column
// header and then the row's first cell, e.g. "429s"."retryhttp").
func loadSource(path string) (any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	switch filepath.Ext(path) {
	case ".json":
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		return v, nil
	case ".txt":
		return benchText(b), nil
	case ".md":
		return markdownSource(path, string(b)), nil
	}
	return nil, fmt.Errorf("%s: a saved run is .json, .txt (go test -bench output) or .md", path)
}

// benchText reads go test -bench output: the median of every benchmark's
// figures, by name (as printed, "BenchmarkX/sub-2") and unit ("ns/op").
func benchText(b []byte) map[string]any {
	all := map[string]map[string][]float64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			if all[f[0]] == nil {
				all[f[0]] = map[string][]float64{}
			}
			all[f[0]][f[i+1]] = append(all[f[0]][f[i+1]], v)
		}
	}
	out := map[string]any{}
	for name, units := range all {
		m := map[string]any{}
		for unit, vs := range units {
			med := median(vs)
			switch {
			case unit == "ns/op" || strings.HasPrefix(unit, "ns/") || strings.HasPrefix(unit, "extra-ns/"):
				m[unit] = quantity{med * 1e-9, "s"}
			case unit == "B/op":
				m[unit] = quantity{med, "B"}
			default:
				m[unit] = med
			}
		}
		out[name] = m
	}
	return out
}

func median(vs []float64) float64 {
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

var benchstatRow = regexp.MustCompile(`^(\S+)\s+(-?[\d.]+)([a-zA-Zµ]*)\s+±`)

// markdownSource reads a generated markdown file: benchstat's tables in
// its code blocks, by unit then name, and its markdown tables, by column
// header then first cell. The first of equal keys wins.
func markdownSource(path, text string) map[string]any {
	out := map[string]any{}
	put := func(a, b string, v any) {
		m, _ := out[a].(map[string]any)
		if m == nil {
			m = map[string]any{}
			out[a] = m
		}
		if _, dup := m[b]; !dup {
			m[b] = v
		}
	}
	d := Parse(path, text)
	for _, f := range d.Fences {
		unit := ""
		for _, line := range strings.Split(f.Code, "\n") {
			if strings.Contains(line, "│") {
				if u := strings.TrimSpace(strings.Trim(strings.TrimSpace(line), "│")); strings.Contains(u, "/") || u == "ratio" {
					unit = u
				}
				continue
			}
			m := benchstatRow.FindStringSubmatch(line)
			if m == nil || unit == "" {
				continue
			}
			v, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				continue
			}
			put(unit, m[1], siValue(v, m[3], unit))
		}
	}
	for _, t := range d.Tables {
		for _, row := range t.Rows {
			for j := 1; j < len(row) && j < len(t.Header); j++ {
				put(t.Header[j], row[0], row[j])
			}
		}
	}
	return out
}

// siValue applies benchstat's prefix: SI, or binary (Ki, Mi) for bytes.
func siValue(v float64, prefix, unit string) any {
	mult := map[string]float64{"": 1, "n": 1e-9, "µ": 1e-6, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9,
		"Ki": 1024, "Mi": 1024 * 1024, "Gi": 1024 * 1024 * 1024}[prefix]
	v *= mult
	switch {
	case strings.Contains(unit, "sec/"):
		return quantity{v, "s"}
	case unit == "B/op":
		return quantity{v, "B"}
	}
	return v
}

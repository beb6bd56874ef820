package check

import (
	"strings"
	"testing"
)

// Tests of the checker itself: each check catches what it is for.

// errsOf joins the errors' texts.
func errsOf(errs []error) string {
	var b strings.Builder
	for _, e := range errs {
		b.WriteString(e.Error() + "\n")
	}
	return b.String()
}

func TestNumbersIn(t *testing.T) {
	tests := []struct {
		in   string
		want []quoted
	}{
		{"237 429s", []quoted{{237, 0, "", "237"}}},
		{"19,195 (`adaptivethrottler`)", []quoted{{19195, 0, "", "19,195"}}},
		{"+28 ns | +5.7 µs, +10.5 KiB", []quoted{{28, 0, "ns", "+28 ns"}, {5.7, 1, "µs", "+5.7 µs"}, {10.5, 1, "KiB", "+10.5 KiB"}}},
		{"1.8x capacity, 10.0× and 97.1%", []quoted{{1.8, 1, "x", "1.8x"}, {10, 1, "×", "10.0×"}, {97.1, 1, "%", "97.1%"}}},
		{"5061 [5033, 5087]", []quoted{{5061, 0, "", "5061"}, {5033, 0, "", "5033"}, {5087, 0, "", "5087"}}},
		{"-596 ns, 4.5-9 s", []quoted{{-596, 0, "ns", "-596 ns"}, {4.5, 1, "", "4.5"}, {9, 0, "s", "9 s"}}},
		{"p99 over HTTP/2 with go1.26", nil},
		{"1.2 s at the start, 35 retries", []quoted{{1.2, 1, "s", "1.2 s"}, {35, 0, "", "35"}}},
	}
	for _, tt := range tests {
		got := numbersIn(tt.in)
		if len(got) != len(tt.want) {
			t.Errorf("numbersIn(%q): got %+v; want %+v", tt.in, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("numbersIn(%q)[%d]: got %+v; want %+v", tt.in, i, got[i], tt.want[i])
			}
		}
	}
}

func TestNumbersCatchStaleFigures(t *testing.T) {
	tests := []struct {
		name, md string
		errs     []string // substrings of the errors wanted, one each; none: no error
	}{
		{"right", "<!--n:run.json:runs[name=retryhttp].throttled-->237 429s", nil},
		{"stale", "<!--n:run.json:runs[name=retryhttp].throttled-->240 429s", []string{`"240": the saved run says 237`}},
		{"rounded", "<!--n:run.json:runs[name=none].throttled / runs[name=retryhttp].throttled-->233x fewer", nil},
		{"rounded wrong", "<!--n:run.json:runs[name=none].throttled / runs[name=retryhttp].throttled-->232x fewer", []string{"says 233"}},
		{"source and let", "<!--n-source:run.json--><!--n-let:rh=runs[1]-->\n<!--n:rh.jain-->0.899 and <!--n:capacity-->200", nil},
		{"no number", "<!--n:run.json:capacity--> two hundred", []string{"no number right after the marker"}},
		{"no such member", "<!--n:run.json:runs[name=retryhttp].goodput-->1.000", []string{`no "goodput"`}},
		{"bench median", "<!--n:bench.txt:\"BenchmarkRoundTripSuccess/GET/transport-2\".\"ns/op\" - \"BenchmarkRoundTripSuccess/GET/base-2\".\"ns/op\"-->+31 ns", nil},
		{"bench needs a unit", "<!--n:bench.txt:\"BenchmarkRoundTripSuccess/GET/base-2\".\"ns/op\"-->31", []string{"say its unit"}},
		{"benchstat block", "<!--n:gen.md:\"extra-sec/req\".\"Paired/GET/retryhttp-2\"-->+28 ns, <!--n:gen.md:\"extra-sec/req\".\"Paired/loopback/awsretry-2\"-->-0.6 µs", nil},
		{"benchstat bytes", "<!--n:gen.md:(\"B/op\".\"Success/POST4K/retryhttp-2\" - \"B/op\".\"Success/POST4K/base-2\")-->+816 B", nil},
		{"generated table", "<!--n:gen.md:\"attempts per request\".failsafehttp-->3.000", nil},
		{"table", `<!--table:run.json:runs|_|attempts|throttled|converge_seconds|jain-->
| impl | attempts | 429s | converge | Jain |
|---|---|---|---|---|
| none | 64199 | 55180 | never | 0.998 |
| retryhttp | 9251 | 237 | 1.2 s | 0.899 |`, nil},
		{"stale table", `<!--table:run.json:runs|name|attempts|throttled|converge_seconds|jain-->
| impl | attempts | 429s | converge | Jain |
|---|---|---|---|---|
| none | 64199 | 55180 | 3.1 s | 0.998 |
| retryhttp | 9251 | 236 | 1.2 s | 0.91 |`, []string{`"3.1 s"; the saved run has no figure`, `"236": the saved run says 237`, `"0.91": the saved run says 0.90`}},
		{"table of parts", `<!--table:run.json:runs|name|attempts,throttled,converge_seconds-->
| impl | attempts / 429s / converge |
|---|---|
| none | 64199 / 55180 / - |
| retryhttp | 9251 / 237 / 1.2 s |`, nil},
		{"stale table of parts", `<!--table:run.json:runs|name|attempts,throttled,converge_seconds-->
| impl | attempts / 429s / converge |
|---|---|
| none | 64199 / 55180 / 2.0 s |
| retryhttp | 9251 / 236 / - |`, []string{`"2.0 s"; the saved run has no figure`, `"236": the saved run says 237`, `"-" has 0 numbers; want 1`}},
		{"table rows", `<!--table:run.json:runs|name|attempts-->
| impl | attempts |
|---|---|
| none | 64199 |`, []string{"1 rows, the saved run has 2"}},
		{"json block", "<!--json:run.json-->\n```json\n{\"fleet\": {\"retries\": 35, \"attempts_per_request\": 1.006}}\n```", nil},
		{"stale json block", "<!--json:run.json-->\n```json\n{\"fleet\": {\"retries\": 36, \"attempts_per_request\": 1.006}}\n```", []string{`.fleet.retries: "36": the saved run says 35`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errs := Numbers("testdata", []*Doc{Parse("x.md", tt.md)})
			got := errsOf(errs)
			if len(errs) != len(tt.errs) {
				t.Fatalf("got %d errors:\n%s\nwant %d: %q", len(errs), got, len(tt.errs), tt.errs)
			}
			for _, w := range tt.errs {
				if !strings.Contains(got, w) {
					t.Errorf("got errors:\n%s\nwant one saying %q", got, w)
				}
			}
		})
	}
}

func TestReferencesCatchBrokenOnes(t *testing.T) {
	docs := []*Doc{
		Parse("README.md", "# R\n\nSee docs/a.md §2, docs/a.md §3, [a](docs/a.md#2-two), [a](docs/a.md#three) and [b](docs/b.md). RFC 9110 §10.2.3.\n"),
		Parse("docs/a.md", "# A\n\n## 1. One\n\nAs §1 says, and §4.\n\n## 2. Two\n\n## 2. Again\n"),
	}
	got := errsOf(References("testdata/refs", docs))
	for _, w := range []string{
		"README.md:3: §3: docs/a.md has no section 3",
		"README.md:3: link to docs/a.md#three: no heading",
		"README.md:3: link to docs/b.md: no such file",
		"docs/a.md:5: §4: docs/a.md has no section 4",
		"docs/a.md:9: section 2 after section 2; want 3",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("got errors:\n%s\nwant %q", got, w)
		}
	}
	if n := strings.Count(got, "\n"); n != 5 {
		t.Errorf("got %d errors:\n%s\nwant 5", n, got)
	}
}

func TestNamesCatchWrongOnes(t *testing.T) {
	d := Parse("x.md", "`otelretry.Hook`, `(*otelretry.Metrics).Instrument`, `retryhttp.Policy.Timeout`, `Policy.Timeot`, `TestNoSuchThing`, `TestSnippets`, `http.Client.Timeout`\n")
	got := errsOf(Names(root, []*Doc{d}))
	for _, w := range []string{"`otelretry.Hook`: package otelretry has no Hook", "`Policy.Timeot`: retryhttp.Policy has no field or method Timeot", "`TestNoSuchThing`: no such test"} {
		if !strings.Contains(got, w) {
			t.Errorf("got errors:\n%s\nwant %q", got, w)
		}
	}
	if n := strings.Count(got, "\n"); n != 3 {
		t.Errorf("got %d errors:\n%s\nwant 3", n, got)
	}
}

func TestSnippetsCatchWrongOnes(t *testing.T) {
	md := "# S\n\n" +
		"<!--go var myTransport http.RoundTripper-->\n\n```go\ntr := &retryhttp.Transport{Base: myTransport}\nresp, err := tr.RoundTrip(nil)\n```\n\n" +
		"```go\ntr := &retryhttp.Transport{Base: undeclared}\n```\n\n" +
		"```go\ntr := &retryhttp.Transport{Policy: retryhttp.Policy{MaxAttempts:4}}\n```\n\n" +
		"```go\nm.Hook()\nif err != nil { ... }\n```\n\n" +
		"<!--go quote: lab/check/testdata/quoted.go Quoted-->\n```go\nfmt.Println(\"hi\")\n```\n\n" +
		"<!--go skip: pseudo-code-->\n```go\nthis is not Go\n```\n"
	errs := Snippets(root, ".", []*Doc{Parse("x.md", md)})
	got := errsOf(errs)
	for _, w := range []string{
		"x.md:14: not gofmt-clean",       // the Policy
		"x.md:18: not gofmt-clean",       // if err != nil { ... }
		"x.md:24: differs from",          // the quote
		"x.md:11: undefined: undeclared", // go vet, at the markdown line
		"x.md:19: undefined: m",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("got errors:\n%s\nwant %q", got, w)
		}
	}
	if strings.Contains(got, "x.md:6") || strings.Contains(got, "x.md:7") {
		t.Errorf("got errors:\n%s\nwant none for the first snippet (its prelude declares myTransport; resp and err may go unused)", got)
	}
}

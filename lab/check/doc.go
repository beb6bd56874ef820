// Package check keeps README.md and docs/*.md true to the code and to the
// measurements. Its tests (cd lab/check && go test .; CI runs them) check:
//
//   - Snippets: every ```go block builds and passes go vet against this
//     checkout (each block a package of its own, all in one go vet), and is
//     gofmt-clean. A block made of statements is wrapped in a function;
//     the package names it uses are imported for it (see imports); names it
//     declares and leaves unused are fine, and a line or a block that is
//     only "..." stands for omitted code. What it needs from around it goes
//     in an HTML comment right before the fence, as Go declarations:
//     <!--go var req *http.Request-->. <!--go quote: example_test.go
//     ExampleReport--> makes the block the body of that function, verbatim
//     (the Example's Output is checked by go test where it lives);
//     <!--go skip: why--> leaves a block out.
//   - Numbers: every figure marked as coming from a saved run is what that
//     run says (below).
//   - References: sections are numbered 1, 2, 3 ... once each; every "§N"
//     (of the file, or of the .md file named right before it) and every
//     relative link and #anchor resolves.
//   - Names: the Go names quoted in code spans (retryhttp.Policy,
//     Policy.Timeout, (*otelretry.Metrics).Instrument, TestX) exist.
//   - Claims (claims_test.go): behaviour the prose states that neither a
//     snippet nor a saved run shows; each test quotes its sentence.
//
// # Numbers
//
// A measured figure in the docs comes from a saved run: a file under lab/runs/
// that the command which measures writes (lab/runs.sh lists them with
// their commands; lab/bench/run.sh writes docs/benchmarks.md). The prose marks
// each figure with an HTML comment naming the run and the figure in it:
//
//	<!--n:throttling.json:runs[name=retryhttp].throttled-->237 429s
//
// The file is relative to the markdown file. What follows the marker is
// the figure as written: 1,234.5 with a sign and a unit if any; it must
// be the saved value rounded to the decimals written (27.5 may be written
// 28 or 27). Units: figures read from benchmark output are times or sizes,
// and the prose says which unit it writes (ns, µs, ms, s; B, KiB, MiB);
// other figures are compared as they are (write %, x and s freely, and
// scale in the expression: ...*100 for a percentage).
//
// The expression after the file picks the figure and may compute with it:
//
//	runs[name=retryhttp].throttled       a member; the element whose name is retryhttp
//	runs[3].throttled, runs.3.throttled  an element by index
//	"sec/op"."Retry/retryhttp-2"         quoted names, for any characters
//	runs[name=aws-adaptive].throttled / runs[name=retryhttp].throttled
//	(a - b) * 100                        + - * / and parentheses
//
// Saved runs are JSON (.json); go test -bench output (.txt), read as
// "BenchmarkName-2"."ns/op" with the median of the runs, as benchstat
// takes it; or markdown written by a script (.md, docs/benchmarks.md),
// read as its benchstat blocks ("sec/op"."Paired/GET/retryhttp-2") and its
// tables (column header, then the row's first cell: "429s"."retryhttp").
//
// Shorter marks:
//
//	<!--n-source:hedging.json-->      the run for the marks after it that name none
//	<!--n-let:rh=runs[name=retryhttp]-->  a name for a figure or a part of the run
//	<!--n:rh.throttled-->237
//
// A whole table: a marker right before it names the list its rows come
// from (in order, as many) and, for each column, the figure(s) of the row
// that its cells show (comma-separated, in the order the cell writes them;
// _ for a column not checked). A cell with one number stands for all its
// column's figures; a cell with no number, for a null ("never", "–"); a
// column whose figure is a string must read that string.
//
//	<!--table:throttling.json:runs|_|attempts|throttled|goodput_ratio|converge_seconds|reconverge_seconds|jain-->
//	| implementation | attempts | 429s | ...
//
// A ```json block that shows (part of) a saved run: <!--json:fleet.json-->
// before it; every value in the block must be the run's.
//
// To add a figure: save the run its command prints (add the command to
// lab/runs.sh), quote the figure with a marker, and run this package's
// tests. After a new run, the tests list every figure that changed: update
// the prose with them, including what it says about them.
package check

// Command matrix runs the throttling matrix: every workload of
// bench.ThrottleMatrix, for several seeds, with no limiter, the AWS SDK's
// adaptive mode through a real STS client, failsafe-go's adaptive throttler
// and retryhttp's default RateLimiter, in fake time (testing/synctest), and
// checks issue 18's goals for retryhttp:
//
//	cd lab/bench && go run ./cmd/matrix                  # tables (several minutes)
//	cd lab/bench && go run ./cmd/matrix -json > ../runs/throttling-matrix.json
//	cd lab/bench && go run ./cmd/matrix -in ../runs/throttling-matrix.json
//	cd lab/bench && go run ./cmd/matrix -smoke           # CI-sized
//	cd lab/bench && go run ./cmd/matrix -heldout -seeds 3 -json > ../runs/throttling-heldout.json
//	cd lab/bench && go run ./cmd/matrix -heldout2 -seeds 3 -json > ../runs/throttling-heldout2.json
//	cd lab/bench && go run ./cmd/matrix -only drop10x -maxwait 250ms
//	cd lab/bench && go run ./cmd/matrix -workloads heldout.json -seeds 3
//	cd lab/bench && go run ./cmd/matrix -trace -only 'steady/10c/2x'
//
// -maxwait adds a peer "retryhttp-variant": retryhttp with a RateLimiter
// so configured, whose goals are checked too. Built with the tag
// retryhttp_ablate, the RateLimiter reads RETRYHTTP_ABLATE (see
// ../ablate.go in the root, and ablate.sh) to switch a tuned number off. To measure
// a change to retryhttp quickly, run only its peers against a saved run of
// the others (the AWS SDK's runs take most of the time):
//
//	go run ./cmd/matrix -peers retryhttp -against ../runs/throttling-matrix.json
//
// -workloads runs the workloads of a saved report instead of the matrix's:
// a held-out set, kept out of the repo so that nothing is tuned on it, is
// run the same way and checked against the same goals.
//
// -trace runs retryhttp alone, seed 1 (or -seed), and prints each client's
// RateLimiter rate and state second by second (or each -every), the cuts,
// 429s and successes in each second, and each client's cuts: where a goal
// is missed, it shows which clients the limiter left where, and when.
//
// Fake-time bubbles in one process do not run faster in parallel, so the
// matrix is split into -procs shards, each run by a copy of this command in
// a process of its own. A bubble needs a *testing.T: each shard runs as the
// one test of a testing.Main, whose own output goes to stderr.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/lab/bench"
)

func main() {
	asJSON := flag.Bool("json", false, "print the report as JSON")
	in := flag.String("in", "", "print the tables of a report saved with -json instead of running")
	seeds := flag.Int("seeds", bench.MatrixSeeds, "seeds per workload")
	only := flag.String("only", "", "run only the workloads whose names match this regexp")
	smoke := flag.Bool("smoke", false, "run the CI-sized matrix (bench.SmokeMatrix) with one seed")
	heldout := flag.Bool("heldout", false, "run the held-out workloads (bench.HeldOutWorkloads) instead of the matrix")
	heldout2 := flag.Bool("heldout2", false, "run the second held-out set (bench.HeldOutWorkloads2) instead of the matrix")
	maxWait := flag.Duration("maxwait", 0, "add retryhttp-variant: a RateLimiter with this MaxWait")
	peerRE := flag.String("peers", "", "run only the peers whose names match this regexp")
	against := flag.String("against", "", "take the runs of the peers not run from this saved report (same workloads and seeds)")
	procs := flag.Int("procs", runtime.NumCPU(), "processes to run the matrix in")
	from := flag.String("workloads", "", "run the workloads of this saved report (a held-out set kept outside the repo) instead of the matrix")
	trace := flag.Bool("trace", false, "print each client's RateLimiter rate, second by second, in retryhttp's run (seed 1, or -seed) of each workload")
	traceSeed := flag.Int("seed", 1, "with -trace: the seed to run")
	traceEvery := flag.Duration("every", time.Second, "with -trace: the interval between samples")
	summaries := flag.Bool("summaries", false, "with -json: print only the goals summed up per checked peer, not every run")
	label := flag.String("label", "", "describe the run in the report's variant field (an ablation's setting)")
	shard := flag.String("shard", "", "internal: run shard i/n of the matrix and print its results as JSON")
	testing.Init()
	flag.Parse()

	if *in != "" {
		// The goals checked again: a report saved under other goals reads
		// against the current ones.
		r := read(*in)
		checked := r.Checked
		if len(checked) == 0 {
			checked = []string{bench.PeerRetryHTTP}
		}
		again := bench.NewMatrixReport(r.Results, r.Seeds, checked, bench.IssueThrottleGoals())
		again.Date, again.Go, again.Modules, again.Variant = r.Date, r.Go, r.Modules, r.Variant
		again.Print(os.Stdout)
		return
	}

	workloads := bench.ThrottleMatrix()
	if *from != "" {
		workloads = nil
		for _, r := range read(*from).Results {
			workloads = append(workloads, r.Workload)
		}
	}
	if *heldout {
		workloads = bench.HeldOutWorkloads()
	}
	if *heldout2 {
		workloads = bench.HeldOutWorkloads2()
	}
	if *smoke {
		workloads = bench.SmokeMatrix()
		if !isSet("seeds") {
			*seeds = 1
		}
	}
	if *only != "" {
		re := mustCompile(*only)
		var w []bench.Workload
		for _, x := range workloads {
			if re.MatchString(x.Name) {
				w = append(w, x)
			}
		}
		workloads = w
	}
	if *trace {
		runInBubbles(func(t *testing.T, out *os.File) {
			for _, w := range workloads {
				fmt.Fprint(out, traceRates(t, w, max(*traceSeed, 1), max(*traceEvery, time.Millisecond)))
			}
		})
		return
	}

	peers := bench.DefaultThrottlePeers()
	checked := []string{bench.PeerRetryHTTP}
	var variant string
	if *maxWait > 0 {
		variant = "RateLimiter{MaxWait: " + maxWait.String() + "}"
		peers = append(peers, bench.RetryHTTPPeer("retryhttp-variant", func() *retryhttp.RateLimiter {
			return &retryhttp.RateLimiter{MaxWait: *maxWait}
		}))
		checked = append(checked, "retryhttp-variant")
	}
	if *peerRE != "" {
		re := mustCompile(*peerRE)
		var p []bench.ThrottlePeer
		for _, x := range peers {
			if re.MatchString(x.Name) {
				p = append(p, x)
			}
		}
		peers = p
	}

	finish := func(results []bench.WorkloadResult, out io.Writer) {
		if *against != "" {
			results = bench.MergeResults(results, read(*against).Results)
		}
		report := bench.NewMatrixReport(results, *seeds, checked, bench.IssueThrottleGoals())
		report.Variant = variant
		if *label != "" {
			report.Variant = *label
		}
		if *summaries {
			report.Results, report.Checks = nil, nil
		}
		if *asJSON {
			enc := json.NewEncoder(out)
			enc.SetIndent("", " ")
			if err := enc.Encode(report); err != nil {
				fail(err)
			}
			return
		}
		report.Print(out)
	}

	if *shard != "" {
		var i, n int
		if _, err := fmt.Sscanf(*shard, "%d/%d", &i, &n); err != nil || n < 1 || i < 0 || i >= n {
			fail(fmt.Errorf("-shard %q: want i/n with 0 <= i < n", *shard))
		}
		runInBubbles(func(t *testing.T, out *os.File) {
			results := runShard(t, workloads, peers, *seeds, i, n)
			if err := json.NewEncoder(out).Encode(results); err != nil {
				t.Fatal(err)
			}
		})
		return
	}
	if *procs <= 1 {
		runInBubbles(func(t *testing.T, out *os.File) {
			finish(runShard(t, workloads, peers, *seeds, 0, 1), out)
		})
		return
	}

	exe, err := os.Executable()
	if err != nil {
		fail(err)
	}
	parts := make([][]bench.WorkloadResult, *procs)
	errs := make([]error, *procs)
	var wg sync.WaitGroup
	for i := range *procs {
		wg.Go(func() {
			args := append(os.Args[1:len(os.Args):len(os.Args)], "-shard", fmt.Sprintf("%d/%d", i, *procs))
			cmd := exec.Command(exe, args...)
			var stdout bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
			if errs[i] = cmd.Run(); errs[i] == nil {
				errs[i] = json.Unmarshal(stdout.Bytes(), &parts[i])
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			fail(fmt.Errorf("shard %d/%d: %w", i, *procs, err))
		}
	}
	finish(bench.CombineResults(workloads, parts...), os.Stdout)
}

// runShard runs one shard of the matrix, telling its progress on stderr.
func runShard(t *testing.T, workloads []bench.Workload, peers []bench.ThrottlePeer, seeds, i, n int) []bench.WorkloadResult {
	start := time.Now()
	done := 0
	return bench.RunThrottleMatrixShard(t, workloads, peers, seeds, i, n, func(r bench.WorkloadResult) {
		done++
		fmt.Fprintf(os.Stderr, "shard %d/%d: %-36s %d seed(s) done, %v\n", i, n, r.Workload.Name, len(r.Runs)/max(len(peers), 1), time.Since(start).Round(time.Second))
	})
}

// traceRates runs retryhttp's default RateLimiter on w with seed and
// renders each client's rate and state (its first letter) at the end of each
// interval of every, their sum and the cuts in the interval (with every a
// second, the server's 429s and the callers' successes in it as well), each
// client's cuts, and the run's goodput, 429s and Jain.
func traceRates(t *testing.T, w bench.Workload, seed int, every time.Duration) string {
	var (
		mu       sync.Mutex
		lims     []*retryhttp.RateLimiter
		rows     []string
		lastCuts uint64
	)
	sample := func() {
		var b strings.Builder
		fmt.Fprintf(&b, "%7v", time.Duration(len(rows)+1)*every)
		mu.Lock()
		var sum float64
		var cuts uint64
		for _, l := range lims {
			st := l.Stats()
			fmt.Fprintf(&b, " %6.1f%c", st.Rate, st.State[0])
			sum += st.Rate
			cuts += st.Cuts
		}
		mu.Unlock()
		fmt.Fprintf(&b, " | sum %7.1f cuts %4d", sum, cuts-lastCuts)
		lastCuts = cuts
		rows = append(rows, b.String())
	}
	peer := bench.RetryHTTPPeer(bench.PeerRetryHTTP, func() *retryhttp.RateLimiter {
		l := &retryhttp.RateLimiter{}
		mu.Lock()
		defer mu.Unlock()
		if len(lims) == 0 {
			// The first client's limiter is made in the run's bubble: so
			// is the sampler's timer, in the bubble's fake time. A timer,
			// not a sleeping goroutine: a run whose first limiter is made
			// late ends before the last sample, and a goroutine still
			// asleep then would fail the bubble.
			var tick func()
			tick = func() {
				sample()
				if len(rows) < int(w.Duration/every) {
					time.AfterFunc(every, tick)
				}
			}
			time.AfterFunc(every, tick)
		}
		lims = append(lims, l)
		return l
	})
	// The last of seed shards of seed seeds runs that seed alone.
	run := bench.RunThrottleMatrixShard(t, []bench.Workload{w}, []bench.ThrottlePeer{peer}, seed, seed-1, seed, nil)[0].Runs[0]
	var b strings.Builder
	fmt.Fprintf(&b, "%s: goodput %.3f, %d 429s, Jain %.3f; rate per client (0: not limiting):\n", w.Name, run.Goodput, run.Throttled, run.Jain)
	for i, r := range rows {
		b.WriteString(r)
		if se := run.Series; se != nil && i < len(se.Throttled) && every == time.Second {
			fmt.Fprintf(&b, " 429s %4d ok %4d", se.Throttled[i], se.CallerOK[i])
		}
		b.WriteString("\n")
	}
	b.WriteString(" cuts")
	for _, l := range lims {
		fmt.Fprintf(&b, " %6d", l.Stats().Cuts)
	}
	b.WriteString("\n\n")
	return b.String()
}

// runInBubbles runs f as the one test of a testing.Main (synctest needs a
// *testing.T), with the process's stdout as out: testing.Main's own verdict
// goes to stderr. It exits the process.
func runInBubbles(f func(t *testing.T, out *os.File)) {
	out := os.Stdout
	os.Stdout = os.Stderr
	testing.Main(func(string, string) (bool, error) { return true, nil },
		[]testing.InternalTest{{Name: "ThrottleMatrix", F: func(t *testing.T) { f(t, out) }}}, nil, nil)
}

func read(file string) bench.MatrixReport {
	var r bench.MatrixReport
	b, err := os.ReadFile(file)
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if err != nil {
		fail(err)
	}
	return r
}

func mustCompile(expr string) *regexp.Regexp {
	re, err := regexp.Compile(expr)
	if err != nil {
		fail(err)
	}
	return re
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "matrix:", err)
	os.Exit(1)
}

func isSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

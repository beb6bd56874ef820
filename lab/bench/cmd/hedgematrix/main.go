// Command hedgematrix runs the hedging matrix over real loopback
// connections, HTTP/1.1 and h2c: a tail of 1% slow copies, a lognormal
// latency, and everyone slow for 5 s, each hedged at the p95 measured
// without hedging, with failsafe-go's hedge policy (without and with its
// budget, and at its automatic p95) and retryhttp (default Budget and
// unlimited), and checks issue 18's hedging goals for retryhttp:
//
//	cd lab/bench && go run ./cmd/hedgematrix                 # tables (a few minutes)
//	cd lab/bench && go run ./cmd/hedgematrix -json > ../runs/hedging-matrix.json
//	cd lab/bench && go run ./cmd/hedgematrix -in ../runs/hedging-matrix.json
//	cd lab/bench && go run ./cmd/hedgematrix -smoke          # CI-sized
//
// It runs in real time: keep the machine otherwise idle.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/herdproof/retryhttp/lab/bench"
)

func main() {
	asJSON := flag.Bool("json", false, "print the report as JSON")
	in := flag.String("in", "", "print the tables of a report saved with -json instead of running")
	seeds := flag.Int("seeds", 5, "seeds per workload and protocol")
	smoke := flag.Bool("smoke", false, "run the CI-sized matrix (bench.SmokeHedgeMatrix) with one seed")
	peerRE := flag.String("peers", "", "run only the peers whose names match this regexp (and \"none\", which measures the delay)")
	flag.Parse()

	if *in != "" {
		var r bench.HedgeReport
		b, err := os.ReadFile(*in)
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		r.Print(os.Stdout)
		return
	}
	workloads := bench.HedgeMatrix()
	if *smoke {
		workloads = bench.SmokeHedgeMatrix()
		if !isSet("seeds") {
			*seeds = 1
		}
	}
	peers := bench.DefaultHedgePeers()
	if *peerRE != "" {
		re, err := regexp.Compile(*peerRE)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		var p []bench.HedgePeer
		for _, x := range peers {
			if x.Name == bench.HedgePeerNone || re.MatchString(x.Name) {
				p = append(p, x)
			}
		}
		peers = p
	}
	start := time.Now()
	failed := 0
	results := bench.RunHedgeMatrix(workloads, peers, *seeds, func(r bench.HedgeResult) {
		fmt.Fprintf(os.Stderr, "%6v seed %d %-18s %-20s p99.9 %7.1f ms, %.3f copies a request, %d failed\n",
			time.Since(start).Round(time.Second), r.Seed, r.Key(), r.Peer, r.P999Ms, r.RequestsPerRequest, r.Failed)
		if r.Peer == bench.HedgePeerRetryHTTP || strings.HasPrefix(r.Peer, bench.HedgePeerRetryHTTP+"-") {
			failed += r.Failed
		}
	})
	if failed > 0 {
		// Every request's context is alive to its end: none should fail.
		fmt.Fprintf(os.Stderr, "retryhttp: %d requests failed\n", failed)
		defer os.Exit(1)
	}
	report := bench.NewHedgeReport(workloads, results, *seeds, []string{bench.HedgePeerRetryHTTP}, bench.IssueHedgeGoals())
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", " ")
		if err := enc.Encode(report); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	report.Print(os.Stdout)
}

func isSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

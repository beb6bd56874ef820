package bench

import (
	"encoding/json"
	"math"
	"os"
	"reflect"
	"testing"

	"github.com/herdproof/retryhttp"
)

// matrixFile is the saved full run of the throttling matrix (matrix.sh).
const matrixFile = "../runs/throttling-matrix.json"

// knownMisses are issue 33's goals that the default RateLimiter does not
// meet on the saved run of the matrix, each with the reason;
// docs/throttling.md gives the figures. A miss not listed here fails
// TestThrottleMatrixGoals, and so does a listed goal that is met: the list
// is the exact account of what the defaults do not achieve.
var knownMisses = map[[2]string]string{
	{"steady/1c/1.25x/5ms/1s", Goal429s}:       missProbes,
	{"steady/1c/1.25x/0ms/2s", Goal429s}:       missProbes,
	{"steady/1c/2x/50ms/5s", Goal429s}:         missInFlight,
	{"steady/1c/1.25x/0ms/1s/ra", Goal429s}:    missProbes,
	{"steady/10c/5x/50ms/500ms", Goal429s}:     missInFlight,
	{"steady/10c/5x/50ms/500ms", GoalFairness}: missFairness,
	{"drop10x/10c/2x/5ms/2s", Goal429s}:        missStart,
	{"steps/10c/2x/5ms/1s", GoalRecovery}:      missRecovery,
	{"drop10x/100c/1.25x/0ms/5s", GoalGoodput}: missTiny,
	{"steps/20u/5x/50ms/2s", Goal429s}:         missStart,
	{"halves/10c/5x/5ms/1s", Goal429s}:         missStart,
	{"drop10x/10c/2x/5ms/2s", GoalFairness}:    missFairness,
	{"drop10x/10u/2x/5ms/2s/ra", Goal429s}:     missStart,
	{"drop10x/50u/5x/5ms/2s", Goal429s}:        missStart,
}

// Why the default RateLimiter misses a goal where it does.
const (
	missProbes = "one client: each probe past the capacity costs a throttle, and the hold (limHold at most) " +
		"lets one come every few seconds; the AWS SDK's cubic, 0.4/s^3 whatever the client's size, climbs back to a " +
		"rate of 100/s in about 4 s, and its 429s are as few (6 or 7 in 30 s)"
	missInFlight = "answers take 50 ms: a probe that passes the capacity draws the throttles of the attempts already in flight"
	missFairness = "rates move on throttles that fall on one client at a time, and the hold keeps a client cut low " +
		"for up to limHold while the others probe: shares even out less than under the AWS SDK's steadier cubic"
	missStart = "the start: every client's first cut keeps a quarter of what it sent, and the next rounds cut by the " +
		"accepted share; the first seconds draw two to three times the AWS SDK's 429s, whose first throttle " +
		"drops to its minimum rate (it has measured no send rate yet)"
	missRecovery = "a capacity that rises after a fall: the fall's deep cuts reset the hold, but a client that was held " +
		"at the low capacity probes again only when its hold ends"
	missTiny = "100 clients at 1.25 requests a second with 1 s deadlines: a client may wait a tenth of 1 s, less than " +
		"the interval of its share, so permits go unused when its arrivals pause"
)

// TestThrottleMatrixGoals asserts issue 33's goals for the default
// RateLimiter on the saved full run of the matrix (every workload,
// MatrixSeeds seeds, the AWS SDK's adaptive mode through a real STS client: minutes of
// CPU, so it is run by matrix.sh, not here), and that the saved run is the
// current code's: a few workloads are run again live, in fake time, and
// must match their saved first seed.
func TestThrottleMatrixGoals(t *testing.T) {
	var report MatrixReport
	b, err := os.ReadFile(matrixFile)
	if err == nil {
		err = json.Unmarshal(b, &report)
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range report.Results {
		names = append(names, r.Workload.Name)
		for _, p := range []string{PeerNone, PeerAWS, PeerFailsafe, PeerRetryHTTP} {
			if s, ok := r.Peer(p); !ok || len(r.Runs) != report.Seeds*4 || s.Goodput.Median == 0 {
				t.Errorf("%s: %s missing or incomplete in the saved run", r.Workload.Name, p)
			}
		}
	}
	var want []string
	for _, w := range ThrottleMatrix() {
		want = append(want, w.Name)
	}
	if !reflect.DeepEqual(names, want) || report.Seeds != MatrixSeeds {
		t.Fatalf("the saved run has workloads %q with %d seeds; want the matrix's %q with %d: run lab/bench/matrix.sh", names, report.Seeds, want, MatrixSeeds)
	}

	checks := CheckThrottleGoals(report.Results, PeerRetryHTTP, IssueThrottleGoals())
	met := map[string]int{}
	total := map[string]int{}
	seen := map[[2]string]bool{}
	for _, c := range checks {
		key := [2]string{c.Workload, c.Goal}
		seen[key] = true
		reason, known := knownMisses[key]
		total[c.Goal]++
		switch {
		case c.OK && known:
			t.Errorf("%s: met now; drop it from knownMisses (%s)", c, reason)
		case c.OK:
			met[c.Goal]++
		case !known:
			t.Errorf("%s: not a known miss", c)
		}
	}
	for key := range knownMisses {
		if !seen[key] {
			t.Errorf("knownMisses lists %s on %s, which the matrix does not check", key[1], key[0])
		}
	}
	for _, g := range Goals {
		t.Logf("%s: met on %d of %d workloads", g, met[g], total[g])
	}

	t.Run("saved run is the current code's", func(t *testing.T) {
		live := map[string]bool{
			"steady/1c/1.25x/5ms/1s": true, "steady/10u/5x/5ms/2s": true,
			"drop10x/10c/2x/5ms/2s": true, "quota5s/10u/2x/5ms/2s": true, "steady/100u/5x/5ms/2s": true,
		}
		var ws []Workload
		for _, w := range ThrottleMatrix() {
			if live[w.Name] {
				ws = append(ws, w)
			}
		}
		peer := RetryHTTPPeer(PeerRetryHTTP, func() *retryhttp.RateLimiter { return &retryhttp.RateLimiter{} })
		for _, r := range RunThrottleMatrix(t, ws, []ThrottlePeer{peer}, 1, nil) {
			got := r.Runs[0]
			var saved ThrottleResult
			for _, s := range report.Results {
				for _, run := range s.Runs {
					if s.Workload.Name == r.Workload.Name && run.Peer == PeerRetryHTTP && run.Seed == 1 {
						saved = run
					}
				}
			}
			// Goroutines that wake at the same fake instant may run in
			// any order, so a run can differ by a request or two.
			if math.Abs(got.Goodput-saved.Goodput) > 0.01 || math.Abs(float64(got.Throttled-saved.Throttled)) > 3+0.05*float64(saved.Throttled) ||
				math.Abs(got.Jain-saved.Jain) > 0.02 || !sameSeconds(float64(got.RecoverySeconds), float64(saved.RecoverySeconds)) {
				t.Errorf("%s: got goodput %.3f, %d 429s, back in %v s, Jain %.3f; saved %.3f, %d, %v s, %.3f: run lab/bench/matrix.sh",
					r.Workload.Name, got.Goodput, got.Throttled, got.RecoverySeconds, got.Jain,
					saved.Goodput, saved.Throttled, saved.RecoverySeconds, saved.Jain)
			}
		}
	})
}

// sameSeconds reports whether two recovery times agree within 0.5 s, or
// are both never (Inf) or not applicable (NaN).
func sameSeconds(a, b float64) bool {
	switch {
	case math.IsNaN(a) || math.IsNaN(b):
		return math.IsNaN(a) && math.IsNaN(b)
	case math.IsInf(a, 1) || math.IsInf(b, 1):
		return a == b
	}
	return math.Abs(a-b) <= 0.5
}

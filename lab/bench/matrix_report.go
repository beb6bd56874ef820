package bench

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// MatrixReport is a saved run of the throttling matrix (what cmd/matrix
// -json writes, and -in reads).
type MatrixReport struct {
	Date string `json:"date"`
	Go   string `json:"go"`
	// Modules are the peers' module versions.
	Modules []string `json:"modules"`
	Seeds   int      `json:"seeds"`
	// Variant describes retryhttp-variant's RateLimiter, if it ran.
	Variant string `json:"variant,omitempty"`
	// Checked are the peers whose goals are checked.
	Checked []string         `json:"checked"`
	Goals   ThrottleGoals    `json:"goals"`
	Results []WorkloadResult `json:"results"`
	Checks  []GoalCheck      `json:"checks"`
	// Summaries sum the goals up over the matrix, one per checked peer.
	Summaries []GoalSummary `json:"summaries"`
}

// GoalSummary is one peer's standing against the goals over a whole matrix:
// how many workloads met each goal, and how far from its references the
// peer was on average, so that settings can be compared in one line.
type GoalSummary struct {
	Peer string `json:"peer"`
	// Met and Of count, per goal (GoalGoodput, ...), the workloads that
	// met it and those it was checked on.
	Met map[string]int `json:"met"`
	Of  map[string]int `json:"of"`
	// GoodputOverBest is the mean over the workloads of the peer's
	// goodput over the best of PeerAWS's and PeerNone's.
	GoodputOverBest Num `json:"goodput_over_best"`
	// ThrottledOverAWS is the geometric mean over the workloads of the
	// peer's 429s over PeerAWS's, each plus one (so that none is 0).
	ThrottledOverAWS Num `json:"throttled_over_aws"`
	// RecoveryMedian is the median over the workloads whose capacity
	// rises of the peer's back-to-90% time, in seconds ("inf" if it is
	// never).
	RecoveryMedian Num `json:"recovery_median_s"`
	// JainMinusAWS is the mean over the workloads of several clients of
	// the peer's Jain's index minus PeerAWS's.
	JainMinusAWS Num `json:"jain_minus_aws"`
}

// SummarizeGoals sums up the goals of the peer called ours over results,
// from checks (its GoalChecks) and the medians over the seeds.
func SummarizeGoals(results []WorkloadResult, ours string, checks []GoalCheck) GoalSummary {
	s := GoalSummary{Peer: ours, Met: map[string]int{}, Of: map[string]int{}}
	for _, c := range checks {
		if c.Peer == ours {
			s.Of[c.Goal]++
			if c.OK {
				s.Met[c.Goal]++
			}
		}
	}
	var gp, logT, jain, recs []float64
	for _, r := range results {
		me, ok := r.Peer(ours)
		if !ok {
			continue
		}
		aws, haveAWS := r.Peer(PeerAWS)
		none, haveNone := r.Peer(PeerNone)
		best := math.Inf(-1)
		if haveAWS {
			best = float64(aws.Goodput.Median)
		}
		if haveNone {
			best = max(best, float64(none.Goodput.Median))
		}
		if best > 0 {
			gp = append(gp, float64(me.Goodput.Median)/best)
		}
		if haveAWS {
			logT = append(logT, math.Log((float64(me.Throttled.Median)+1)/(float64(aws.Throttled.Median)+1)))
			if len(r.Workload.Rates) > 1 {
				jain = append(jain, float64(me.Jain.Median-aws.Jain.Median))
			}
		}
		if len(r.Workload.rises()) > 0 {
			recs = append(recs, float64(me.Recovery.Median))
		}
	}
	s.GoodputOverBest = Num(mean(gp))
	s.ThrottledOverAWS = Num(math.Exp(mean(logT)))
	s.JainMinusAWS = Num(mean(jain))
	s.RecoveryMedian = Num(math.NaN())
	if len(recs) > 0 {
		slices.Sort(recs)
		n := len(recs)
		s.RecoveryMedian = Num((recs[(n-1)/2] + recs[n/2]) / 2)
	}
	return s
}

// mean is the mean of v, NaN if it is empty.
func mean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	var sum float64
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

// NewMatrixReport checks the goals of each peer in checked on results.
func NewMatrixReport(results []WorkloadResult, seeds int, checked []string, g ThrottleGoals) MatrixReport {
	r := MatrixReport{Date: time.Now().UTC().Format("2006-01-02"), Go: runtime.Version(), Modules: PeerModules(),
		Seeds: seeds, Checked: checked, Goals: g, Results: results}
	for _, p := range checked {
		checks := CheckThrottleGoals(results, p, g)
		r.Checks = append(r.Checks, checks...)
		r.Summaries = append(r.Summaries, SummarizeGoals(results, p, checks))
	}
	return r
}

// Print writes the report's tables as Markdown.
func (r MatrixReport) Print(w io.Writer) {
	fmt.Fprintf(w, "Throttling matrix, %s, %s, %d seed(s) per workload; %s\n\n", r.Date, r.Go, r.Seeds, strings.Join(r.Modules, ", "))
	fmt.Fprint(w, "Medians over the seeds, [min-max] when they differ. Goodput: the successes callers saw before their deadline, "+
		"over the integral of min(capacity, offered load) over the run; \"last phase\" is the same after the capacity's last step. "+
		"Back to 90%: after each rise of the capacity, the end of the first trailing second in which callers saw 90% of "+
		"min(offered load, new capacity), minus the rise, the longest over the rises (an instant recovery reads about 0.9 s). "+
		"Jain: Jain's index of the clients' success shares (successes over calls, per client, so that a client offering "+
		"more is expected to get more): (sum x)^2 / (n sum x^2). Wait p50: the median time from a call to its first attempt "+
		"reaching the server, over the calls that sent one; not sent: calls that never reached it. Server OK / caller OK: "+
		"2xx the server sent, and those callers saw before their deadline.\n\n")
	fmt.Fprint(w, ThrottleMatrixTable(r.Results))
	for _, p := range r.Checked {
		var mine []GoalCheck
		for _, c := range r.Checks {
			if c.Peer == p {
				mine = append(mine, c)
			}
		}
		g := r.Goals
		fmt.Fprintf(w, "\nGoals of issue 33 for %s against %s (goodput >= its - %g; 429s <= %g of its; back to 90%% within its time + %g s; Jain >= its - %g; wait p50 < %g of the deadline):\n\n",
			p, PeerAWS, g.GoodputSlack, g.ThrottleShare, g.RecoverySlack, g.JainSlack, g.WaitShare)
		fmt.Fprint(w, ThrottleGoalsTable(r.Results, mine))
		for _, s := range r.Summaries {
			if s.Peer == p {
				fmt.Fprintf(w, "\nOver the matrix: goodput over the best, mean %.4f; 429s over %s's (each plus one), geometric mean %.3f; back to 90%%, median %s; Jain minus %s's, mean %+.4f.\n",
					float64(s.GoodputOverBest), PeerAWS, float64(s.ThrottledOverAWS), fmtSeconds(float64(s.RecoveryMedian)), PeerAWS, float64(s.JainMinusAWS))
			}
		}
	}
}

// PeerModules lists the peers' modules with their versions, as built.
func PeerModules() []string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	var mods []string
	for _, d := range info.Deps {
		switch d.Path {
		case "github.com/aws/aws-sdk-go-v2", "github.com/aws/aws-sdk-go-v2/service/sts", "github.com/failsafe-go/failsafe-go":
			mods = append(mods, d.Path+" "+d.Version)
		}
	}
	return mods
}

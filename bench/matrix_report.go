package bench

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
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
	// Checked are the peers whose goals are checked.
	Checked []string         `json:"checked"`
	Goals   ThrottleGoals    `json:"goals"`
	Results []WorkloadResult `json:"results"`
	Checks  []GoalCheck      `json:"checks"`
}

// NewMatrixReport checks the goals of each peer in checked on results.
func NewMatrixReport(results []WorkloadResult, seeds int, checked []string, g ThrottleGoals) MatrixReport {
	r := MatrixReport{Date: time.Now().UTC().Format("2006-01-02"), Go: runtime.Version(), Modules: PeerModules(),
		Seeds: seeds, Checked: checked, Goals: g, Results: results}
	for _, p := range checked {
		r.Checks = append(r.Checks, CheckThrottleGoals(results, p, g)...)
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
		fmt.Fprintf(w, "\nGoals of issue 18 for %s (goodput >= %.0f%% of the best of %s and %s; 429s <= %.0f%% of %s's; back to 90%% within %g s; Jain >= %s's):\n\n",
			p, 100*r.Goals.GoodputShare, PeerAWS, PeerNone, 100*r.Goals.ThrottleShare, PeerAWS, r.Goals.RecoverWithin, PeerAWS)
		fmt.Fprint(w, ThrottleGoalsTable(r.Results, mine))
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

package herd

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/internal/ratio"
)

// BudgetKind names a budget compared in docs/budget.md.
type BudgetKind struct {
	Name string
	New  func(now func() time.Time) retryhttp.Budget
}

// ratioBudget is retryhttp.NewRatioBudget's code on a simulated clock.
type ratioBudget struct{ ratio.Budget }

func (b *ratioBudget) Deposit(bool) { b.Budget.Deposit() }

func (b *ratioBudget) Withdraw(context.Context, retryhttp.Class) (func(bool), bool) {
	slot, ok := b.Budget.Withdraw()
	if !ok {
		return nil, false
	}
	return func(sent bool) {
		if !sent {
			b.Refund(slot)
		}
	}, true
}

// Budgets are the budgets docs/budget.md compares: the AWS SDKs' token
// bucket and the ratio budget with its defaults (10% of requests plus 10 a
// second over 10 s), and the ratio alone (the SRE book's 10%).
var Budgets = []BudgetKind{
	{"token bucket (500, 14/5, +1)", func(func() time.Time) retryhttp.Budget {
		return retryhttp.NewTokenBucket(retryhttp.DefaultBudgetTokens)
	}},
	{"ratio 10% + 10/s over 10 s", func(now func() time.Time) retryhttp.Budget {
		return &ratioBudget{ratio.Budget{Now: now}}
	}},
	{"ratio 10% only", func(now func() time.Time) retryhttp.Budget {
		return &ratioBudget{ratio.Budget{PerSecond: -1, Now: now}}
	}},
}

// Second is what one simulated second of a BudgetRun saw.
type Second struct {
	T        int     `json:"t"`
	P        float64 `json:"p"`        // probability that an attempt fails
	Requests int     `json:"requests"` // requests started
	Attempts int     `json:"attempts"`
	Retries  int     `json:"retries"` // retries made
	Refused  int     `json:"refused"` // retries the budget refused
}

// Phase is a stretch of a BudgetRun with one failure probability.
type Phase struct {
	Seconds int
	P       float64
}

// BudgetRun drives the real Transport with budget b through the phases, at
// rate requests a simulated second, one after another; each attempt fails
// (503) with the phase's probability. Waits are zero and the clock is
// simulated (the ratio budget reads it), so a run is exact and quick: it
// measures the budget's decisions, not time.
func BudgetRun(kind BudgetKind, phases []Phase, rate int, seed uint64) []Second {
	var now time.Time = time.Unix(0, 0)
	clock := func() time.Time { return now }
	rng := rand.New(rand.NewPCG(seed, 7))
	var p float64
	base := roundTripper(func(req *http.Request) (*http.Response, error) {
		code := http.StatusOK
		if rng.Float64() < p {
			code = http.StatusServiceUnavailable
		}
		return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
	})
	var cur *Second
	tr := &retryhttp.Transport{Base: base, Budget: kind.New(clock),
		Policy: retryhttp.Policy{Rand: func(int64) int64 { return 0 }},
		OnAttempt: func(a retryhttp.Attempt) {
			cur.Attempts++
			switch a.Decision {
			case retryhttp.Retry:
				cur.Retries++
			case retryhttp.StopBudget:
				cur.Refused++
			}
		}}
	req, _ := http.NewRequest("GET", "http://budget.test/", nil)
	var out []Second
	t := 0
	for _, ph := range phases {
		p = ph.P
		for range ph.Seconds {
			out = append(out, Second{T: t, P: ph.P})
			cur = &out[len(out)-1]
			for i := range rate {
				now = time.Unix(int64(t), int64(i)*int64(time.Second)/int64(rate))
				cur.Requests++
				if resp, err := tr.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
			}
			t++
		}
	}
	return out
}

// Totals adds up the seconds in [from, to).
func Totals(s []Second, from, to int) Second {
	var sum Second
	for _, x := range s[from:min(to, len(s))] {
		sum.Requests += x.Requests
		sum.Attempts += x.Attempts
		sum.Retries += x.Retries
		sum.Refused += x.Refused
	}
	return sum
}

// OutageTimeline is docs/budget.md's timeline: 30 s healthy (1% of attempts
// fail), a 60 s outage, 60 s recovered (5% fail).
var OutageTimeline = []Phase{{30, 0.01}, {60, 1}, {60, 0.05}}

// Unlimited returns a budget that never refuses a retry in practice: a
// token bucket of math.MaxInt tokens. Simulations use it to show what no
// budget does.
func Unlimited() retryhttp.Budget { return retryhttp.NewTokenBucket(math.MaxInt) }

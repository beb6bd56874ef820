package retryhttp

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

func TestOverride(t *testing.T) {
	// The request's Override wins over the Transport's Policy; the budget
	// still pays for every retry it allows.
	tests := []struct {
		name     string
		policy   Policy
		budget   int
		override Override
		steps    []rht.Step
		attempts int
		decision Decision
		took     time.Duration
	}{
		{"no retries", Policy{}, 500, Override{MaxAttempts: 1},
			[]rht.Step{rht.Status(503)}, 1, StopAttempts, 0},
		{"more attempts", Policy{Rand: lowRand}, 500, Override{MaxAttempts: 5},
			[]rht.Step{rht.Status(503)}, 5, StopAttempts, 0},
		{"more attempts, never more than the budget pays", Policy{Rand: lowRand}, 2 * RetryCost, Override{MaxAttempts: 5},
			[]rht.Step{rht.Status(503)}, 3, StopBudget, 0},
		{"a shorter Timeout", Policy{Timeout: time.Minute}, 500, Override{Timeout: time.Second},
			[]rht.Step{rht.Status(200).WithDelay(time.Hour)}, 1, StopCanceled, time.Second},
		{"a longer Timeout", Policy{Timeout: time.Second}, 500, Override{Timeout: time.Minute},
			[]rht.Step{rht.Status(200).WithDelay(30 * time.Second)}, 1, Done, 30 * time.Second},
		{"an AttemptTimeout", Policy{Rand: lowRand}, 500, Override{AttemptTimeout: 10 * time.Millisecond},
			[]rht.Step{rht.Status(200).WithDelay(time.Hour), rht.Status(200)}, 2, Done, 10 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(tc.steps...)
				tr := &Transport{Base: base, Policy: tc.policy, Budget: newTokenBucket(tc.budget)}
				var rep Report
				req := newReq(t, "GET", "")
				req = req.WithContext(WithReport(WithOverride(req.Context(), tc.override), &rep))
				start := time.Now()
				_, _, err := roundTrip(t, tr, req)
				if took := time.Since(start); took != tc.took {
					t.Errorf("took %v; want %v", took, tc.took)
				}
				if tc.decision == StopCanceled && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("got %v; want the Override's deadline", err)
				}
				rht.AssertAttempts(t, base, tc.attempts)
				if rep.Decision != tc.decision {
					t.Errorf("got decision %v; want %v", rep.Decision, tc.decision)
				}
			})
		})
	}
}

func TestOverrideAndReportTogether(t *testing.T) {
	// Either order of WithReport and WithOverride keeps both.
	for _, order := range []string{"report first", "override first"} {
		t.Run(order, func(t *testing.T) {
			var rep Report
			ctx := context.Background()
			if order == "report first" {
				ctx = WithOverride(WithReport(ctx, &rep), Override{MaxAttempts: 1})
			} else {
				ctx = WithReport(WithOverride(ctx, Override{MaxAttempts: 1}), &rep)
			}
			base := rht.NewTransport(rht.Status(503))
			tr := &Transport{Base: base}
			roundTrip(t, tr, newReq(t, "GET", "").WithContext(ctx))
			rht.AssertAttempts(t, base, 1)
			if len(rep.History) != 1 || rep.Decision != StopAttempts {
				t.Errorf("got %d attempts in the Report, %v; want 1, attempts exhausted", len(rep.History), rep.Decision)
			}
		})
	}
}

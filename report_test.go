package retryhttp

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

func TestReport(t *testing.T) {
	t.Run("a 503 returned after the budget ran out", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tr := &Transport{Base: rht.NewTransport(rht.Status(503)), Budget: newTokenBucket(RetryCost), Policy: Policy{Rand: highRand}}
			var rep Report
			req := newReq(t, "GET", "")
			req = req.WithContext(WithReport(req.Context(), &rep))
			code, _, err := roundTrip(t, tr, req)
			if err != nil || code != 503 {
				t.Fatalf("got (%d, %v); want the 503 with a nil error", code, err)
			}
			if rep.Decision != StopBudget || len(rep.History) != 2 || rep.Attempts != 2 || rep.Duration != 50*time.Millisecond {
				t.Errorf("got decision %v, %d attempts listed, %d made, took %v; want StopBudget, 2, 2, the 50ms wait",
					rep.Decision, len(rep.History), rep.Attempts, rep.Duration)
			}
			if a := rep.History[0]; a.Status != 503 || a.Decision != Retry || a.Delay != 50*time.Millisecond {
				t.Errorf("attempt 1: got %v; want 503 -> retry in 50ms", a)
			}
		})
	})
	t.Run("canceled during the wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tr := &Transport{Base: rht.NewTransport(rht.Status(503)), Policy: Policy{Rand: highRand}}
			var rep Report
			ctx, cancel := context.WithCancel(WithReport(context.Background(), &rep))
			defer cancel()
			time.AfterFunc(10*time.Millisecond, cancel) // during the 50ms wait
			req := newReq(t, "GET", "").WithContext(ctx)
			if _, err := tr.RoundTrip(req); err == nil {
				t.Fatal("got a response; want an error")
			}
			if rep.Decision != StopCanceled || len(rep.History) != 1 || !rep.Abandoned {
				t.Errorf("got %v after %d attempts, abandoned %v; want StopCanceled after 1, abandoned in the wait", rep.Decision, len(rep.History), rep.Abandoned)
			}
		})
	})
	t.Run("no report: nothing recorded", func(t *testing.T) {
		if reportFrom(context.Background()) != nil {
			t.Error("got a Report from a bare context; want nil")
		}
	})
}

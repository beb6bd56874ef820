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
			tr := &Transport{Base: rht.NewTransport(rht.Status(503)), Budget: NewBudget(RetryCost), Policy: Policy{Rand: highRand}}
			var rep Report
			req := newReq(t, "GET", "")
			req = req.WithContext(WithReport(req.Context(), &rep))
			code, _, err := roundTrip(t, tr, req)
			if err != nil || code != 503 {
				t.Fatalf("got (%d, %v); want the 503 with a nil error", code, err)
			}
			if rep.Decision != StopBudget || len(rep.Attempts) != 2 || rep.Retries() != 1 || rep.Waited != 50*time.Millisecond {
				t.Errorf("got decision %v, %d attempts, %d retries, waited %v; want StopBudget, 2, 1, 50ms",
					rep.Decision, len(rep.Attempts), rep.Retries(), rep.Waited)
			}
			if a := rep.Attempts[0]; a.Status != 503 || a.Decision != Retry || a.Delay != 50*time.Millisecond {
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
			if rep.Decision != StopCanceled || len(rep.Attempts) != 1 || rep.Waited != 0 {
				t.Errorf("got %v after %d attempts, waited %v; want StopCanceled after 1, waited 0", rep.Decision, len(rep.Attempts), rep.Waited)
			}
		})
	})
	t.Run("no report: nothing recorded", func(t *testing.T) {
		if reportFrom(context.Background()) != nil {
			t.Error("got a Report from a bare context; want nil")
		}
	})
}

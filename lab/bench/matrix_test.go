package bench

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"reflect"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"
)

func TestRates(t *testing.T) {
	if got := EqualRates(4, 100); !reflect.DeepEqual(got, []float64{25, 25, 25, 25}) {
		t.Errorf("EqualRates(4, 100): got %v; want four times 25", got)
	}
	r := SpreadRates(3, 130, 9) // 1, 3, 9 scaled by 10
	for i, want := range []float64{10, 30, 90} {
		if math.Abs(r[i]-want) > 1e-9 {
			t.Errorf("SpreadRates(3, 130, 9)[%d]: got %v; want %v", i, r[i], want)
		}
	}
	if got := SpreadRates(1, 50, 10); !reflect.DeepEqual(got, []float64{50}) {
		t.Errorf("SpreadRates(1, 50, 10): got %v; want [50]", got)
	}
}

func TestWorkloadCapacity(t *testing.T) {
	w := Workload{Capacity: drop10x(100, 40*time.Second), Rates: []float64{60, 60}, Duration: 40 * time.Second}
	for _, tc := range []struct {
		at         time.Duration
		rate       float64
		next       time.Duration
		attainable float64 // from 0 to at
	}{
		{0, 100, 10 * time.Second, 0},
		{10 * time.Second, 10, 20 * time.Second, 1000},
		{15 * time.Second, 10, 20 * time.Second, 1050},
		{40 * time.Second, 100, math.MaxInt64, 1000 + 100 + 2000},
	} {
		rate, next := w.capacityAt(tc.at)
		if rate != tc.rate || next != tc.next {
			t.Errorf("capacityAt(%v): got %v until %v; want %v until %v", tc.at, rate, next, tc.rate, tc.next)
		}
		if got := w.attainable(0, tc.at); math.Abs(got-tc.attainable) > 1e-9 {
			t.Errorf("attainable(0, %v): got %v; want %v", tc.at, got, tc.attainable)
		}
	}
	if got := w.rises(); !reflect.DeepEqual(got, []int{2}) {
		t.Errorf("rises: got %v; want [2]", got)
	}
	if got := (Workload{Capacity: stepped(100, 40*time.Second)}).rises(); !reflect.DeepEqual(got, []int{3, 4}) {
		t.Errorf("stepped rises: got %v; want [3 4]", got)
	}
}

// TestMeasure computes the measures of a hand-made log.
func TestMeasure(t *testing.T) {
	ms := time.Millisecond
	s := time.Second
	// 10/s for 2 s, 1/s for 1 s, 10/s for 2 s; 20/s offered: 41 requests
	// could have succeeded.
	w := Workload{Capacity: []Step{{0, 10}, {2 * s, 1}, {3 * s, 10}}, Rates: []float64{5, 15}, Duration: 5 * s}
	log := runLog{w: w, calls: []callEntry{
		{client: 0, start: 0, first: 100 * ms, end: 150 * ms, ok: true},
		{client: 0, start: 1 * s, first: -1, end: 1500 * ms},
		{client: 0, start: 3 * s, first: 3200 * ms, end: 3250 * ms, ok: true},
		{client: 0, start: 4900 * ms, first: 4950 * ms, end: 5050 * ms, ok: true}, // after Duration
		{client: 1, start: 500 * ms, first: 500 * ms, end: 550 * ms, ok: true},
		{client: 1, start: 3 * s, first: 3400 * ms, end: 3450 * ms},
	}}
	bins := 60
	log.attempts, log.throttled, log.ok = make([]int, bins), make([]int, bins), make([]int, bins)
	log.attempts[1], log.ok[1] = 1, 1
	log.attempts[5], log.ok[5] = 1, 1
	log.attempts[32], log.ok[32] = 1, 1
	log.attempts[34], log.throttled[34] = 1, 1
	log.attempts[49], log.ok[49] = 1, 1
	got := measure(log)
	got.RecoverySeconds = 0 // below
	want := ThrottleResult{Calls: 6, CallerOK: 4, ServerOK: 4, Attempts: 5, Throttled: 1, NotSent: 1,
		Goodput:      0.073,                   // 3 within the 5 s / 41
		PhaseGoodput: []float64{0.1, 0, 0.05}, // 2/20, 0/1, 1/20
		Jain:         0.962,                   // shares 3/4 and 1/2: 1.25^2 / (2 x 0.8125)
		WaitP50Ms:    100,                     // of 0, 50, 100, 200, 400 ms
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}

	t.Run("recovery", func(t *testing.T) {
		// After the rise at 3 s the target is 9 a second (90% of 10); one
		// success every 100 ms from 3.5 s fills the trailing second to 9
		// with the bin that ends at 4.4 s.
		l := runLog{w: w, attempts: make([]int, bins), throttled: make([]int, bins), ok: make([]int, bins)}
		for at := 3550 * ms; at < 5*s; at += 100 * ms {
			l.calls = append(l.calls, callEntry{client: 1, start: at - 10*ms, first: at - 10*ms, end: at, ok: true})
		}
		if got := float64(measure(l).RecoverySeconds); math.Abs(got-1.4) > 1e-9 {
			t.Errorf("got %v s; want 1.4", got)
		}
		l.calls = l.calls[:8] // the last at 4.25 s: never 9 in a second
		if got := float64(measure(l).RecoverySeconds); !math.IsInf(got, 1) {
			t.Errorf("got %v s; want +Inf (never)", got)
		}
		l.w.Capacity = steady(10)
		if got := float64(measure(l).RecoverySeconds); !math.IsNaN(got) {
			t.Errorf("steady capacity: got %v s; want NaN (no rise)", got)
		}
	})

	t.Run("series", func(t *testing.T) {
		got := series(log)
		want := &Series{Attempts: []int{2, 0, 0, 2, 1}, Throttled: []int{0, 0, 0, 1, 0}, ServerOK: []int{2, 0, 0, 1, 1},
			CallerOK: []int{2, 0, 0, 1, 0}}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("got %+v; want %+v", got, want)
		}
	})
}

func TestJainShares(t *testing.T) {
	tests := []struct {
		name       string
		oks, calls []int
		want       float64
	}{
		{"equal shares of unequal rates", []int{10, 100}, []int{20, 200}, 1},
		{"one got all it asked, one nothing", []int{10, 0}, []int{10, 10}, 0.5},
		{"a client that made no calls is left out", []int{5, 0, 5}, []int{10, 0, 10}, 1},
		{"nobody got anything", []int{0, 0}, []int{3, 3}, 0},
		{"shares 1 and 1/2", []int{4, 2}, []int{4, 4}, 0.9}, // 1.5^2 / (2 x 1.25)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := jainShares(tc.oks, tc.calls); got != tc.want {
				t.Errorf("got %v; want %v", got, tc.want)
			}
		})
	}
}

func TestStatOf(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	tests := []struct {
		xs   []float64
		want Stat
	}{
		{[]float64{3, 1, 2}, Stat{2, 1, 3}},
		{[]float64{4, 1, 2, 3}, Stat{2.5, 1, 4}},
		{[]float64{1, inf, inf}, Stat{Num(inf), 1, Num(inf)}},
		{[]float64{nan, 5}, Stat{5, 5, 5}},
	}
	for _, tc := range tests {
		if got := StatOf(tc.xs); got != tc.want {
			t.Errorf("StatOf(%v): got %v; want %v", tc.xs, got, tc.want)
		}
	}
	if got := StatOf([]float64{nan}); !math.IsNaN(float64(got.Median)) {
		t.Errorf("StatOf([NaN]): got %v; want NaN", got)
	}
}

func TestNumJSON(t *testing.T) {
	for _, tc := range []struct {
		n    Num
		json string
	}{{1.5, "1.5"}, {Num(math.Inf(1)), `"inf"`}, {Num(math.NaN()), "null"}} {
		b, err := json.Marshal(tc.n)
		if err != nil || string(b) != tc.json {
			t.Errorf("Marshal(%v): got %s, %v; want %s", tc.n, b, err, tc.json)
		}
		var back Num
		if err := json.Unmarshal(b, &back); err != nil || !(back == tc.n || math.IsNaN(float64(back)) && math.IsNaN(float64(tc.n))) {
			t.Errorf("Unmarshal(%s): got %v, %v; want %v", b, back, err, tc.n)
		}
	}
}

// TestMatrixServer checks the server's token bucket, its Retry-After
// headers and its service time, in fake time.
func TestMatrixServer(t *testing.T) {
	ms := time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		// 8/s (a bucket of one) until 250 ms, then 80/s (a bucket of 8).
		w := Workload{Capacity: []Step{{0, 8}, {250 * ms, 80}}, RetryAfter: 1500 * ms, Deadline: time.Second, Duration: time.Second}
		srv := newMatrixServer(w, time.Now())
		get := func() *http.Response {
			req, _ := http.NewRequest(http.MethodGet, "http://sts.bench.test", nil)
			resp, err := srv.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			return resp
		}
		var codes []int
		at := func(d time.Duration, n int) {
			time.Sleep(time.Until(srv.start.Add(d)))
			for range n {
				codes = append(codes, get().StatusCode)
			}
		}
		at(0, 2)        // the one token, then none
		at(62500000, 1) // half a token
		at(125*ms, 1)   // one
		at(375*ms, 9)   // 1 at 250 ms, then 10 more by 375 ms, capped at 8
		want := []int{200, 429, 429, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429}
		if !reflect.DeepEqual(codes, want) {
			t.Errorf("got statuses %v; want %v", codes, want)
		}
		if got := srv.attempts[0] + srv.ok[1] + srv.ok[3]; got != 3+1+8 {
			t.Errorf("got %d counted in bins 0, 1 and 3; want 12", got)
		}
		resp := get()
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "2" || resp.Header.Get("X-Amz-Retry-After") != "1500" {
			t.Errorf("got %d, Retry-After %q, x-amz-retry-after %q; want 429, 2 (s, rounded up), 1500 (ms)",
				resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("X-Amz-Retry-After"))
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != stsThrottled {
			t.Errorf("got body %q; want STS's Throttling error", b)
		}

		// With a service time, the answer comes after it; a caller whose
		// deadline comes first gets its context's error, and the server
		// has done the work all the same.
		w = Workload{Capacity: steady(100), Service: 5 * ms, Deadline: time.Second, Duration: time.Second}
		srv = newMatrixServer(w, time.Now())
		start := time.Now()
		if resp := get(); resp.StatusCode != 200 || time.Since(start) != 5*ms {
			t.Errorf("got %d after %v; want 200 after 5ms", resp.StatusCode, time.Since(start))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*ms)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://sts.bench.test", nil)
		if _, err := srv.RoundTrip(req); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("caller with 3 ms left: got %v; want context.DeadlineExceeded", err)
		}
		if srv.ok[0] != 2 {
			t.Errorf("got %d 200s at the server; want 2", srv.ok[0])
		}

		// A quota of 4 a window of 400 ms (10/s): the fifth request of the
		// window is refused with the time left until the window resets;
		// the next window admits again.
		w = Workload{Capacity: steady(10), Quota: 400 * ms, Deadline: time.Second, Duration: time.Second}
		srv = newMatrixServer(w, time.Now())
		codes = nil
		for range 4 {
			codes = append(codes, get().StatusCode)
		}
		time.Sleep(150 * ms)
		resp = get()
		if resp.StatusCode != 429 || resp.Header.Get("X-Amz-Retry-After") != "250" || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("fifth in the window: got %d, x-amz-retry-after %q, Retry-After %q; want 429, 250 (ms left), 1 (s, rounded up)",
				resp.StatusCode, resp.Header.Get("X-Amz-Retry-After"), resp.Header.Get("Retry-After"))
		}
		time.Sleep(250 * ms)
		codes = append(codes, get().StatusCode)
		if want := []int{200, 200, 200, 200, 200}; !reflect.DeepEqual(codes, want) {
			t.Errorf("got statuses %v; want %v (four in the first window, one in the next)", codes, want)
		}
	})
}

// TestAWSSleepHook checks that the SDK's sleep, as this package installs
// it, moves the fake clock by at least a nanosecond: without that, the
// adaptive mode's waiters spin forever in a synctest bubble.
func TestAWSSleepHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, d := range []time.Duration{0, time.Nanosecond, 3 * time.Millisecond} {
			start := time.Now()
			if err := awsSleepWithContext(context.Background(), d); err != nil {
				t.Fatal(err)
			}
			if got, want := time.Since(start), max(d, time.Nanosecond); got != want {
				t.Errorf("sleep(%v): the clock moved %v; want %v", d, got, want)
			}
		}
	})
}

// TestAWSAdaptiveClient drives a real STS client in adaptive mode in fake
// time: a throttle turns its rate limiter on, and then its calls wait for
// their send tokens on the fake clock (they would spin without the hook)
// and succeed.
func TestAWSAdaptiveClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := Workload{Capacity: steady(10), Deadline: 5 * time.Second, Duration: 10 * time.Second}
		srv := newMatrixServer(w, time.Now())
		srv.tokens = 0 // the first attempt is throttled
		client := sts.New(sts.Options{Region: "us-east-1", BaseEndpoint: aws.String("http://sts.bench.test"),
			Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
			HTTPClient:  &http.Client{Transport: srv}, Retryer: retry.NewAdaptiveMode()})
		for i := range 5 {
			ctx, cancel := context.WithTimeout(context.Background(), w.Deadline)
			out, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			cancel()
			if err != nil || aws.ToString(out.Account) != "123456789012" {
				t.Fatalf("call %d: got %v, %v; want account 123456789012", i, out, err)
			}
		}
		if srv.throttled[0] == 0 {
			t.Errorf("got no 429; want the first attempt throttled")
		}
		if time.Since(srv.start) == 0 {
			t.Errorf("the fake clock did not move; want the limiter's waits on it")
		}
	})
}

// TestThrottleGoalsCheck checks the goal checker on hand-made summaries.
func TestThrottleGoalsCheck(t *testing.T) {
	sum := func(peer string, goodput, throttled, recovery, jain float64) PeerSummary {
		st := func(x float64) Stat { return Stat{Num(x), Num(x), Num(x)} }
		return PeerSummary{Peer: peer, Goodput: st(goodput), Throttled: st(throttled), Recovery: st(recovery), Jain: st(jain)}
	}
	nan := math.NaN()
	results := []WorkloadResult{
		{Workload: Workload{Name: "two-rising", Capacity: drop10x(100, 40*time.Second), Rates: []float64{1, 2}, Deadline: time.Second},
			Peers: []PeerSummary{sum(PeerNone, 1, 900, 0.9, 0.99), sum(PeerAWS, 0.95, 100, 3.5, 0.95), sum("mine", 0.981, 50, 3, 0.9)}},
		{Workload: Workload{Name: "one-steady", Capacity: steady(100), Rates: []float64{1}, Deadline: 2 * time.Second},
			Peers: []PeerSummary{sum(PeerNone, 0.9, 900, nan, 1), sum(PeerAWS, 0.95, 20, nan, 1), sum("mine", 0.93, 17, nan, 1)}},
		{Workload: Workload{Name: "not-mine", Capacity: steady(100), Rates: []float64{1}},
			Peers: []PeerSummary{sum(PeerAWS, 1, 1, nan, 1)}},
	}
	var got []string
	for _, c := range CheckThrottleGoals(results, "mine", IssueThrottleGoals()) {
		got = append(got, c.String())
	}
	want := []string{
		"mine on two-rising: goodput met (goodput 0.981; want >= 0.940 (aws-adaptive's 0.950 - 0.01))",
		"mine on two-rising: 429s met (50 429s; want <= 80.0 (0.8 of aws-adaptive's 100))",
		"mine on two-rising: recovery met (back to 90%: 3.0 s; want <= 4.0 s (aws-adaptive's 3.5 s + 0.5 s))",
		"mine on two-rising: fairness NOT met (Jain 0.900; want >= 0.940 (aws-adaptive's 0.950 - 0.01))",
		"mine on two-rising: wait met (wait p50 0 ms; want < 100 ms (0.1 of the deadline))",
		"mine on one-steady: goodput NOT met (goodput 0.930; want >= 0.940 (aws-adaptive's 0.950 - 0.01))",
		"mine on one-steady: 429s NOT met (17 429s; want <= 16.0 (0.8 of aws-adaptive's 20))",
		"mine on one-steady: wait met (wait p50 0 ms; want < 200 ms (0.1 of the deadline))",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}

	s := SummarizeGoals(results, "mine", CheckThrottleGoals(results, "mine", IssueThrottleGoals()))
	wantMet := map[string]int{GoalGoodput: 1, Goal429s: 1, GoalRecovery: 1, GoalWait: 2}
	wantOf := map[string]int{GoalGoodput: 2, Goal429s: 2, GoalRecovery: 1, GoalFairness: 1, GoalWait: 2}
	if !reflect.DeepEqual(s.Met, wantMet) || !reflect.DeepEqual(s.Of, wantOf) {
		t.Errorf("got met %v of %v; want %v of %v", s.Met, s.Of, wantMet, wantOf)
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"goodput over the best", float64(s.GoodputOverBest), (0.981/1 + 0.93/0.95) / 2},
		{"429s over aws-adaptive's", float64(s.ThrottledOverAWS), math.Sqrt(51.0 / 101 * 18 / 21)},
		{"recovery median", float64(s.RecoveryMedian), 3},
		{"Jain minus aws-adaptive's", float64(s.JainMinusAWS), 0.9 - 0.95},
	} {
		if math.Abs(c.got-c.want) > 1e-12 {
			t.Errorf("%s: got %v; want %v", c.name, c.got, c.want)
		}
	}
}

// TestThrottleMatrixSmoke runs the CI-sized matrix with every default peer
// and checks that the harness works: every peer made the same calls (the
// same arrivals), the counts add up, and the measures are in range.
func TestThrottleMatrixSmoke(t *testing.T) {
	peers := DefaultThrottlePeers()
	workloads := SmokeMatrix()
	results := RunThrottleMatrix(t, workloads, peers, 1, nil)
	t.Logf("\n%s", ThrottleMatrixTable(results))
	for i, r := range results {
		if r.Workload.Name != workloads[i].Name || len(r.Runs) != len(peers) || len(r.Peers) != len(peers) {
			t.Fatalf("result %d: got %s with %d runs, %d summaries; want %s with %d of each",
				i, r.Workload.Name, len(r.Runs), len(r.Peers), workloads[i].Name, len(peers))
		}
		calls := r.Runs[0].Calls
		for _, run := range r.Runs {
			name := r.Workload.Name + "/" + run.Peer
			if run.Calls != calls {
				t.Errorf("%s: got %d calls; %s made %d: want the same arrivals", name, run.Calls, r.Runs[0].Peer, calls)
			}
			if run.ServerOK+run.Throttled != run.Attempts || run.CallerOK > run.ServerOK || run.NotSent > run.Calls {
				t.Errorf("%s: got %d attempts, %d 2xx, %d 429s, %d seen by callers, %d of %d not sent: do not add up",
					name, run.Attempts, run.ServerOK, run.Throttled, run.CallerOK, run.NotSent, run.Calls)
			}
			if run.Goodput <= 0 || run.Goodput > 1.1 || run.Jain <= 0 || run.Jain > 1 || run.Series == nil {
				t.Errorf("%s: got goodput %v, Jain %v, series %v: out of range", name, run.Goodput, run.Jain, run.Series != nil)
			}
			if run.Peer == PeerNone && (run.NotSent != 0 || run.WaitP50Ms != 0) {
				t.Errorf("%s: got %d not sent, median wait %v ms; want 0 without a limiter", name, run.NotSent, run.WaitP50Ms)
			}
			if rises := len(r.Workload.rises()) > 0; rises == math.IsNaN(float64(run.RecoverySeconds)) {
				t.Errorf("%s: got recovery %v; want a value exactly where the capacity rises", name, run.RecoverySeconds)
			}
		}
	}
	checks := CheckThrottleGoals(results, PeerRetryHTTP, IssueThrottleGoals())
	if len(checks) != 3+3+1+2+3 { // goodput, 429s on all; recovery on one; fairness on two; wait on all
		t.Errorf("got %d goal checks; want 12", len(checks))
	}
}

func TestGroupInOrder(t *testing.T) {
	got := GroupInOrder([]string{"b1", "a1", "b2", "c1", "a2"}, func(s string) byte { return s[0] })
	want := [][]string{{"b1", "b2"}, {"a1", "a2"}, {"c1"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q; want %q", got, want)
	}
}

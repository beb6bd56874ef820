//go:build !race

package bench

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"testing"
)

// TestTargets measures the Transport against the targets it must meet,
// beside the bare base, with testing.Benchmark. Allocation counts are
// deterministic and asserted, from testing.AllocsPerRun; bytes are asserted
// within a tolerance, since the key buffer's sync.Pool is emptied by the
// garbage collector and B/op then depends on how many collections a run
// had; times are reported (medians of paired runs), since a shared machine
// makes any fixed time bound flaky. Excluded under -race, which changes
// allocations.
func TestTargets(t *testing.T) {
	if testing.Short() {
		t.Skip("measures for several seconds")
	}
	impl := Impls[1] // retryhttp
	if impl.Name != "retryhttp" {
		t.Fatalf("Impls[1] is %s; want retryhttp", impl.Name)
	}
	bench := func(rt http.RoundTripper, method string, size int) testing.BenchmarkResult {
		r := newReq(method, "http://bench.test/", size)
		return testing.Benchmark(func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				do(b, rt, r.next())
			}
		})
	}
	// extra runs base and impl alternately five times; it returns the median
	// extra ns and the extra bytes and allocations per request.
	extra := func(mk func(zero bool) (http.RoundTripper, http.RoundTripper), method string, size int) (ns float64, bytes, allocs int64) {
		var diffs []float64
		for range 5 {
			base, rt := mk(false)
			b := bench(base, method, size)
			r := bench(rt, method, size)
			diffs = append(diffs, float64(r.NsPerOp()-b.NsPerOp()))
			bytes, allocs = r.AllocedBytesPerOp()-b.AllocedBytesPerOp(), r.AllocsPerOp()-b.AllocsPerOp()
		}
		sort.Float64s(diffs)
		return diffs[len(diffs)/2], bytes, allocs
	}
	success := func(bool) (http.RoundTripper, http.RoundTripper) {
		s := newStub(200)
		return s, impl.New(s, false)
	}
	// The base row of the retry workload makes both calls itself.
	retry := func(bool) (http.RoundTripper, http.RoundTripper) {
		s := newStub(503, 200)
		return twoCalls{newStub(503, 200)}, impl.New(s, true)
	}

	rows := []string{"| target | measured | met |", "|---|---|---|"}
	row := func(target, measured string, ok bool) {
		mark := "yes"
		if !ok {
			mark = "**no**"
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s |", target, measured, mark))
	}

	// allocs is the exact allocations per request of rt beyond base's.
	allocs := func(mk func(zero bool) (http.RoundTripper, http.RoundTripper), method string, size int) float64 {
		base, rt := mk(false)
		count := func(rt http.RoundTripper) float64 {
			r := newReq(method, "http://bench.test/", size)
			return testing.AllocsPerRun(500, func() {
				resp, err := rt.RoundTrip(r.next())
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			})
		}
		return count(rt) - count(base)
	}

	ns, by, _ := extra(success, "GET", 0)
	al := allocs(success, "GET", 0)
	row("GET success, in-memory: at most +35 ns, 0 extra allocations", fmt.Sprintf("%+.0f ns, %+d B, %+.0f allocs", ns, by, al), ns <= 35 && al == 0)
	if al != 0 {
		t.Errorf("GET success: got %+.0f allocs over the base; want 0", al)
	}

	ns4, by4, _ := extra(success, "POST", 4<<10)
	_, by64, _ := extra(success, "POST", 64<<10)
	al4, al64 := allocs(success, "POST", 4<<10), allocs(success, "POST", 64<<10)
	// The pool's refills, spread over a run: a few bytes a request at most.
	const tolerance = 32
	row("POST success: no bytes that grow with the body", fmt.Sprintf("%+d B at 4 KiB, %+d B at 64 KiB", by4, by64), abs(by4-by64) <= tolerance)
	row("POST success: the key within +400 ns and 3 allocations", fmt.Sprintf("%+.0f ns, %+.0f allocs", ns4, al4), ns4 <= 400 && al4 <= 3)
	if abs(by4-by64) > tolerance || al4 != al64 {
		t.Errorf("POST success: got %+d B / %+.0f allocs at 4 KiB and %+d B / %+.0f allocs at 64 KiB; want the same allocations and bytes within %d B (no buffering)", by4, al4, by64, al64, tolerance)
	}
	if al4 > 3 {
		t.Errorf("POST success: got %+.0f allocs over the base; want at most 3 (the request copy with the key, the header map and its group)", al4)
	}

	nsr, _, _ := extra(retry, "GET", 0)
	alr := allocs(retry, "GET", 0)
	// The drain of the discarded body is bounded in time by a timer (about
	// 200 ns and 2 allocations): the price of never letting a stalled body
	// hold the request.
	row("retry path: at most +600 ns and 3 allocations per retry", fmt.Sprintf("%+.0f ns, %+.0f allocs", nsr, alr), nsr <= 600 && alr <= 3)
	if alr > 3 {
		t.Errorf("retry path: got %+.0f allocs over two plain calls; want at most 3", alr)
	}
	report(t, rows...)
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

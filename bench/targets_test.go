//go:build !race

package bench

import (
	"fmt"
	"net/http"
	"sort"
	"testing"
)

// TestTargets measures the Transport against the targets it must meet,
// beside the bare base, with testing.Benchmark. Allocations and bytes are
// deterministic and asserted; times are reported (medians of paired runs),
// since a shared machine makes any fixed time bound flaky. Excluded under
// -race, which changes both.
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

	ns, by, al := extra(success, "GET", 0)
	row("GET success, in-memory: at most +50 ns, 0 extra allocations", fmt.Sprintf("%+.0f ns, %+d B, %+d allocs", ns, by, al), ns <= 50 && al == 0)
	if al != 0 || by != 0 {
		t.Errorf("GET success: got %+d B and %+d allocs over the base; want 0 and 0", by, al)
	}

	ns4, by4, al4 := extra(success, "POST", 4<<10)
	_, by64, al64 := extra(success, "POST", 64<<10)
	row("POST success: no bytes that grow with the body", fmt.Sprintf("%+d B at 4 KiB, %+d B at 64 KiB", by4, by64), by4 == by64)
	row("POST success: the key within +400 ns and 3 allocations", fmt.Sprintf("%+.0f ns, %+d allocs", ns4, al4), ns4 <= 400 && al4 <= 3)
	if by4 != by64 || al4 != al64 {
		t.Errorf("POST success: got %+d B / %+d allocs at 4 KiB and %+d B / %+d allocs at 64 KiB; want the same (no buffering)", by4, al4, by64, al64)
	}
	if al4 > 3 {
		t.Errorf("POST success: got %+d allocs over the base; want at most 3 (the request copy with the key, the header map and its group)", al4)
	}

	nsr, _, alr := extra(retry, "GET", 0)
	// The drain of the discarded body is bounded in time by a timer (about
	// 200 ns and 2 allocations): the price of never letting a stalled body
	// hold the request.
	row("retry path: at most +600 ns and 3 allocations per retry", fmt.Sprintf("%+.0f ns, %+d allocs", nsr, alr), nsr <= 600 && alr <= 3)
	if alr > 3 {
		t.Errorf("retry path: got %+d allocs over two plain calls; want at most 3", alr)
	}
	report(t, rows...)
}

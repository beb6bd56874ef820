package bench

import (
	"encoding/json"
	"math"
	"os"
	"testing"
)

// TestThrottlingGoals runs docs/throttling.md's comparison in fake time
// (60 s of it) for this library's limiter and asserts its goals against
// the other implementations' runs saved with cmd/throttle -fake
// (lab/runs/throttling-fake.json; the AWS SDK's run alone takes about 15 s, and
// several times that under -race): goodput within 5% of the capacity and no
// lower than any peer's, fewer 429s than the AWS adaptive mode and
// failsafe-go's throttler, converging from the start no slower than either.
// The matrix (TestThrottleMatrixGoals) is where the goals are
// asserted; this is the one workload the library was first measured on.
func TestThrottlingGoals(t *testing.T) {
	var saved struct{ Runs []ThrottleRun }
	b, err := os.ReadFile("../runs/throttling-fake.json")
	if err == nil {
		err = json.Unmarshal(b, &saved)
	}
	if err != nil {
		t.Fatal(err)
	}
	runs := ThrottleInMemory(t, DefaultThrottleConfig, PeerRetryHTTP)
	for _, r := range saved.Runs {
		if r.Name != PeerRetryHTTP {
			runs = append(runs, r)
		}
	}
	t.Logf("\n%s", ThrottleTable(runs))
	by := map[string]ThrottleRun{}
	for _, r := range runs {
		by[r.Name] = r
	}
	ours, aws, failsafe := by[PeerRetryHTTP], by[PeerAWS], by[PeerFailsafe]
	if aws.Name == "" || failsafe.Name == "" {
		t.Fatalf("the saved runs lack %s or %s", PeerAWS, PeerFailsafe)
	}
	if ours.GoodputRatio < 0.95 {
		t.Errorf("got goodput %.3f of capacity; want at least 0.95", ours.GoodputRatio)
	}
	for _, peer := range []ThrottleRun{aws, failsafe} {
		if ours.GoodputRatio < peer.GoodputRatio-0.01 {
			t.Errorf("got goodput %.3f; %s %.3f: want no lower", ours.GoodputRatio, peer.Name, peer.GoodputRatio)
		}
		if slower(ours.ConvergeSeconds, peer.ConvergeSeconds) {
			t.Errorf("got convergence %s; %s %s: want no slower", secs(ours.ConvergeSeconds), peer.Name, secs(peer.ConvergeSeconds))
		}
		if ours.Throttled >= peer.Throttled {
			t.Errorf("got %d 429s; %s %d: want fewer", ours.Throttled, peer.Name, peer.Throttled)
		}
	}
}

// slower reports whether a converged later than b, or never while b did.
func slower(a, b *float64) bool {
	switch {
	case a == nil:
		return b != nil
	case b == nil:
		return false
	}
	return *a > *b
}

func TestConverge(t *testing.T) {
	// Bins of 100 ms; capacity 100/s, so 10 a bin is exactly on it.
	bins := func(per ...int) []int { // per[i]: attempts in each bin of second i
		var b []int
		for _, n := range per {
			for range 10 {
				b = append(b, n)
			}
		}
		return b
	}
	tests := []struct {
		name     string
		attempts []int
		want     float64
	}{
		{"on capacity from the start: after the first full second", bins(10, 10, 10, 10, 10), 1},
		{"within 10% (105/s)", bins(10, 11, 10, 11, 10), 1},
		{"too high for 2 s, then on it", bins(50, 50, 10, 10, 10, 10, 10), 3},
		{"on it, but not for 3 s", bins(10, 10, 50, 10, 10), -1},
		{"never", bins(50, 50, 50, 50, 50), -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := converge(tc.attempts, 0, len(tc.attempts), 100); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("got %v s; want %v", got, tc.want)
			}
		})
	}
}

func TestJain(t *testing.T) {
	tests := []struct {
		xs   []int
		want float64
	}{
		{[]int{5, 5, 5, 5}, 1},
		{[]int{10, 0, 0, 0}, 0.25},
		{[]int{1, 2}, 0.9}, // 9 / (2 x 5)
		{[]int{0, 0}, 0},
	}
	for _, tc := range tests {
		if got := jain(tc.xs); got != tc.want {
			t.Errorf("jain(%v): got %v; want %v", tc.xs, got, tc.want)
		}
	}
}

package retryhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// The limiter's rules, each in fake time with exact figures: a driver takes
// permits and answers them as a server would, and the limiter's state is
// read under its lock. Figures that depend on the demand meter are computed
// from its definition (meterRate) rather than read back.

// seventh is the interval of a rate of 7 permits per second, in whole
// nanoseconds as the limiter spaces them: one 429 answering a limiter's only
// send (1 send in its 100 ms minimum measure, 10/s) starts it at 0.7 x 10.
var seventh = time.Duration(second / 7)

var second = float64(time.Second)

func near(got, want float64) bool { return math.Abs(got-want) < 1e-9*max(1, math.Abs(want)) }

// meterRate is what a meter reads at t (seconds): seeded with seedRate over
// seedSpan seconds ending at 0, then one event at each of evs. It is the
// meter's definition written out: exponentially weighted over one second,
// divided by the weight of the meter's age (100 ms at least).
func meterRate(seedRate, seedSpan float64, evs []float64, t float64) float64 {
	w := seedRate * -math.Expm1(-seedSpan) * math.Exp(-t)
	for _, e := range evs {
		if e <= t {
			w += math.Exp(-(t - e))
		}
	}
	return w / -math.Expm1(-max(t+seedSpan, 0.1))
}

// driver takes permits from a limiter and answers them, in a bubble.
type driver struct {
	t *testing.T
	l *RateLimiter
}

// take waits for a permit for an attempt due now.
func (d driver) take() permit {
	d.t.Helper()
	var p permit
	if err := d.l.acquire(context.Background(), &p); err != nil {
		d.t.Fatalf("acquire: %v", err)
	}
	return p
}

// answer reports status (429 a throttle, anything else a success) as the
// answer to p, with headers given as name, value pairs.
func (d driver) answer(p permit, status int, header ...string) {
	resp := &http.Response{StatusCode: status, Header: http.Header{}}
	for i := 0; i+1 < len(header); i += 2 {
		resp.Header.Set(header[i], header[i+1])
	}
	class := Success
	if status == http.StatusTooManyRequests {
		class = Throttling
	}
	p.answered(&Policy{}, resp, nil, class)
}

// sent is a permit of round epoch whose attempt was sent just now, as a
// limiting limiter gives.
func sent(l *RateLimiter, epoch uint64) permit {
	return permit{l: l, epoch: epoch, slot: time.Millisecond, at: time.Now()}
}

// state is a copy of the fields the rules set.
type state struct {
	share, level, step, high, top float64
	period                        time.Duration
	change, cutAt, next           time.Time
	epoch                         uint64
	ramps                         int
}

func peek(l *RateLimiter) state {
	l.mu.Lock()
	defer l.mu.Unlock()
	return state{l.share, l.level, l.step, l.high, l.top, l.period, l.change, l.cutAt, l.next, l.epoch, l.ramps}
}

// startAt21 sends 21 attempts at 21 a second from the bubble's start, the
// last one throttled: the limiter starts limiting 1 s in, at 0.7 of the 21/s
// measured, 14.7/s.
func startAt21(t *testing.T, l *RateLimiter) driver {
	d := driver{t, l}
	for range 20 {
		d.answer(d.take(), 200)
		time.Sleep(time.Second / 21)
	}
	time.Sleep(time.Second - 20*(time.Second/21))
	d.answer(d.take(), 429)
	return d
}

func TestLimiterStart(t *testing.T) {
	for _, tc := range []struct {
		beta, want float64
	}{{0, 0.7 * 21}, {0.5, 0.5 * 21}, {math.NaN(), 0.7 * 21}} {
		t.Run(fmt.Sprintf("Beta %v", tc.beta), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := &RateLimiter{Beta: tc.beta}
				d := startAt21(t, l)
				if got := l.Rate(); !near(got, tc.want) {
					t.Errorf("got %v permits/s after the first throttle; want %v (Beta of the 21/s measured)", got, tc.want)
				}
				if st := l.Stats(); st.Cuts != 1 {
					t.Errorf("got %d cuts; want 1", st.Cuts)
				}
				start := time.Now()
				d.take()
				if got, want := time.Since(start), interval(tc.want); got != want {
					t.Errorf("next permit after %v; want one interval of the new rate, %v", got, want)
				}
			})
		})
	}
}

func TestLimiterStartRounds(t *testing.T) {
	t.Run("a throttle of the next round cuts by the share refused", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			d := startAt21(t, l)
			d.answer(d.take(), 429) // 1 throttle in 1 answer, and 2 assumed: 1/3 refused
			if got, want := peek(l).share, 0.7*(1-1.0/3); !near(got, want) {
				t.Errorf("got a share of %v of the demand; want %v (0.7, then 2/3 of it)", got, want)
			}
		})
	})
	t.Run("never by more than half", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			d := driver{t, l}
			var old []permit // sent before the limiter started: they answer late
			for range 3 {
				old = append(old, d.take())
			}
			d = startAt21(t, l)
			for _, p := range old {
				d.answer(p, 429) // a round already cut for: counted, no cut
			}
			if st := l.Stats(); st.Cuts != 1 {
				t.Fatalf("got %d cuts; want 1", st.Cuts)
			}
			d.answer(d.take(), 429) // 4 throttles in 4 answers: 4/6 refused, the cut kept at half
			if got, want := peek(l).share, 0.7*0.5; !near(got, want) {
				t.Errorf("got a share of %v; want %v", got, want)
			}
		})
	})
	t.Run("a rise of the demand measured does not undo a cut", func(t *testing.T) {
		// A young demand meter reads low at first and rises as it sees
		// more: the rate at a cut is the most the start may send after it.
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			startAt21(t, l)
			for range 60 {
				time.Sleep(time.Second / 60)
				l.mu.Lock()
				l.demand.add(time.Now())
				l.mu.Unlock()
			}
			l.mu.Lock()
			share, dem := l.share, l.demand.rate(time.Now())
			l.mu.Unlock()
			if share*dem < 1.5*0.7*21 {
				t.Fatalf("the share of the demand measured is %v/s: want well above the %v/s of the cut, for the test to mean anything", share*dem, 0.7*21)
			}
			if got, want := l.Rate(), 0.7*21; !near(got, want) {
				t.Errorf("got %v permits/s after the demand measured rose; want %v, the rate of the cut", got, want)
			}
			d := driver{t, l}
			d.answer(d.take(), 429) // 1/3 refused: the next cut is from the rate sent
			if got, want := l.Rate(), 0.7*21*(1-1.0/3); !near(got, want) {
				t.Errorf("got %v permits/s after the next cut; want %v", got, want)
			}
		})
	})
	t.Run("a short round measures the rate accepted", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			d := startAt21(t, l)
			cut := time.Now()
			var ps []permit
			for range 18 {
				ps = append(ps, d.take())
			}
			for _, p := range ps[:5] {
				d.answer(p, 200)
			}
			l.mu.Lock()
			rate := l.share * l.demand.rate(time.Now())
			l.mu.Unlock()
			d.answer(ps[5], 429)
			// 5 accepted over the round: far less than the rate; the cut
			// would keep 0.7 by the share refused (1 in 6), half by this.
			accepted := 5 / time.Since(cut).Seconds()
			if time.Since(cut) >= exactRound {
				t.Fatalf("the round took %v; want less than 2 s", time.Since(cut))
			}
			if accepted/rate >= 0.5 {
				t.Fatalf("accepted %v/s at a rate of %v: want less than half, for the test to mean anything", accepted, rate)
			}
			if got, want := peek(l).share, 0.7*0.5; !near(got, want) {
				t.Errorf("got a share of %v; want %v", got, want)
			}
		})
	})
}

func TestLimiterSettles(t *testing.T) {
	// Two seconds after its last cut, a starting limiter holds the share
	// of the demand it reached; half a second later it steps up by 2% of
	// the demand, and keeps the step when no throttle came within 1.5 s.
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		startAt21(t, l)
		time.Sleep(2 * time.Second)
		now := time.Now()
		dem := meterRate(21, 1, nil, 2)
		l.mu.Lock()
		l.advance(now)
		l.mu.Unlock()
		s := peek(l)
		if s.share != 0 || !near(s.level, 0.7*dem) || s.period != firstProbe || !near(s.step, 0.02*dem) {
			t.Fatalf("got share %v, level %v, period %v, step %v; want 0, %v, 500ms, %v", s.share, s.level, s.period, s.step, 0.7*dem, 0.02*dem)
		}
		l.mu.Lock()
		before, after := l.scheduled(now.Add(firstProbe-1)), l.scheduled(now.Add(firstProbe))
		l.mu.Unlock()
		if before != s.level || after != s.level+s.step {
			t.Errorf("got %v just before the probe and %v at it; want %v and %v", before, after, s.level, s.level+s.step)
		}
		// Asked for at 20/s meanwhile: the step is within twice the
		// demand, so it was tried.
		askAt(l, 20, firstProbe+blame)
		l.mu.Lock()
		l.advance(time.Now())
		l.mu.Unlock()
		if k := peek(l); !near(k.level, s.level+s.step) || k.period != DefaultLimiterRecovery/10 || !k.change.Equal(now.Add(firstProbe)) {
			t.Errorf("got level %v, period %v, changed at %v; want %v, %v, %v", k.level, k.period, k.change.Sub(now), s.level+s.step, DefaultLimiterRecovery/10, firstProbe)
		}
	})
}

// askAt asks l for permits at rate a second for d, as callers whose
// attempts the limiter counts in its demand.
func askAt(l *RateLimiter, rate float64, d time.Duration) {
	iv := time.Duration(float64(time.Second) / rate)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(iv) {
		l.mu.Lock()
		l.demand.add(time.Now())
		l.mu.Unlock()
	}
}

// holdAt sets l up as a limiter that has held level since 10 s before now,
// its next probe period away, with a steady demand and accepted rate of
// level a second, after a round of 100 answers.
func holdAt(l *RateLimiter, level float64, period time.Duration) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.limiting.Store(true)
	l.epoch = 1
	l.level, l.period = level, period
	l.change, l.cutAt, l.next = now.Add(-10*time.Second), now.Add(-10*time.Second), now
	l.demand.seed(now, level, time.Hour)
	l.accepted.seed(now, level, time.Hour)
	l.answers = 100
	l.step = l.probeStep(now)
}

func TestLimiterProbe(t *testing.T) {
	t.Run("a step that draws a throttle is taken back with 3% of the level, and the next waits twice as long", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			holdAt(l, 10, 9*time.Second) // the step was taken 1 s ago
			d := driver{t, l}
			l.mu.Lock()
			stepped := l.scheduled(time.Now())
			l.mu.Unlock()
			d.answer(permit{l: l, epoch: 1}, 429)
			if s := peek(l); stepped != 10.2 || s.level != 9.7 || s.top != 10 || s.period != 18*time.Second || s.epoch != 2 {
				t.Errorf("got rate %v before, then level %v, top %v, period %v, %d cuts; want 10.2 (2%% of the demand up), 9.7, 10, 18s, 2",
					stepped, s.level, s.top, s.period, s.epoch)
			}
		})
	})
	t.Run("the wait between probes is at most Recovery", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{Recovery: 5 * time.Second}
			holdAt(l, 10, 9*time.Second)
			driver{t, l}.answer(permit{l: l, epoch: 1}, 429)
			if s := peek(l); s.period != 5*time.Second {
				t.Errorf("got period %v; want Recovery, 5s", s.period)
			}
		})
	})
	t.Run("a step that draws none within 1.5 s is kept, and the next comes twice as soon", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			holdAt(l, 10, 8*time.Second) // the step was taken 2 s ago
			now := time.Now()
			l.mu.Lock()
			l.advance(now)
			l.mu.Unlock()
			if s := peek(l); s.level != 10.2 || s.period != 4*time.Second || !s.change.Equal(now.Add(-2*time.Second)) {
				t.Errorf("got level %v, period %v, changed %v ago; want 10.2, 4s, 2s", s.level, s.period, now.Sub(s.change))
			}
		})
	})
}

func TestLimiterCuts(t *testing.T) {
	t.Run("a throttle while holding cuts a fifth below what was accepted", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			holdAt(l, 10, time.Hour)
			driver{t, l}.answer(permit{l: l, epoch: 1}, 429) // 1 refused in 101 answers, 2 assumed
			want := 10 * (1 - 1.0/103) * 0.8
			if s := peek(l); !near(s.level, want) || s.epoch != 2 {
				t.Errorf("got level %v, %d cuts; want %v, 2", s.level, s.epoch, want)
			}
		})
	})
	t.Run("another within 2 s sets the rate to what was accepted, 3% below", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			holdAt(l, 10, time.Hour)
			d := driver{t, l}
			d.answer(permit{l: l, epoch: 1}, 429)
			r := 10 * (1 - 1.0/103) * 0.8
			time.Sleep(100 * time.Millisecond)
			d.answer(sent(l, 0), 200)             // a late success of the round before
			d.answer(permit{l: l, epoch: 2}, 429) // 1 refused in 2 answers, 2 assumed: 1/4
			acc := meterRate(10, 3600, []float64{0.1}, 0.1)
			want := min(max(min(r*0.75, acc)*0.97, r/2), r*0.97)
			if s := peek(l); !near(s.level, want) || s.epoch != 3 {
				t.Errorf("got level %v, %d cuts; want %v, 3", s.level, s.epoch, want)
			}
		})
	})
	t.Run("a run of throttles halves the rate for each", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			holdAt(l, 100, time.Hour)
			d := driver{t, l}
			d.answer(permit{l: l, epoch: 0}, 429)
			d.answer(permit{l: l, epoch: 0}, 429)
			if s := peek(l); s.epoch != 1 {
				t.Fatalf("got %d cuts after throttles of a round already cut for; want 1", s.epoch)
			}
			d.answer(permit{l: l, epoch: 1}, 429) // the third in a row
			if s := peek(l); !near(s.level, 100*0.25*0.8) {
				t.Errorf("got level %v; want 100 x 1/4 x 0.8 = 20", s.level)
			}
		})
	})
}

// cutDeep holds l at level for 10 s, then cuts it with a run of throttles,
// nothing accepted between them (level x 0.8 / 2^(throttles-1)), and checks
// that it is at want with level remembered.
func cutDeep(t *testing.T, l *RateLimiter, level float64, throttles int, want float64) driver {
	t.Helper()
	holdAt(l, level, time.Hour)
	d := driver{t, l}
	for range throttles - 1 {
		d.answer(permit{l: l, epoch: 0}, 429)
	}
	d.answer(permit{l: l, epoch: 1}, 429)
	if s := peek(l); !near(s.level, want) || s.high != level {
		t.Fatalf("got level %v, remembered %v; want %v, %v", s.level, s.high, want, level)
	}
	return d
}

func TestLimiterRampsBack(t *testing.T) {
	// A rate held for 10 s (100/s), then cut deep by a run of 5 throttles
	// (100 x 1/16 x 0.8 = 5/s): the limiter remembers 100 and, 2 s after
	// the cut, ramps back to it, e-fold every 300 ms.
	deep := func(t *testing.T, l *RateLimiter) driver { return cutDeep(t, l, 100, 5, 5) }
	reach := rampWait + time.Duration(0.3*math.Log(20)*second) // when a ramp from 5 reaches 100
	t.Run("a ramp that reaches the rate remembered keeps it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			deep(t, l)
			cut := time.Now()
			l.mu.Lock()
			got := []float64{l.scheduled(cut.Add(rampWait - 1)), l.scheduled(cut.Add(rampWait + 300*time.Millisecond)), l.scheduled(cut.Add(reach + time.Millisecond))}
			l.mu.Unlock()
			if want := []float64{5, 5 * math.E, 100}; !near(got[0], want[0]) || !near(got[1], want[1]) || !near(got[2], want[2]) {
				t.Errorf("got %v at 2s, 2.3s, 2.9s; want %v", got, want)
			}
			askAt(l, 100, reach+blame)
			l.mu.Lock()
			l.advance(time.Now())
			l.mu.Unlock()
			if s := peek(l); s.level != 100 || s.period != DefaultLimiterRecovery/10 {
				t.Errorf("got level %v, period %v; want 100, 2s", s.level, s.period)
			}
		})
	})
	t.Run("a ramp nothing was sent to test is not kept", func(t *testing.T) {
		// The demand fades from 100/s to e^-3.9 of it: it never reaches
		// the rate remembered, and the ramp does not either. The next
		// ramp starts rampWait after the last one reached its end.
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			deep(t, l)
			cut := time.Now()
			time.Sleep(reach + blame)
			l.mu.Lock()
			l.advance(time.Now())
			next := l.scheduled(cut.Add(2*reach + time.Millisecond))
			l.mu.Unlock()
			if s := peek(l); s.level != 5 || s.ramps != 0 || !s.change.Equal(cut.Add(reach)) || next != 100 {
				t.Errorf("got level %v, %d failed ramps, changed at %v, the next ramp at %v by %v; want 5, 0, %v, 100",
					s.level, s.ramps, s.change.Sub(cut), 2*reach+time.Millisecond, next, reach)
			}
		})
	})
	t.Run("a ramp shortens the wait for the next permit", func(t *testing.T) {
		// A permit taken 50 ms before the ramp starts (rampWait after the
		// cut), at 5/s, puts the next one 200 ms later, at rampWait+150ms.
		// The next permit comes one interval of the ramp's rate after the
		// last: 1/(5e^(1/6)) s at rampWait+50ms (not yet: +119 ms),
		// 1/(5e^(1/3)) s at rampWait+100ms (+93 ms: now), and not at the
		// interval it was scheduled with.
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			deep(t, l)
			cut := time.Now()
			time.Sleep(rampWait - 50*time.Millisecond)
			if _, ok := l.tryAcquire(time.Now()); !ok {
				t.Fatal("no permit 50 ms before the ramp, at 5/s")
			}
			for _, tc := range []struct {
				at   time.Duration
				want bool
			}{{rampWait + 50*time.Millisecond, false}, {rampWait + 100*time.Millisecond, true}} {
				time.Sleep(cut.Add(tc.at).Sub(time.Now()))
				if _, got := l.tryAcquire(time.Now()); got != tc.want {
					t.Errorf("got a permit %v at %v after the cut; want %v", got, tc.at, tc.want)
				}
			}
		})
	})
	t.Run("a ramp that draws a throttle is taken back; a few are tried per halving", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			d := deep(t, l)
			tries := int(math.Ceil(3 * math.Log2(20))) // 13
			for i := range tries {
				time.Sleep(rampWait + 100*time.Millisecond)
				l.mu.Lock()
				r := l.scheduled(time.Now())
				l.mu.Unlock()
				d.answer(permit{l: l, epoch: peek(l).epoch}, 429)
				if s := peek(l); s.level != 5 || s.ramps != i+1 {
					t.Fatalf("ramp %d: got level %v, %d failed; want 5, %d", i+1, s.level, s.ramps, i+1)
				}
				// The ramp's rate is the rate the last throttle came at:
				// probe steps past it double.
				l.mu.Lock()
				top := l.top
				l.mu.Unlock()
				if top != r {
					t.Fatalf("ramp %d: got top %v; want the ramp's rate, %v", i+1, top, r)
				}
			}
			l.mu.Lock()
			far := l.far()
			l.mu.Unlock()
			if far {
				t.Errorf("still ramping after %d failed ramps; want no more", tries)
			}
		})
	})
}

func TestLimiterRemembersARateSentUnlimited(t *testing.T) {
	// A client that sent 10 a second, never throttled, for 6 s remembers
	// the 61 sends in 6 s at its first throttle, as a rate held, to ramp
	// back to after a deep cut; one that had sent for 4 s does not (at a
	// start, the rate before the first throttle is not one the server
	// takes).
	for _, tc := range []struct {
		secs int
		want float64
	}{{6, 61.0 / 6}, {4, 0}} {
		t.Run(fmt.Sprintf("%ds", tc.secs), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := &RateLimiter{}
				d := driver{t, l}
				for range 10 * tc.secs {
					d.answer(d.take(), 200)
					time.Sleep(100 * time.Millisecond)
				}
				d.answer(d.take(), 429)
				if got := peek(l).high; !near(got, tc.want) {
					t.Errorf("remembered %v; want %v", got, tc.want)
				}
			})
		})
	}
}

func TestLimiterRefusesWithoutRoom(t *testing.T) {
	// Attempts take 50 ms: the limiter's estimate is 50 ms + 4 x 25 ms. A
	// request whose permit is due at once but whose deadline is 140 ms away
	// is refused at once: the attempt would end after it. With 160 ms left
	// it is sent.
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		holdAt(l, 10, time.Hour)
		d := driver{t, l}
		p := d.take()
		time.Sleep(50 * time.Millisecond)
		d.answer(p, 200)
		time.Sleep(time.Second) // a permit is due
		for _, tc := range []struct {
			left time.Duration
			ok   bool
		}{{140 * time.Millisecond, false}, {160 * time.Millisecond, true}} {
			ctx, cancel := context.WithTimeout(context.Background(), tc.left)
			start := time.Now()
			var q permit
			err := l.acquire(ctx, &q)
			cancel()
			if (err == nil) != tc.ok || time.Since(start) != 0 {
				t.Errorf("%v left: got %v after %v; want a permit: %v, at once", tc.left, err, time.Since(start), tc.ok)
			}
			q.cancel()
		}
	})
}

func TestLimiterQueueBound(t *testing.T) {
	// At 10 permits a second, an attempt waits for a permit at most 20
	// permits' time, 2 s; one whose permit is further fails at once.
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		holdAt(l, 10, time.Hour)
		for _, tc := range []struct {
			ahead time.Duration
			ok    bool
		}{{2 * time.Second, true}, {2*time.Second + time.Millisecond, false}} {
			l.mu.Lock()
			l.next = time.Now().Add(tc.ahead)
			l.mu.Unlock()
			_, ok := l.reserve(time.Now(), time.Now(), time.Time{}, false)
			if ok != tc.ok {
				t.Errorf("permit %v ahead: got %v; want %v", tc.ahead, ok, tc.ok)
			}
		}
	})
}

func TestLimiterHonoursRetryAfter(t *testing.T) {
	// A 429 asking for a delay pauses the limiter: no hedge gets a permit,
	// a request whose deadline comes first fails at once, and the next
	// permit is at the pause's end (asked for 100 ms before it).
	for _, tc := range []struct {
		name   string
		header []string
		pause  time.Duration
	}{
		{"Retry-After", []string{"Retry-After", "3"}, 3 * time.Second},
		{"x-amz-retry-after", []string{"X-Amz-Retry-After", "1500"}, 1500 * time.Millisecond},
		{"beyond MaxServerDelay", []string{"Retry-After", "3600"}, defaultMaxDelay},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := &RateLimiter{}
				holdAt(l, 100, time.Hour)
				d := driver{t, l}
				start := time.Now()
				d.answer(permit{l: l, epoch: 0}, 429, tc.header...) // a round already cut for: no cut, but a pause
				if s := peek(l); s.epoch != 1 {
					t.Fatalf("got %d cuts; want 1", s.epoch)
				}
				if _, ok := l.tryAcquire(time.Now()); ok {
					t.Error("a hedge got a permit during the pause; want none")
				}
				ctx, cancel := context.WithTimeout(context.Background(), tc.pause)
				var p permit
				if err := l.acquire(ctx, &p); !errors.Is(err, ErrRateLimited) || time.Since(start) != 0 {
					t.Errorf("a request with a deadline at the pause's end: got %v after %v; want ErrRateLimited at once", err, time.Since(start))
				}
				cancel()
				time.Sleep(tc.pause - 100*time.Millisecond)
				d.take()
				if got := time.Since(start); got != tc.pause {
					t.Errorf("next permit after %v; want %v, the pause", got, tc.pause)
				}
			})
		})
	}
}

func TestLimiterPauseVoidsWaitingPermits(t *testing.T) {
	// An attempt waits for the next permit when a 429 of a round already
	// cut for asks for 1 s: it wakes, finds its permit inside the pause,
	// gives its slot back and takes the permit at the pause's end. At 1/s
	// the pause (to 1.5 s) ends before the void slot would (2 s): the slot
	// given back is what lets the permit come at 1.5 s.
	for _, tc := range []struct {
		name        string
		rate        float64
		after, want time.Duration
	}{
		{"a pause past the slot", 10, 50 * time.Millisecond, 50*time.Millisecond + time.Second},
		{"a pause within the slot", 1, 500 * time.Millisecond, 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := &RateLimiter{}
				holdAt(l, tc.rate, time.Hour)
				d := driver{t, l}
				d.take() // at once; the next permit is due one interval later
				start := time.Now()
				var wg sync.WaitGroup
				var took time.Duration
				wg.Go(func() {
					d.take()
					took = time.Since(start)
				})
				synctest.Wait()
				time.Sleep(tc.after)
				d.answer(permit{l: l, epoch: 0}, 429, "Retry-After", "1") // no cut: a pause
				wg.Wait()
				if took != tc.want {
					t.Errorf("waiter sent after %v; want %v, at the pause's end", took, tc.want)
				}
			})
		})
	}
}

func TestLimiterOneCutPerRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		holdAt(l, 10, time.Hour)
		d := driver{t, l}
		d.answer(permit{l: l, epoch: 1}, 429)
		level := peek(l).level
		for range 5 { // throttles of permits given before the cut
			d.answer(permit{l: l, epoch: 1}, 429)
		}
		if s := peek(l); s.epoch != 2 || s.level != level {
			t.Errorf("got %d cuts, level %v; want 2, %v: the cut already answered them", s.epoch, s.level, level)
		}
	})
}

// throttledOnce is a base that answers its first request with 429 and every
// other one with 200 after lag.
func throttledOnce(lag time.Duration) (*rht.Transport, []rht.Step) {
	steps := []rht.Step{rht.Status(429), rht.Status(200).WithDelay(lag).Times(50)}
	return rht.NewTransport(steps...), steps
}

func TestTransportWaitsForPermits(t *testing.T) {
	// One 429 starts the limiter at 7/s (0.7 x 1 send in its 100 ms
	// minimum); each later request takes its permit one interval of the
	// start's share (0.7) of the demand after the one before.
	synctest.Test(t, func(t *testing.T) {
		base, _ := throttledOnce(0)
		lim := &RateLimiter{}
		var hooks []Attempt
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{MaxAttempts: 1},
			OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
		if code, _, _ := roundTrip(t, tr, newReq(t, "GET", "")); code != 429 {
			t.Fatalf("got %d; want the 429", code)
		}
		if got := lim.Rate(); !near(got, 7) {
			t.Fatalf("got a rate of %v; want 7", got)
		}
		start := time.Now()
		for range 3 {
			if code, _, err := roundTrip(t, tr, newReq(t, "GET", "")); code != 200 || err != nil {
				t.Fatalf("got (%d, %v); want 200", code, err)
			}
		}
		times := base.Attempts()
		if len(times) != 4 {
			t.Fatalf("got %d attempts; want 4", len(times))
		}
		if got := times[1].Time.Sub(start); got != seventh {
			t.Errorf("first request after the throttle sent after %v; want %v", got, seventh)
		}
		var asked []float64 // when each request asked, since the throttle
		for i := 1; i < 4; i++ {
			asked = append(asked, times[i-1].Time.Sub(start).Seconds())
		}
		asked[0] = 0
		for i := 2; i < 4; i++ { // each gap set when the request before asked
			dem := meterRate(10, 0.1, asked[:i-1], asked[i-2])
			gap := times[i].Time.Sub(times[i-1].Time)
			if want := interval(max(0.7*dem, DefaultLimiterMinRate)); gap != want {
				t.Errorf("gap %d: got %v; want %v (0.7 of a demand of %.3f/s)", i, gap, want, dem)
			}
		}
		if a := hooks[1]; a.PermitWait != seventh {
			t.Errorf("got PermitWait %v in the hook; want 1/7 s", a.PermitWait)
		}
	})
}

func TestTransportFailsFastWithoutPermit(t *testing.T) {
	for _, method := range []string{"GET", "POST"} {
		t.Run(method, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base, _ := throttledOnce(0)
				var logs bytes.Buffer
				lim := &RateLimiter{}
				tr := &Transport{Base: base, Limiter: lim, Policy: Policy{MaxAttempts: 1}, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
				roundTrip(t, tr, newReq(t, "GET", ""))
				logs.Reset()
				// The next permit is 1/7 s away; the deadline is closer.
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				body := &closeCounter{Reader: bytes.NewReader([]byte("payload"))}
				req, _ := http.NewRequestWithContext(ctx, method, "http://example.test/", body)
				var rep Report
				req = req.WithContext(WithReport(req.Context(), &rep))
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				var re *Error
				if resp != nil || !errors.As(err, &re) || !errors.Is(err, ErrRateLimited) {
					t.Fatalf("got (%v, %v); want an *Error wrapping ErrRateLimited", resp, err)
				}
				if re.Attempts != 0 || re.Decision != StopRateLimited || rep.Decision != StopRateLimited {
					t.Errorf("got %d attempts, decision %v (report: %v); want 0, rate limited", re.Attempts, re.Decision, rep.Decision)
				}
				if took := time.Since(start); took != 0 {
					t.Errorf("returned after %v; want at once", took)
				}
				if body.closes != 1 {
					t.Errorf("request body closed %d times; want 1", body.closes)
				}
				rht.AssertAttempts(t, base, 1)
				// The refused request asked: the demand, and the rate, rose.
				want := 0.7 * meterRate(10, 0.1, []float64{0}, 0)
				if st := lim.Stats(); st.Cuts != 1 || st.Refused != 1 || !near(st.Rate, want) {
					t.Errorf("got stats %+v; want 1 cut, 1 refused, rate %v", st, want)
				}
				if got := logs.String(); !strings.Contains(got, `level=WARN msg="retryhttp: no send permit" method=`+method) ||
					!strings.Contains(got, "attempt=1 rate_limit=") {
					t.Errorf("got log %q; want one warning for the attempt not made", got)
				}
			})
		})
	}
}

func TestRetryTakesAPermit(t *testing.T) {
	// A 429, then its retry after the throttle backoff (0 here): the retry
	// takes its permit when it is due, and waits for it.
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(429), rht.Status(200))
		var hooks []Attempt
		tr := &Transport{Base: base, Limiter: &RateLimiter{}, Policy: Policy{Rand: lowRand},
			OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
		code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
		if code != 200 || err != nil {
			t.Fatalf("got (%d, %v); want 200", code, err)
		}
		if gaps := rht.Gaps(base); len(gaps) != 1 || gaps[0] != seventh {
			t.Errorf("got gaps %v; want [%v]", gaps, seventh)
		}
		if hooks[0].Delay != 0 || hooks[1].PermitWait != seventh {
			t.Errorf("got delay %v and permit wait %v; want 0 (the backoff) and %v", hooks[0].Delay, hooks[1].PermitWait, seventh)
		}
	})
}

func TestRetryPlannedAheadHoldsNoPermit(t *testing.T) {
	// A retry due in 500 ms (retry-after-ms) does not hold a permit in the
	// meantime: another request gets the next one. The 429's Retry-After
	// pauses the limiter, though, so that one comes after the pause.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		base := rht.NewTransport(rht.Status(429).WithHeader("Retry-After-Ms", "500"), rht.Status(200))
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{Rand: lowRand}}
		other := rht.NewTransport(rht.Status(200))
		start := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { roundTrip(t, tr, newReq(t, "GET", "")) })
		synctest.Wait() // the 429 is in, its retry waits
		roundTrip(t, &Transport{Base: other, Limiter: lim}, newReq(t, "GET", ""))
		wg.Wait()
		a, b := other.Attempts()[0].Time.Sub(start), base.Attempts()[1].Time.Sub(start)
		if a != 500*time.Millisecond || b <= a {
			t.Errorf("the other request was sent after %v, the retry after %v; want the other first, at the pause's end (500ms)", a, b)
		}
	})
}

func TestRetryWithoutPermitReturnsTheResponse(t *testing.T) {
	// The retry's permit would come after the deadline: the 429 is returned
	// as it is, and the retry's tokens go back.
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(429), rht.Status(200))
		budget := NewTokenBucket(500)
		tr := &Transport{Base: base, Limiter: &RateLimiter{}, Budget: budget, Policy: Policy{Rand: lowRand, Timeout: 100 * time.Millisecond}}
		var rep Report
		req := newReq(t, "GET", "")
		req = req.WithContext(WithReport(req.Context(), &rep))
		code, _, err := roundTrip(t, tr, req)
		if code != 429 || err != nil || rep.Decision != StopRateLimited {
			t.Fatalf("got (%d, %v, %v); want the 429, rate limited", code, err, rep.Decision)
		}
		if got := budget.Available(); got != 500 {
			t.Errorf("got %d tokens; want 500 (nothing spent)", got)
		}
		rht.AssertAttempts(t, base, 1)
	})
}

func TestCutWhileWaiting(t *testing.T) {
	// B waits for its permit when A's throttle comes back: B's permit was
	// given before the cut, so it takes one of the new rate when it wakes.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		holdAt(lim, 10, time.Hour)
		base := rht.NewTransport(rht.Status(429).WithDelay(50*time.Millisecond), rht.Status(200))
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		start := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { roundTrip(t, tr, newReq(t, "GET", "")) }) // A: sent at once, 429 at 50 ms
		synctest.Wait()
		wg.Go(func() { roundTrip(t, tr, newReq(t, "GET", "")) }) // B: its permit at 100 ms
		synctest.Wait()
		time.Sleep(100 * time.Millisecond) // B wakes after the cut
		wg.Wait()
		a := base.Attempts()
		if len(a) != 2 {
			t.Fatalf("got %d attempts; want 2", len(a))
		}
		lim.mu.Lock()
		gap := interval(lim.level) // the period is an hour: no probe
		lim.mu.Unlock()
		if got, want := a[1].Time.Sub(start), 50*time.Millisecond+gap; got != want {
			t.Errorf("B sent after %v; want %v (one interval of the new rate after the cut), not 100ms", got, want)
		}
	})
}

func TestSharedLimiter(t *testing.T) {
	// Two Transports share a limiter: a throttle seen by one slows the
	// other.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		one := &Transport{Base: rht.NewTransport(rht.Status(429)), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		other := rht.NewTransport(rht.Status(200))
		two := &Transport{Base: other, Limiter: lim}
		roundTrip(t, one, newReq(t, "GET", ""))
		start := time.Now()
		roundTrip(t, two, newReq(t, "GET", ""))
		if got, want := other.Attempts()[0].Time.Sub(start), seventh; got != want {
			t.Errorf("the other Transport sent after %v; want %v", got, want)
		}
	})
}

func TestLimiterCanceledWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base, _ := throttledOnce(0)
		tr := &Transport{Base: base, Limiter: &RateLimiter{}, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, tr, newReq(t, "GET", ""))
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(10*time.Millisecond, cancel)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://example.test/", nil)
		_, err := tr.RoundTrip(req)
		var re *Error
		if !errors.As(err, &re) || re.Decision != StopCanceled || re.Attempts != 0 || !errors.Is(err, context.Canceled) {
			t.Errorf("got %v; want canceled after 0 attempts", err)
		}
		rht.AssertAttempts(t, base, 1)
	})
}

func TestLimiterLogs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		base := rht.NewTransport(rht.Status(429), rht.Status(429), rht.Status(200))
		tr := &Transport{Base: base, Limiter: &RateLimiter{}, Policy: Policy{Rand: lowRand},
			Logger: slog.New(slog.NewTextHandler(&buf, nil))}
		roundTrip(t, tr, newReq(t, "GET", ""))
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 3 || !strings.Contains(lines[0], "rate_limit=7 ") || strings.Contains(lines[0], "permit_wait") ||
			!strings.Contains(lines[1], "permit_wait=142.857142ms") {
			t.Errorf("got log\n%s\nwant 3 lines, the first with rate_limit=7, the second with the permit wait", buf.String())
		}
	})
}

func TestLimiterUnderConcurrency(t *testing.T) {
	// 100 goroutines at once through a limiter holding 10/s: the sends
	// follow the rate, each request either gets a permit within 20
	// permits' time (the queue's bound, 2 s, beyond the 1 s deadline: the
	// deadline decides) or fails at once.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		holdAt(lim, 10, time.Hour)
		base := rht.NewTransport(rht.Status(200).Times(100))
		tr := &Transport{Base: base, Limiter: lim}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			limited int
		)
		start := time.Now()
		for range 100 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://example.test/", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					if !errors.Is(err, ErrRateLimited) || time.Since(start) != 0 {
						t.Errorf("got %v after %v; want ErrRateLimited at once", err, time.Since(start))
					}
					mu.Lock()
					limited++
					mu.Unlock()
					return
				}
				resp.Body.Close()
			})
		}
		wg.Wait()
		// Permits at 0, 100, ..., 900 ms: 10.
		if sent := len(base.Attempts()); sent != 10 || limited != 90 {
			t.Errorf("got %d sent and %d rate limited; want 10 sent, 90 limited", sent, limited)
		}
		for i, a := range base.Attempts() {
			if got, want := a.Time.Sub(start), time.Duration(i)*interval(10); got != want {
				t.Errorf("attempt %d sent at %v; want %v", i, got, want)
			}
		}
	})
}

func TestRateLimiterFirstCutUsesTheRecentRate(t *testing.T) {
	// One request, an hour idle, then 100 at 20/s and a 429: the start is
	// from the rate just measured (38 sends in the 1.85 s since the last
	// mark, at the 64th of the 100), not from the hour's average.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		ok := &Transport{Base: rht.NewTransport(rht.Status(200)), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, ok, newReq(t, "GET", ""))
		time.Sleep(time.Hour)
		for range 100 {
			roundTrip(t, ok, newReq(t, "GET", ""))
			time.Sleep(50 * time.Millisecond)
		}
		throttled := &Transport{Base: rht.NewTransport(rht.Status(429)), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, throttled, newReq(t, "GET", ""))
		if got, want := lim.Rate(), DefaultLimiterBeta*38/1.85; !near(got, want) {
			t.Errorf("got %.3f permits/s after the cut; want %.3f (0.7 of the recent 20.5/s)", got, want)
		}
	})
}

func TestRateLimiterNonFiniteSettings(t *testing.T) {
	// NaN and infinite settings mean the defaults.
	nan, inf := math.NaN(), math.Inf(1)
	for _, l := range []*RateLimiter{
		{Beta: nan}, {Beta: inf}, {Beta: -inf}, {MinRate: nan}, {MinRate: inf}, {MinRate: -inf}, {Beta: nan, MinRate: nan},
	} {
		t.Run(fmt.Sprintf("Beta %v MinRate %v", l.Beta, l.MinRate), func(t *testing.T) {
			if l.beta() != DefaultLimiterBeta || l.minRate() != DefaultLimiterMinRate {
				t.Errorf("got beta %v, min rate %v; want the defaults", l.beta(), l.minRate())
			}
			synctest.Test(t, func(t *testing.T) {
				startAt21(t, l)
				if got := l.Rate(); math.IsNaN(got) || !near(got, 0.7*21) {
					t.Errorf("got rate %v; want %v, the zero RateLimiter's", got, 0.7*21)
				}
			})
		})
	}
}

func TestMaxWaitBoundsTheWholeWait(t *testing.T) {
	// B is due at 1 ms with a permit at 100 ms, within MaxWait (150 ms).
	// A's 429 cuts the rate at 50 ms (to 7.75/s), which voids B's permit;
	// the next would come at 50 + 129 ms, 178 ms after B was due: B fails
	// when it finds out, at 100 ms, rather than wait past MaxWait.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{MaxWait: 150 * time.Millisecond}
		holdAt(lim, 10, time.Hour)
		base := rht.NewTransport(rht.Status(429).WithDelay(50*time.Millisecond), rht.Status(200))
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		start := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { roundTrip(t, tr, newReq(t, "GET", "")) }) // A
		synctest.Wait()
		time.Sleep(time.Millisecond)
		var err error
		var took time.Duration
		wg.Go(func() { // B
			_, _, err = roundTrip(t, tr, newReq(t, "GET", ""))
			took = time.Since(start)
		})
		wg.Wait()
		var re *Error
		if !errors.As(err, &re) || re.Decision != StopRateLimited || re.Attempts != 0 {
			t.Fatalf("B: got %v; want StopRateLimited after 0 attempts", err)
		}
		if took != 100*time.Millisecond {
			t.Errorf("B gave up after %v; want 100ms, when its voided permit was due", took)
		}
		rht.AssertAttempts(t, base, 1)
	})
}

func TestCanceledWaiterGivesItsSlotBack(t *testing.T) {
	// A waits for the permit at 100 ms and is canceled at 10 ms: its slot
	// goes back, and C, due at 20 ms, takes it, not the one after.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		holdAt(lim, 10, time.Hour)
		d := driver{t, lim}
		d.take() // at once
		start := time.Now()
		base := rht.NewTransport(rht.Status(200))
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(10*time.Millisecond, cancel)
		if _, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx)); !errors.Is(err, context.Canceled) {
			t.Fatalf("A: got %v; want canceled", err)
		}
		time.Sleep(10 * time.Millisecond)
		roundTrip(t, tr, newReq(t, "GET", "")) // C
		if got := base.Attempts()[0].Time.Sub(start); got != 100*time.Millisecond {
			t.Errorf("C sent after %v; want 100ms (A's slot)", got)
		}
	})
}

// queueAtTheDemandCap holds l at 100/s with a demand of 5/s, so that its
// rate is the demand cap, 10/s, and gives n permits asked for now, spaced
// at it. It returns the last.
func queueAtTheDemandCap(t *testing.T, l *RateLimiter, n int) permit {
	t.Helper()
	holdAt(l, 100, time.Hour)
	now := time.Now()
	l.mu.Lock()
	l.demand.seed(now, 5, time.Hour)
	l.mu.Unlock()
	var last permit
	for range n {
		p, ok := l.reserve(now, now, time.Time{}, false)
		if !ok {
			t.Fatal("refused")
		}
		last = p
	}
	return last
}

// A waits for the first slot and B for the second; A is canceled; C comes
// next. A's slot has a later permit behind it (B's), so it is not given back:
// C is sent one interval after B, not with it. x/time/rate's
// Reservation.Cancel, the model, restores only what later reservations have
// not taken.
func TestCanceledLastPermitLeavesNoBurst(t *testing.T) {
	// Permits queued at 10/s (the demand cap), then, a second later, one
	// at the lower rate the decayed demand allows, its slot longer than
	// the spacing before it; the rate rises again and that permit is
	// canceled. The next permit must not come before the ones still held
	// (it did when a cancel kept the canceled permit's interval as the
	// one to shorten from).
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		t0 := time.Now()
		last := queueAtTheDemandCap(t, l, 15).at
		time.Sleep(time.Second)
		now := time.Now()
		b, ok := l.reserve(now, now, time.Time{}, false)
		if !ok {
			t.Fatal("refused")
		}
		l.MaxWait = 550 * time.Millisecond
		for range 4 { // asks refused by MaxWait still raise the demand
			if _, ok := l.reserve(now, now, time.Time{}, true); ok {
				t.Fatal("an ask within MaxWait; want none")
			}
		}
		b.cancel()
		l.MaxWait = 0
		c, _ := l.reserve(now, now, time.Time{}, false)
		if !c.at.After(last) {
			t.Errorf("got the next permit at +%v; want it after the last one held, at +%v", c.at.Sub(t0), last.Sub(t0))
		}
	})
}

func TestCanceledWaiterNeverDoubleBooksASlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		holdAt(lim, 10, time.Hour)
		driver{t, lim}.take() // at once
		base := rht.NewTransport(rht.Status(200))
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx)) }) // A: slot 1
		synctest.Wait()
		wg.Go(func() { roundTrip(t, tr, newReq(t, "GET", "")) }) // B: slot 2
		synctest.Wait()
		time.Sleep(10 * time.Millisecond)
		cancel() // A gives up
		synctest.Wait()
		wg.Go(func() { roundTrip(t, tr, newReq(t, "GET", "")) }) // C
		wg.Wait()
		a := base.Attempts()
		if len(a) != 2 {
			t.Fatalf("got %d attempts; want 2 (B and C)", len(a))
		}
		if b, c := a[0].Time.Sub(start), a[1].Time.Sub(start); b != 200*time.Millisecond || c != 300*time.Millisecond {
			t.Errorf("B sent at %v, C at %v; want 200ms and 300ms, one interval apart, no burst", b, c)
		}
	})
}

func TestTransportLeavesRoomForTheAttempt(t *testing.T) {
	// Attempts take 50 ms. After one 429 (7/s), A is sent at 1/7 s and
	// answered at 192.86 ms; B then asks with a deadline 120 ms away, and
	// its permit is due at 212.5 ms (one interval of 0.7 of the demand
	// after A's). The permit comes before the deadline, but the attempt
	// would end after it: B fails at once, and the server is not asked for
	// work whose answer nobody would read.
	synctest.Test(t, func(t *testing.T) {
		base, _ := throttledOnce(50 * time.Millisecond)
		tr := &Transport{Base: base, Limiter: &RateLimiter{}, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, tr, newReq(t, "GET", ""))
		if code, _, err := roundTrip(t, tr, newReq(t, "GET", "")); code != 200 || err != nil { // A
			t.Fatalf("A: got (%d, %v); want 200", code, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx)) // B
		if !errors.Is(err, ErrRateLimited) || time.Since(start) != 0 {
			t.Errorf("B: got %v after %v; want ErrRateLimited at once", err, time.Since(start))
		}
		rht.AssertAttempts(t, base, 2)
	})
}

func TestTransportPausesOnRetryAfter(t *testing.T) {
	// A 429 with Retry-After: 2 pauses the limiter, for every request
	// through it, not only for the throttled request's retry: another
	// Transport sharing it, asking 1.5 s later, sends at 2 s; one asking
	// at once with a 1 s deadline fails at once.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		throttled := &Transport{Base: rht.NewTransport(rht.Status(429).WithHeader("Retry-After", "2")), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, throttled, newReq(t, "GET", ""))
		other := rht.NewTransport(rht.Status(200))
		tr := &Transport{Base: other, Limiter: lim}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx)); !errors.Is(err, ErrRateLimited) || time.Since(start) != 0 {
			t.Errorf("with a 1 s deadline: got %v after %v; want ErrRateLimited at once", err, time.Since(start))
		}
		time.Sleep(1500 * time.Millisecond)
		roundTrip(t, tr, newReq(t, "GET", ""))
		if a := other.Attempts(); len(a) != 1 || a[0].Time.Sub(start) != 2*time.Second {
			t.Fatalf("got attempts %v; want one, at 2s", a)
		}
		if got := other.Attempts()[0].Time.Sub(start); got != 2*time.Second {
			t.Errorf("the other request was sent after %v; want 2s", got)
		}
	})
}

// askEvery asks the limiter for a permit every period for dur, each
// request with a deadline of within, and answers 200 to every attempt
// sent. It returns how many were sent.
func askEvery(t *testing.T, l *RateLimiter, period, dur, within time.Duration) int {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		sent int
	)
	d := driver{t, l}
	for end := time.Now().Add(dur); time.Now().Before(end); time.Sleep(period) {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), within)
			defer cancel()
			var p permit
			if err := l.acquire(ctx, &p); err != nil {
				return
			}
			mu.Lock()
			sent++
			mu.Unlock()
			d.answer(p, 200)
		})
	}
	wg.Wait()
	return sent
}

func TestLimiterStartsFromTheRateSent(t *testing.T) {
	t.Run("after an idle spell, not from its average", func(t *testing.T) {
		// One send, an hour idle, then 30 at 20/s and a 429: fewer sends
		// than a mark's 64, so the rate measured is the hour's average. It
		// must not become the start's ceiling.
		run := func(idle time.Duration) (sent int) {
			synctest.Test(t, func(t *testing.T) {
				l := &RateLimiter{}
				ok := &Transport{Base: rht.NewTransport(rht.Status(200)), Limiter: l, Policy: Policy{MaxAttempts: 1}}
				roundTrip(t, ok, newReq(t, "GET", ""))
				time.Sleep(idle)
				for range 30 {
					roundTrip(t, ok, newReq(t, "GET", ""))
					time.Sleep(50 * time.Millisecond)
				}
				throttled := &Transport{Base: rht.NewTransport(rht.Status(429)), Limiter: l, Policy: Policy{MaxAttempts: 1}}
				roundTrip(t, throttled, newReq(t, "GET", ""))
				sent = askEvery(t, l, 50*time.Millisecond, 20*time.Second, time.Second)
			})
			return sent
		}
		idle, busy := run(time.Hour), run(50*time.Millisecond)
		if idle < busy*3/4 {
			t.Errorf("sent %d of 400 requests in the 20 s after one 429 (every one accepted) after an idle hour, %d without; want at least 3/4 as many", idle, busy)
		}
	})
	t.Run("a throttle answered late, from the rate its attempt was sent at", func(t *testing.T) {
		// A permit sent at 14.7/s is answered 429 1.9 s later, the demand
		// measured having fallen meanwhile (nobody asked); the cut is from
		// the 14.7/s, and when the demand comes back the start follows it.
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			d := startAt21(t, l)
			p := d.take()
			time.Sleep(1900 * time.Millisecond)
			d.answer(p, http.StatusTooManyRequests)
			if got, want := peek(l).share, 0.7*(1-1.0/3); !near(got, want) {
				t.Fatalf("got a share of %v; want %v", got, want)
			}
			l.mu.Lock()
			ceil := l.ceil
			l.mu.Unlock()
			if want := 0.7 * 21 * (1 - 1.0/3); !near(ceil, want) {
				t.Errorf("got a ceiling of %v/s; want %v (2/3 of the 14.7/s the attempt was sent at)", ceil, want)
			}
			// (the 1.9 s answer makes the attempts' room 5.7 s: 10 s deadlines)
			askEvery(t, l, 50*time.Millisecond, 6*time.Second, 10*time.Second)
			s := peek(l)
			if want := 0.5 * 0.7 * 2 / 3 * 20; s.share != 0 || s.level < want {
				t.Errorf("the start ended on %v/s (share %v) after 6 s of a demand of 20/s; want at least %.2f/s", s.level, s.share, want)
			}
		})
	})
	t.Run("sends counted before the first mark", func(t *testing.T) {
		// Another goroutine's 429 can reach the limiter between the count
		// of the first send and its mark: the sends counted are the rate,
		// over the shortest span measured.
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			l.idleSent.Add(2)
			driver{t, l}.answer(permit{l: l}, 429)
			if got, want := l.Rate(), 0.7*2/minMeasure.Seconds(); !near(got, want) {
				t.Errorf("got %v permits/s; want %v (0.7 of 2 sends in 100 ms)", got, want)
			}
		})
	})
	t.Run("a share cut to nothing still starts", func(t *testing.T) {
		// Halved round after round, the share would reach 0, which marks
		// the end of the start, with no level set: the rate jumped back to
		// the one sent before the first throttle.
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{MinRate: 100, Beta: 0.5}
			d := driver{t, l}
			for range 1200 { // 6 s at 200/s: remembered as a rate held
				d.answer(d.take(), 200)
				time.Sleep(5 * time.Millisecond)
			}
			worst := 0.0
			for i := range 1500 {
				d.answer(d.take(), 429)
				if r := l.Rate(); i >= 20 && r > worst {
					worst = r
				}
			}
			if worst != 100 {
				t.Errorf("the rate reached %v/s in a run of throttles, every attempt refused; want MinRate, 100/s", worst)
			}
		})
	})
}

// ceilOf reads l's ceiling.
func ceilOf(l *RateLimiter) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ceil
}

// sendsAfterIdle sends n attempts through d every period, all accepted,
// after one send and a pause of idle (none when zero).
func sendsAfterIdle(d driver, idle time.Duration, n int, period time.Duration) {
	if idle > 0 {
		d.answer(d.take(), 200)
		time.Sleep(idle)
	}
	for range n {
		d.answer(d.take(), 200)
		time.Sleep(period)
	}
}

// sendsThenThrottle is sendsAfterIdle, then one attempt throttled.
func sendsThenThrottle(d driver, idle time.Duration, n int, period time.Duration) {
	sendsAfterIdle(d, idle, n, period)
	d.answer(d.take(), 429)
}

// TestLimiterFirstMeasure: the rate sent before the first throttle is a
// ceiling for the start only when measured over a whole window that began
// within the last second; otherwise the start follows the demand as it is
// measured again, and nothing of an old measure is kept.
func TestLimiterFirstMeasure(t *testing.T) {
	t.Run("a throttle within minMeasure of the first send sets no ceiling", func(t *testing.T) {
		// Whether a client's 10th send at 200/s (45 ms in) or its 22nd
		// (105 ms in) is throttled, it goes on at a share of the same
		// demand: a floored window reads low, and is not kept.
		run := func(n int) (rate, ceil float64) {
			synctest.Test(t, func(t *testing.T) {
				l := &RateLimiter{}
				sendsThenThrottle(driver{t, l}, 0, n-1, 5*time.Millisecond)
				ceil = ceilOf(l)
				askEvery(t, l, 5*time.Millisecond, time.Second, time.Second)
				rate = l.Rate()
			})
			return rate, ceil
		}
		early, earlyCeil := run(10)
		late, lateCeil := run(22)
		if !math.IsInf(earlyCeil, 1) || !near(lateCeil, 0.7*22/0.105) {
			t.Errorf("got ceilings %v and %v; want none, and 0.7 of the 22 sends in 105 ms", earlyCeil, lateCeil)
		}
		if early < late*3/4 {
			t.Errorf("rate %v/s a second after a 429 at the 10th send of 200/s, %v/s after one at the 22nd; want at least 3/4 as much", early, late)
		}
	})
	t.Run("a client whose first send is throttled is not pinned", func(t *testing.T) {
		run := func(cold bool) (sent int) {
			synctest.Test(t, func(t *testing.T) {
				l := &RateLimiter{}
				d := driver{t, l}
				if cold {
					d.answer(d.take(), 429)
				} else {
					sendsThenThrottle(d, 50*time.Millisecond, 30, 50*time.Millisecond)
				}
				sent = askEvery(t, l, 50*time.Millisecond, 20*time.Second, time.Second)
			})
			return sent
		}
		warm, cold := run(false), run(true)
		if cold < warm*3/4 {
			t.Errorf("a client whose first request drew a 429 sent %d of 400 in the next 20 s (every one accepted), one throttled 1.5 s in %d; want at least 3/4 as many", cold, warm)
		}
	})
	t.Run("an hour-old measure sets no ceiling", func(t *testing.T) {
		// 65 sends at 100/s an hour ago are a whole window between two
		// marks, but not a recent one.
		run := func(oldBurst int) (rate, ceil float64) {
			synctest.Test(t, func(t *testing.T) {
				l := &RateLimiter{}
				d := driver{t, l}
				for range oldBurst {
					d.answer(d.take(), 200)
					time.Sleep(10 * time.Millisecond)
				}
				sendsThenThrottle(d, time.Hour, 30, 5*time.Millisecond)
				ceil = ceilOf(l)
				askEvery(t, l, 5*time.Millisecond, 3*time.Second, time.Second)
				rate = l.Rate()
			})
			return rate, ceil
		}
		fresh, _ := run(1)
		stale, staleCeil := run(65)
		if !math.IsInf(staleCeil, 1) {
			t.Errorf("got a ceiling of %v/s from sends an hour old; want none", staleCeil)
		}
		if stale < fresh*3/4 {
			t.Errorf("rate %v/s after 3 s of 200/s asked when 65 sends were measured an hour before, %v/s without them; want at least 3/4 as much", stale, fresh)
		}
	})
	t.Run("sends counted before the first mark are not a rate held", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			l.idleSent.Add(10)
			driver{t, l}.answer(permit{l: l}, 429)
			if h := peek(l).high; h != 0 {
				t.Errorf("remembered %v/s as a rate held; want none: sends counted in an instant were not sent for %v", h, heldFor)
			}
		})
	})
	t.Run("the first cut is Beta whatever the lag of the answer", func(t *testing.T) {
		// The answers the first round is seeded with are the sends
		// measured, rounded: 1/0.104 s times 0.104 s is one, not zero.
		for _, lag := range []time.Duration{100, 103, 104, 105} {
			synctest.Test(t, func(t *testing.T) {
				l := &RateLimiter{}
				d := driver{t, l}
				p := d.take()
				time.Sleep(lag * time.Millisecond)
				d.answer(p, 429)
				if got := peek(l).share; got != DefaultLimiterBeta {
					t.Errorf("first send throttled after %v ms: share %v; want %v", lag, got, DefaultLimiterBeta)
				}
			})
		}
	})
	t.Run("a throttled request's retry after an idle spell", func(t *testing.T) {
		// The first cut after an idle spell must not schedule the next
		// permit at the idle average's interval: the request's retry,
		// with 5 s left, gets one. A start measured over a window that
		// began long ago (an idle average) is not measured: after 150 s
		// idle, 32 sends over 151.5 s read 0.211/s, and a first cut
		// scheduled at 0.7 of it put the retry's permit 6.76 s away, past
		// its deadline, when only a rate at MinRate was taken for
		// unmeasured.
		for _, tc := range []struct {
			name    string
			idle    time.Duration
			minRate float64
		}{
			{"50ms idle", 50 * time.Millisecond, 0},
			{"150s idle", 150 * time.Second, 0},
			{"200s idle", 200 * time.Second, 0},
			{"1h idle", time.Hour, 0},
			{"1h idle, MinRate 0.001", time.Hour, 0.001},
		} {
			t.Run(tc.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					l := &RateLimiter{MinRate: tc.minRate}
					sendsAfterIdle(driver{t, l}, tc.idle, 30, 50*time.Millisecond)
					base := rht.NewTransport(rht.Status(429), rht.Status(200))
					tr := &Transport{Base: base, Limiter: l, Policy: Policy{Rand: lowRand, Timeout: 5 * time.Second}}
					if code, _, err := roundTrip(t, tr, newReq(t, "GET", "")); code != 200 || err != nil {
						t.Errorf("got (%d, %v) for a request throttled once after %v idle, with a 5 s deadline; want its retry's 200", code, err, tc.idle)
					}
				})
			})
		}
	})
}

func TestCanceledPermitRestoresTheSchedule(t *testing.T) {
	// Five permits queued at 10/s (the demand cap); the demand doubles, so
	// the next one, B, comes sooner (due) and is canceled. The limiter must be
	// as before B was given: the permit after it comes after the last one
	// still held (a cancel that rolled back B's shortened slot let it come
	// before).
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		t0 := time.Now()
		last := queueAtTheDemandCap(t, l, 5)
		l.mu.Lock()
		l.demand.seed(t0, 10, time.Hour)
		before := l.next
		l.mu.Unlock()
		b, ok := l.reserve(t0, t0, time.Time{}, false)
		if !ok || !b.at.Before(before) {
			t.Fatalf("B at +%v (given: %v); want before +%v, sooner as the rate rose, for the test to mean anything", b.at.Sub(t0), ok, before.Sub(t0))
		}
		b.cancel()
		if got := peek(l).next; !got.Equal(before) {
			t.Errorf("next permit at +%v after B was canceled; want +%v, as before B", got.Sub(t0), before.Sub(t0))
		}
		c, _ := l.reserve(t0, t0, time.Time{}, false)
		if !c.at.After(last.at) {
			t.Errorf("C's permit at +%v; want after the last one held, at +%v", c.at.Sub(t0), last.at.Sub(t0))
		}
	})
}

// TestLimiterThrottledThroughoutKeepsMinRate: a client every attempt of
// which is throttled sends at MinRate once its start has cut its share
// below it, not one attempt per answer.
func TestLimiterThrottledThroughoutKeepsMinRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		d := driver{t, l}
		for range 20 { // 20/s, accepted, for a second
			d.answer(d.take(), 200)
			time.Sleep(50 * time.Millisecond)
		}
		start := time.Now()
		sent := 0
		for time.Since(start) < 60*time.Second {
			p := d.take()
			time.Sleep(10 * time.Millisecond) // the answer's latency
			d.answer(p, 429)
			sent++
		}
		// The share falls 0.7 a cut; once the rate is below 0.5/s, its
		// interval is longer than the start's 2 s, the start ends, and
		// the holding limiter halves to the 0.1/s floor.
		if max := 40; sent > max {
			t.Errorf("sent %d attempts in 60 s, every one throttled; want at most %d", sent, max)
		}
	})
}

// TestLimiterStartAtMinRateSpacesPermits: MinRate 50 above the start's share of a
// demand of about 10/s. Every cut of the start then finds its gap equal to
// MinRate's interval; that is not "no demand measured": the next permit
// comes one interval of the rate after the cut, so a client whose every
// attempt is throttled 1 ms after it is sent gets one each 21 ms, not one
// each millisecond (it did when a gap of MinRate's interval was taken for
// an unmeasured start).
func TestLimiterStartAtMinRateSpacesPermits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{MinRate: 50}
		d := driver{t, l}
		sendsThenThrottle(d, 0, 10, 100*time.Millisecond) // 11 sends at 10/s, the 11th throttled
		if s := peek(l); s.share == 0 || s.epoch != 1 {
			t.Fatalf("got share %v, %d cuts; want a start after 1 cut", s.share, s.epoch)
		}
		if got := l.Rate(); got != 50 {
			t.Fatalf("got a rate of %v/s; want MinRate, 50/s (0.7 of a demand of 11/s is below it)", got)
		}
		var first, last time.Time
		for i := range 10 {
			p := d.take()
			if i == 0 {
				first = p.at
			}
			last = p.at
			time.Sleep(time.Millisecond)
			d.answer(p, 429) // a throttle of the current round: a cut
		}
		if s := peek(l); s.share == 0 || s.epoch != 11 {
			t.Fatalf("got share %v, %d cuts; want still starting, 11 cuts", s.share, s.epoch)
		}
		if got := l.Rate(); got != 50 {
			t.Fatalf("got a rate of %v/s; want 50/s", got)
		}
		// 10 permits at 50/s, each one interval of the rate after the cut
		// before it: 9 x (1 ms + 20 ms) from the first to the last.
		if got, want := last.Sub(first), 9*(time.Millisecond+interval(50)); got != want {
			t.Errorf("10 permits in %v at a rate of 50/s; want %v (the permit after a cut one interval after it)", got, want)
		}
	})
}

// TestLimiterIdleSpellDoesNotPinTheStart: the idle spell's average, kept
// out of the first ceiling, must not come back through the second. After
// an hour idle the first permit after the cut has the slot of 0.7 of a
// demand seeded with the hour's average and one ask (0.71/s); that slot is
// not the rate the attempt was sent at (it was sent at once), so when it is
// throttled too the ceiling is not 2/3 of it (0.47/s, against 10.2/s for
// the same sends without the idle spell; the start sent a sixth as much).
func TestLimiterIdleSpellDoesNotPinTheStart(t *testing.T) {
	run := func(idle time.Duration) (sent int, ceil float64) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			d := driver{t, l}
			sendsThenThrottle(d, idle, 30, 50*time.Millisecond)
			d.answer(d.take(), 429) // the first permit after the cut, throttled too
			ceil = ceilOf(l)
			sent = askEvery(t, l, 50*time.Millisecond, 20*time.Second, time.Second)
		})
		return sent, ceil
	}
	busy, busyCeil := run(50 * time.Millisecond)
	idle, idleCeil := run(time.Hour)
	if idleCeil < busyCeil*3/4 {
		t.Errorf("got a ceiling of %v/s after an hour idle, %v/s without; want at least 3/4 as much (the idle average is not the rate sent)", idleCeil, busyCeil)
	}
	if idle < busy*3/4 {
		t.Errorf("sent %d of 400 in the 20 s after two 429s after an idle hour, %d without; want at least 3/4 as many", idle, busy)
	}
}

// TestCanceledWaitersGiveBackEverySlot: A, B and C wait for the permits at 100,
// 200 and 300 ms (10/s) and give up in turn, the last first. C's cancel
// restores the schedule as before C; B is then the most recent permit left,
// and its cancel, then A's, restore the schedule as before each.
// Nothing is held: D, asking at 10 ms with 250 ms left, gets the permit at
// 100 ms (it was refused when only the last cancel restored the schedule).
// x/time/rate, the model cancel cites, restores all three when they are
// canceled last first.
func TestCanceledWaitersGiveBackEverySlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		holdAt(l, 10, time.Hour)
		d := driver{t, l}
		d.take() // at once; the next permit is due at 100 ms
		start := time.Now()
		var wg sync.WaitGroup
		cancels := make([]context.CancelFunc, 3)
		for i := range cancels {
			ctx, cancel := context.WithCancel(context.Background())
			cancels[i] = cancel
			wg.Go(func() {
				var p permit
				if err := l.acquire(ctx, &p); !errors.Is(err, context.Canceled) {
					t.Errorf("waiter %d: got %v; want canceled", i, err)
				}
			})
			synctest.Wait() // in order: A, B, C
		}
		time.Sleep(10 * time.Millisecond)
		for i := len(cancels) - 1; i >= 0; i-- { // C, B, A
			cancels[i]()
			synctest.Wait()
		}
		wg.Wait()
		if got, want := peek(l).next.Sub(start), 100*time.Millisecond; got != want {
			t.Errorf("next permit at +%v after every waiter gave up; want +%v, as before A", got, want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		defer cancel()
		var p permit
		err := l.acquire(ctx, &p)
		if err != nil || time.Since(start) != 100*time.Millisecond {
			t.Errorf("D: got %v at +%v; want a permit at +100ms", err, time.Since(start))
		}
	})
}

// TestLimiterStepsDoublePastTheLastThrottle: probe steps kept in a row past
// the rate the last throttle came at double from the second on, up to 32
// times a fiftieth of the demand; below that rate they do not; a throttle
// takes the step back and the next is a fiftieth again.
func TestLimiterStepsDoublePastTheLastThrottle(t *testing.T) {
	// Each step is a fiftieth of the demand (100/s), and one is kept every
	// 2 s (Recovery/10) while the level it sets is within twice the demand
	// (see stepsFrom).
	run := func(t *testing.T, level, top float64, keeps int, cutEach bool) (l *RateLimiter, got []float64) {
		l = &RateLimiter{}
		got, _ = stepsFrom(t, l, level, top, keeps, cutEach)
		return l, got
	}
	t.Run("past the last throttle", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l, got := run(t, 10, 10, 8, false)
			// Levels of about 12, 14, 18, 26, 42, 74, 138; the next step
			// passes twice the demand: it is not tried, nor kept.
			if want := []float64{1, 2, 4, 8, 16, 32, 32, 32}; !reflect.DeepEqual(got, want) {
				t.Errorf("got steps of %v fiftieths of the demand; want %v", got, want)
			}
			s := peek(l)
			if dem := l.demand.rate(time.Now()); s.level > demandCap*dem || s.level+s.step <= demandCap*dem {
				t.Errorf("got level %v, step %v; want the last step kept within twice the demand (%v), the next past it", s.level, s.step, demandCap*dem)
			}
			driver{t, l}.answer(permit{l: l, epoch: peek(l).epoch}, 429)
			if s := peek(l); s.step != probeStep*max(l.demand.rate(time.Now()), s.level) {
				t.Errorf("after a throttle: got a step of %v at level %v; want a fiftieth", s.step, s.level)
			}
		})
	})
	below := []struct {
		name    string
		level   float64
		cutEach bool
		want    []float64
	}{
		{"below it, with a cut within 4 s of each step", 10, true, []float64{1, 1, 1, 1}},
		{"below it, quiet, asked for three times the level or more", 10, false, []float64{1, 2, 4, 8}},
		{"below it, quiet, asked for less than three times the level", 40, false, []float64{1, 1, 1, 1}},
	}
	for _, tc := range below {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				_, got := run(t, tc.level, 100, 4, tc.cutEach)
				if !reflect.DeepEqual(got, tc.want) {
					t.Errorf("got steps of %v fiftieths of the demand; want %v", got, tc.want)
				}
			})
		})
	}
}

// windowServer accepts at most limit attempts in each whole second of the
// bubble's clock and throttles the rest (429), counting both.
type windowServer struct {
	mu      sync.Mutex
	limit   int
	win     time.Time
	n       int
	ok, thr int
}

func (s *windowServer) answer(p permit) {
	now := time.Now()
	s.mu.Lock()
	if now.Sub(s.win) >= time.Second {
		s.win, s.n = now.Truncate(time.Second), 0
	}
	s.n++
	throttled := s.n > s.limit
	if throttled {
		s.thr++
	} else {
		s.ok++
	}
	s.mu.Unlock()
	status, class := 200, Success
	if throttled {
		status, class = http.StatusTooManyRequests, Throttling
	}
	p.answered(&Policy{}, &http.Response{StatusCode: status, Header: http.Header{}}, nil, class)
}

func (s *windowServer) reset() {
	s.mu.Lock()
	s.ok, s.thr = 0, 0
	s.mu.Unlock()
}

// load asks l for a permit every period for dur, each request with a 1 s
// deadline; each attempt sent is answered by s 20 ms later.
func (s *windowServer) load(l *RateLimiter, period, dur time.Duration) {
	var wg sync.WaitGroup
	for end := time.Now().Add(dur); time.Now().Before(end); time.Sleep(period) {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			var p permit
			if err := l.acquire(ctx, &p); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
			s.answer(p)
		})
	}
	wg.Wait()
}

// TestLimiterStepsTheDemandCapHidDoNotCompound: a client held to a server's
// 10/s (30 s at 20/s) then asks exactly 10/s for 60 s: it sends all it
// asks, the server accepts it, and the rate is capped at twice the demand
// (demandCap: "so that a quiet client does not build up a rate it could not
// have tested"). A probe step past twice the demand was not tried: it is
// not kept (it was, and past the last throttle doubled, the level growing
// 1.64x every 2 s to ~377,000/s; when the demand then rose to 50/s, the
// limiter let through up to twice the demand and took a throttle per
// halving to come down: 34 429s in 10 s, against 2 without the 60 s).
func TestLimiterStepsTheDemandCapHidDoNotCompound(t *testing.T) {
	run := func(spell time.Duration) (level float64, ok, thr int) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			s := &windowServer{limit: 10}
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
			s.load(l, 50*time.Millisecond, 30*time.Second) // 20/s against 10/s
			if spell > 0 {
				s.load(l, 100*time.Millisecond, spell) // 10/s: what the server takes
			}
			l.mu.Lock()
			level = l.level
			l.mu.Unlock()
			s.reset()
			s.load(l, 20*time.Millisecond, 10*time.Second) // 50/s against 10/s
			ok, thr = s.ok, s.thr
		})
		return level, ok, thr
	}
	_, _, thr0 := run(0)
	level, ok, thr := run(time.Minute)
	if max := demandCap * 10; level > max {
		t.Errorf("got a level of %.4g/s after 60 s of sending 10/s, all accepted; want at most %v/s (twice the demand: nothing above it was sent)", level, max)
	}
	if thr > 5*thr0 {
		t.Errorf("got %d 429s (%d accepted) in 10 s at 50/s against 10/s after 60 s at 10/s; want at most %d (%d without the 60 s)", thr, ok, 5*thr0, thr0)
	}
}

// TestLimiterLevelStaysFinite: the same growth, longer. A client holding
// 10/s that asks 10/s for 50 minutes, all accepted, ends with a level of
// a finite level (it reached +Inf when steps past twice the demand were
// kept: 1.64x per 2 s overflows float64 in ~48 min; no cut lowered it, and
// after 1075 throttles in a row the run's halving 0.5^1075 underflowed to 0
// and +Inf x 0 made the level NaN, and every acquire failed with
// ErrRateLimited, even without a deadline).
// TestLimiterRampKeptAsFarAsTested: held at 100/s, cut deep to 5/s (see
// cutDeep). A ramp back is kept up to the rate the demand could test
// (twice the demand), measured when the ramp ended, and not at all when a
// pause kept it from being sent (a break-it pass's cases). The demand
// meter of asks every 1/45 s reads a little over 45/s just after an ask.
func TestLimiterRampKeptAsFarAsTested(t *testing.T) {
	reach := rampWait + time.Duration(0.3*math.Log(20)*second)
	for _, tc := range []struct {
		name      string
		run       func(l *RateLimiter)
		want, tol float64
	}{
		{"demand below half the rate remembered: up to twice the demand", func(l *RateLimiter) {
			askAt(l, 45, 30*time.Second)
		}, 90, 0.02},
		{"the demand stops as the ramp ends, and the next call comes 5 s later", func(l *RateLimiter) {
			askAt(l, 100, reach+blame-20*time.Millisecond)
			time.Sleep(5 * time.Second)
		}, 100, 0},
		{"asked for through a pause, nothing sent", func(l *RateLimiter) {
			l.mu.Lock()
			l.pause = time.Now().Add(30 * time.Second)
			l.mu.Unlock()
			askAt(l, 100, reach+blame+50*time.Millisecond)
		}, 5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := &RateLimiter{}
				cutDeep(t, l, 100, 5, 5)
				tc.run(l)
				l.mu.Lock()
				l.advance(time.Now())
				l.mu.Unlock()
				if s := peek(l); math.Abs(s.level-tc.want) > tc.tol*tc.want {
					t.Errorf("got level %v (%d failed ramps); want %v (within %v%%)", s.level, s.ramps, tc.want, 100*tc.tol)
				}
			})
		})
	}
}

// TestLimiterFailedProbeStartsNoRamp: holding 72/s with 100/s remembered
// (not far below it), a probe that draws a throttle takes 3% back, but not
// below 70 (farRatio of 100): a step that found no room is not a fall to
// ramp back from.
func TestLimiterFailedProbeStartsNoRamp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		holdAt(l, 72, 9*time.Second)
		l.mu.Lock()
		l.high, l.highAt = 100, time.Now()
		l.cutAt = time.Now().Add(-3 * time.Second)
		l.mu.Unlock()
		driver{t, l}.answer(permit{l: l, epoch: 1}, 429)
		l.mu.Lock()
		far, r := l.far(), l.scheduled(time.Now().Add(3*time.Second))
		l.mu.Unlock()
		if s := peek(l); s.level != 70 || far || r != 70 {
			t.Errorf("got level %v, far %v, rate 3 s later %v; want 70, false, 70", s.level, far, r)
		}
	})
}

// TestLimiterTinyMinRate: a run of 60 throttles takes a level of 100/s to
// 1e-16/s with MinRate 1e-300; the interval between permits stays positive
// (it overflowed a Duration below about 1e-10/s).
func TestLimiterTinyMinRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{MinRate: 1e-300}
		holdAt(l, 100, time.Hour)
		d := driver{t, l}
		for range 59 {
			d.answer(permit{l: l, epoch: 0}, 429)
		}
		d.answer(permit{l: l, epoch: 1}, 429)
		l.mu.Lock()
		lv, gap, next := l.level, l.gap, l.next
		l.mu.Unlock()
		if gap <= 0 || !next.After(time.Now()) {
			t.Errorf("level %v: got gap %v, next permit in %v; want both positive", lv, gap, next.Sub(time.Now()))
		}
	})
}

func TestLimiterLevelStaysFinite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		holdAt(l, 10, 2*time.Second)
		l.mu.Lock()
		l.change, l.top = time.Now(), 10 // throttled at 10/s just before
		l.mu.Unlock()
		d := driver{t, l}
		for end := time.Now().Add(50 * time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			d.answer(d.take(), 200)
		}
		level := func() float64 {
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.level
		}
		if lv := level(); math.IsInf(lv, 0) || math.IsNaN(lv) {
			t.Errorf("got a level of %v after 50 min at 10/s, all accepted; want a finite rate", lv)
		}
		// Now the server refuses everything for 10 minutes.
		sent := 0
		for end := time.Now().Add(10 * time.Minute); time.Now().Before(end); {
			var p permit
			if err := l.acquire(context.Background(), &p); err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			time.Sleep(10 * time.Millisecond)
			d.answer(p, http.StatusTooManyRequests)
			sent++
		}
		if lv := level(); math.IsNaN(lv) || lv > 1 {
			t.Errorf("got a level of %v after 10 min (%d attempts sent), every attempt throttled; want MinRate's order (at most 1/s)", lv, sent)
		}
		time.Sleep(time.Hour)
		var p permit
		if err := l.acquire(context.Background(), &p); err != nil {
			t.Errorf("an hour later, no deadline: got %v (level %v); want a permit", err, level())
		}
	})
}

// TestLimiterRefusesAPermitOneIntervalAway: held at 10/s for 10 s, then a
// run of 6 throttles: the level is 10/32 x 0.8 = 0.25/s, and 10/s is
// remembered. A request with no deadline asking right after the cut gets
// the next permit 4 s away, one interval of the rate: not "behind a queue
// of 20 permits" (it was refused when the queue was measured at the rate
// of the permit's own time, when the ramp back is at 10/s: 4 s x 10/s =
// 40 permits; waiting, the permit even comes sooner, as due shortens with
// the ramp).
func TestLimiterRefusesAPermitOneIntervalAway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		cutDeep(t, l, 10, 6, 0.25)
		start := time.Now()
		var p permit
		err := l.acquire(context.Background(), &p)
		if err != nil {
			t.Fatalf("a request with no deadline, asking at once after the cut: got %v; want a permit within 4 s (one interval of 0.25/s)", err)
		}
		if got := time.Since(start); got > 4*time.Second {
			t.Errorf("permit after %v; want at most 4s", got)
		}
	})
}

// TestLimiterStaleStartSetsNoTop: one send, an hour idle, 30 sends at
// 20/s and a 429: the start is stale, and its one cut's rate is the hour's
// average, 0.0089/s, not the rate the throttle came at (~20/s): it is not
// top. When the start ends top is the demand then, and the steps below it
// are a fiftieth of the demand, as without the idle hour (with top the
// idle average they doubled from the second on, and 20 s after the
// throttle the rate was twice the demand, ~39/s).
func TestLimiterStaleStartSetsNoTop(t *testing.T) {
	run := func(idle time.Duration) (level, steps, rate, top float64) {
		synctest.Test(t, func(t *testing.T) {
			l := &RateLimiter{}
			sendsThenThrottle(driver{t, l}, idle, 30, 50*time.Millisecond)
			var wg sync.WaitGroup
			wg.Go(func() { askEvery(t, l, 50*time.Millisecond, 20*time.Second, time.Second) }) // 20/s, all accepted
			time.Sleep(9*time.Second + 25*time.Millisecond)
			l.mu.Lock()
			now := time.Now()
			level, top = l.level, l.top
			steps = l.step / (probeStep * max(l.demand.rate(now), l.level)) // fiftieths of the demand
			l.mu.Unlock()
			wg.Wait()
			rate = l.Rate()
		})
		return level, steps, rate, top
	}
	_, busySteps, busyRate, busyTop := run(50 * time.Millisecond)
	level, steps, rate, top := run(time.Hour)
	if level >= 20 {
		t.Fatalf("level %v/s 9 s after the throttle; want it below the 20/s sent then, for the test to mean anything", level)
	}
	if steps > 1.5 {
		t.Errorf("9 s after a throttle at ~20/s (after an idle hour), at %.2f/s: got a step of %.2f fiftieths of the demand; want 1, as without the idle hour (%.2f): below the rate the throttle came at, steps do not double (top is %.4g/s, the hour's average; %.4g/s without it)", level, steps, busySteps, top, busyTop)
	}
	if rate > 20 {
		t.Errorf("20 s after the throttle, every attempt since accepted at 20/s: got a rate of %.2f/s; want at most 20/s (%.2f/s without the idle hour)", rate, busyRate)
	}
}

// A retry waits for its permit through a pause another request's 429 set
// on a shared limiter, and is canceled: its tokens go back exactly once,
// its fresh body is closed, and nothing else is sent.
func TestCanceledInAPauseRefundsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		holdAt(lim, 10, time.Hour) // a permit every 100ms
		led := newLedger(t)
		base := rht.NewTransport(rht.Status(503).WithDelay(150*time.Millisecond), rht.Status(200))
		tr := &Transport{Base: base, Limiter: lim, Budget: led, Policy: Policy{Rand: lowRand}}
		// The pause: another Transport's 429 with Retry-After: 2, at 100ms.
		other := &Transport{Base: rht.NewTransport(rht.RetryAfter(429, "2")), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		var closes atomic.Int32
		req := newReq(t, "PUT", "x")
		req.GetBody = func() (io.ReadCloser, error) {
			return &countClose{Reader: strings.NewReader("x"), n: &closes}, nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var err error
		wg.Go(func() { _, err = tr.RoundTrip(req.WithContext(ctx)) }) // sent at 0, 503 at 150ms
		synctest.Wait()
		roundTrip(t, other, newReq(t, "GET", "")) // sent at 100ms: 429, pause to 2.1s
		time.Sleep(time.Second)                   // the retry waits for the pause's end
		cancel()
		wg.Wait()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v; want canceled", err)
		}
		led.check(t)
		if n := led.unsettled(); n != 0 {
			t.Errorf("got %d Tokens never settled; want 0", n)
		}
		if n := closes.Load(); n != 1 {
			t.Errorf("the retry's fresh body was closed %d times; want 1", n)
		}
		rht.AssertAttempts(t, base, 1)
	})
}

// The pause a throttle's delay sets on the limiter, for odd headers: none
// for a negative number, a date in the past, 0 or a fraction;
// x-amz-retry-after in milliseconds; a huge number clamped to
// MaxServerDelay (by default MaxDelay).
func TestLimiterPauseForOddRetryAfters(t *testing.T) {
	for _, tc := range []struct {
		name, header, value string
		want                time.Duration
	}{
		{"negative", "Retry-After", "-1", 0},
		{"date in the past", "Retry-After", "Sun, 06 Nov 1994 08:49:37 GMT", 0},
		{"zero", "Retry-After", "0", 0},
		{"fraction", "Retry-After", "1.5", 0},
		{"x-amz", "X-Amz-Retry-After", "1500", 1500 * time.Millisecond},
		{"huge", "Retry-After", "99999999999999999999", defaultMaxDelay},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := &RateLimiter{}
				holdAt(l, 100, time.Hour)
				driver{t, l}.answer(permit{l: l, epoch: 1}, 429, tc.header, tc.value)
				l.mu.Lock()
				got := l.pause.Sub(time.Now())
				if l.pause.IsZero() {
					got = 0
				}
				l.mu.Unlock()
				if got != tc.want {
					t.Errorf("got a pause of %v; want %v", got, tc.want)
				}
			})
		})
	}
}

// stepsFrom runs a limiter held at level, with top, asked for at 100/s,
// keeping one step every 2 s, and reports each step in fiftieths of the
// demand and the level it follows. The last cut was 10 s before, or, with
// cutEach, is made again (its time only) before each step, which is then
// never quiet.
func stepsFrom(t *testing.T, l *RateLimiter, level, top float64, keeps int, cutEach bool) (steps, levels []float64) {
	holdAt(l, level, 2*time.Second)
	ask := func(d time.Duration) { askAt(l, 100, d) }
	ask(time.Second)
	l.mu.Lock()
	l.change, l.top = time.Now(), top
	l.step = l.probeStep(time.Now())
	l.mu.Unlock()
	ask(blame)
	for range keeps {
		if cutEach {
			l.mu.Lock()
			l.cutAt = time.Now()
			l.mu.Unlock()
		}
		ask(2 * time.Second)
		now := time.Now()
		l.mu.Lock()
		l.advance(now)
		steps = append(steps, math.Round(l.step/(probeStep*max(l.demand.rate(now), l.level))))
		levels = append(levels, l.level)
		l.mu.Unlock()
	}
	return steps, levels
}

// Quiet steps double the next only while the demand is three times the
// level or more: once they have lifted the level past a third of the demand
// (still below top), the step keeps the size it reached, until a cut.
func TestLimiterQuietDoublingStopsNearTheDemand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		steps, levels := stepsFrom(t, l, 10, 1000, 7, false)
		// Levels 11, 13, 17, 25, then 41 and on: past a third of 100/s.
		if want := []float64{1, 2, 4, 8, 8, 8, 8}; !reflect.DeepEqual(steps, want) {
			t.Errorf("got steps of %v fiftieths of the demand at levels %v; want %v", steps, levels, want)
		}
	})
}

// A 429 with Retry-After: 10 cuts a limiter held at 30/s (asked for at
// 100/s; its last cut 3 s before, so no rate is remembered to ramp back to)
// below the rate that drew it (top), and pauses it for 10 s; nothing is
// sent during the pause, so no throttle can come. Quiet is measured from
// the pause's end: no step kept within 4 s of sending again counts toward
// doubling (they did, measured from the cut).
func TestLimiterPauseIsNotQuiet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &RateLimiter{}
		holdAt(l, 30, 2*time.Second)
		askAt(l, 100, time.Second)
		l.mu.Lock()
		l.change, l.cutAt = time.Now(), time.Now().Add(-3*time.Second)
		l.mu.Unlock()
		d := driver{t, l}
		d.answer(permit{l: l, epoch: l.epoch}, 429, "Retry-After", "10")
		l.mu.Lock()
		pauseEnd := l.pause
		cut := l.cutAt
		t.Logf("after the cut: level %.2f, top %.2f, high %.2f", l.level, l.top, l.high)
		l.mu.Unlock()
		if pauseEnd.Sub(cut) != 10*time.Second {
			t.Fatalf("pause of %v; want 10s", pauseEnd.Sub(cut))
		}
		// Callers keep asking at 100/s, through the pause and after it.
		for time.Now().Before(pauseEnd.Add(8 * time.Second)) {
			askAt(l, 100, 100*time.Millisecond)
			now := time.Now()
			l.mu.Lock()
			before, lv := l.above, l.level
			l.advance(now)
			if l.level != lv {
				t.Logf("kept at %v after the pause's end: level %.2f, above %d, next step %.0f fiftieths of the demand",
					l.change.Sub(pauseEnd), l.level, l.above, math.Round(l.step/(probeStep*max(l.demand.rate(now), l.level))))
			}
			if l.above > before && l.change.Before(pauseEnd.Add(4*time.Second)) {
				t.Errorf("a step kept %v after the pause's end counted toward doubling (above %d); want none within 4 s of sending again", l.change.Sub(pauseEnd), l.above)
			}
			l.mu.Unlock()
		}
	})
}

// A Retry-After that no retry could wait out is not honoured by the
// Transport (StopServerDelay), even under MaxServerDelay: math.MaxInt64, and
// does not pause the Limiter either: each paused it for about 292 years.
// The longest wait there is, a number too large for a Duration
// (parseRetryAfter), and two that hold but whose spread of up to a tenth
// more overflows a Duration (highRand makes the overflow certain).
func TestLimiterIgnoresARetryAfterNoRetryCouldWait(t *testing.T) {
	for _, ra := range []string{"99999999999999999999", "9223372036", "9000000000"} {
		t.Run(ra, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim := &RateLimiter{}
				pol := Policy{MaxServerDelay: math.MaxInt64, MaxAttempts: 2, Rand: highRand}
				var rep Report
				tr := &Transport{Base: rht.NewTransport(rht.RetryAfter(429, ra)), Limiter: lim, Policy: pol}
				req := newReq(t, "GET", "")
				req = req.WithContext(WithReport(req.Context(), &rep))
				code, _, err := roundTrip(t, tr, req)
				if code != 429 || err != nil || rep.Decision != StopServerDelay {
					t.Fatalf("got (%d, %v, %v); want the 429 back, StopServerDelay", code, err, rep.Decision)
				}
				time.Sleep(time.Hour)
				ok := &Transport{Base: rht.NewTransport(rht.Status(200)), Limiter: lim, Policy: pol}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if _, _, err := roundTrip(t, ok, newReq(t, "GET", "").WithContext(ctx)); err != nil {
					lim.mu.Lock()
					p := lim.pause.Sub(time.Now())
					lim.mu.Unlock()
					t.Errorf("an hour later: got %v (the Limiter paused for another %v); want a 200: the Transport did not honour that Retry-After", err, p)
				}
			})
		})
	}
}

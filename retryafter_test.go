package retryhttp

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		header http.Header
		want   time.Duration
		ok     bool
	}{
		{"none", http.Header{}, 0, false},
		{"seconds", http.Header{"Retry-After": {"120"}}, 120 * time.Second, true},
		{"zero", http.Header{"Retry-After": {"0"}}, 0, true},
		{"surrounding spaces", http.Header{"Retry-After": {" 120 "}}, 120 * time.Second, true},
		{"negative", http.Header{"Retry-After": {"-5"}}, 0, false},
		{"plus sign", http.Header{"Retry-After": {"+5"}}, 0, false},
		{"empty", http.Header{"Retry-After": {""}}, 0, false},
		{"fraction", http.Header{"Retry-After": {"0.493"}}, 0, false},
		{"Go duration", http.Header{"Retry-After": {"1m0s"}}, 0, false},
		{"two equal values", http.Header{"Retry-After": {"3", "3"}}, 3 * time.Second, true},
		{"two different values", http.Header{"Retry-After": {"3", "4"}}, 0, false},
		{"huge: saturates", http.Header{"Retry-After": {"99999999999"}}, math.MaxInt64, true},
		{"30 digits: saturates", http.Header{"Retry-After": {"123456789012345678901234567890"}}, math.MaxInt64, true},
		{"IMF-fixdate", http.Header{"Retry-After": {"Sun, 29 Nov 2026 12:00:30 GMT"}}, 30 * time.Second, true},
		{"RFC 850 date", http.Header{"Retry-After": {"Sunday, 29-Nov-26 12:01:00 GMT"}}, time.Minute, true},
		{"asctime date", http.Header{"Retry-After": {"Sun Nov 29 12:00:05 2026"}}, 5 * time.Second, true},
		// RFC 9110 §5.6.7: a two-digit year is this century's unless that
		// is more than 50 years ahead (time.Parse reads 69 to 99 as 19xx).
		{"RFC 850 date 44 years ahead", http.Header{"Retry-After": {"Sunday, 01-Jan-70 00:00:00 GMT"}}, time.Date(2070, 1, 1, 0, 0, 0, 0, time.UTC).Sub(now), true},
		{"RFC 850 date 51 years ahead: the past", http.Header{"Retry-After": {"Monday, 01-Jan-77 00:00:00 GMT"}}, 0, true},
		{"past date", http.Header{"Retry-After": {"Sun, 29 Nov 2026 11:00:00 GMT"}}, 0, true},
		{"ten years ahead", http.Header{"Retry-After": {"Fri, 29 Nov 2036 12:00:00 GMT"}}, now.AddDate(10, 0, 0).Sub(now), true},
		{"malformed date", http.Header{"Retry-After": {"Sun, 32 Nov 2026 12:00:00 GMT"}}, 0, false},
		{"x-amz-retry-after ms", http.Header{"X-Amz-Retry-After": {"1500"}}, 1500 * time.Millisecond, true},
		{"retry-after-ms", http.Header{"Retry-After-Ms": {"250"}}, 250 * time.Millisecond, true},
		{"ms header wins", http.Header{"X-Amz-Retry-After": {"1500"}, "Retry-After": {"9"}}, 1500 * time.Millisecond, true},
		{"invalid ms header falls through", http.Header{"X-Amz-Retry-After": {"1.5"}, "Retry-After": {"9"}}, 9 * time.Second, true},
		{"negative ms", http.Header{"Retry-After-Ms": {"-1"}}, 0, false},
		{"huge ms: saturates", http.Header{"X-Amz-Retry-After": {"99999999999999999999"}}, math.MaxInt64, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseRetryAfter(tc.header, now)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got (%v, %v); want (%v, %v)", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// Bad input from servers: every odd delay header, through the Transport.
// None may panic, hang, or wait longer than the policy allows.
func TestBadServerDelays(t *testing.T) {
	const (
		seconds = "Retry-After"
		amz     = "X-Amz-Retry-After"
		ms      = "Retry-After-Ms"
	)
	// Fake time in a synctest bubble starts at 2000-01-01 00:00:00 UTC.
	start := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	type want struct {
		attempts   int           // 1: returned at once; 2: retried
		low, high  time.Duration // the wait, lowRand and highRand
		fromServer bool
	}
	backoff := want{2, 0, 50 * time.Millisecond, false}
	refused := want{1, 0, 0, true}
	values := []struct {
		name   string
		values []string
		byName map[string]want // default: backoff
	}{
		{"negative", []string{"-5"}, nil},
		{"empty", []string{""}, nil},
		{"Go duration", []string{"1m0s"}, nil},
		{"fraction", []string{"0.493"}, nil},
		{"spaces around", []string{" 120 "}, map[string]want{
			seconds: refused,                                                   // 120s > MaxDelay
			amz:     {2, 120 * time.Millisecond, 170 * time.Millisecond, true}, // spread: BaseDelay, above 10%
			ms:      {2, 120 * time.Millisecond, 170 * time.Millisecond, true},
		}},
		{"two different", []string{"3", "4"}, nil},
		{"two equal", []string{"3", "3"}, map[string]want{
			seconds: {2, 3 * time.Second, 3300 * time.Millisecond, true},
			amz:     {2, 3 * time.Millisecond, 53 * time.Millisecond, true},
			ms:      {2, 3 * time.Millisecond, 53 * time.Millisecond, true},
		}},
		{"eleven digits", []string{"99999999999"}, map[string]want{seconds: refused, amz: refused, ms: refused}},
		{"thirty digits", []string{strings.Repeat("1234567890", 3)}, map[string]want{seconds: refused, amz: refused, ms: refused}},
		{"past date", []string{start.Add(-time.Hour).Format(http.TimeFormat)}, map[string]want{seconds: {2, 0, 50 * time.Millisecond, true}}},
		{"date 10 years ahead", []string{start.AddDate(10, 0, 0).Format(http.TimeFormat)}, map[string]want{seconds: refused}},
		{"IMF-fixdate", []string{"Sat, 01 Jan 2000 00:00:05 GMT"}, map[string]want{seconds: {2, 5 * time.Second, 5500 * time.Millisecond, true}}},
		{"RFC 850 date", []string{"Saturday, 01-Jan-00 00:00:05 GMT"}, map[string]want{seconds: {2, 5 * time.Second, 5500 * time.Millisecond, true}}},
		{"asctime date", []string{"Sat Jan  1 00:00:05 2000"}, map[string]want{seconds: {2, 5 * time.Second, 5500 * time.Millisecond, true}}},
		{"malformed date", []string{"Sat, 01 Jan 2000 25:61:00 GMT"}, nil},
	}
	for _, header := range []string{seconds, amz, ms} {
		for _, v := range values {
			w, ok := v.byName[header]
			if !ok {
				w = backoff
			}
			for _, end := range []struct {
				name string
				rnd  func(int64) int64
				wait time.Duration
			}{{"low", lowRand, w.low}, {"high", highRand, w.high}} {
				t.Run(header+"/"+v.name+"/"+end.name, func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						if !time.Now().Equal(start) {
							t.Fatalf("the bubble starts at %v; want %v", time.Now(), start)
						}
						step := rht.Status(503)
						step.Header = http.Header{header: v.values}
						base := rht.NewTransport(step, rht.Status(200))
						var hooks []Attempt
						tr := &Transport{Base: base, Policy: Policy{Rand: end.rnd}, OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
						_, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
						if err != nil {
							t.Fatalf("got %v; want a response", err)
						}
						if !rht.AssertAttempts(t, base, w.attempts) {
							return
						}
						if w.attempts == 2 {
							if gap := rht.Gaps(base)[0]; gap != end.wait {
								t.Errorf("got wait %v; want %v", gap, end.wait)
							}
						}
						if got := hooks[0].ServerDelay; got != w.fromServer {
							t.Errorf("got delay from server %v; want %v", got, w.fromServer)
						}
						if w.attempts == 1 && hooks[0].Decision != StopServerDelay {
							t.Errorf("got decision %v; want %v", hooks[0].Decision, StopServerDelay)
						}
					})
				})
			}
		}
	}
}

// RFC 9110 §5.6.7: an RFC 850 date's two-digit year is the latest with
// those digits that is not more than 50 years after now, measured as
// instants: across a century change, and at the 50-year edge.
func TestParseRetryAfterRFC850Years(t *testing.T) {
	tests := []struct {
		name  string
		now   time.Time
		value string
		want  time.Duration
	}{
		{"20 s ahead, across 2100", time.Date(2099, 12, 31, 23, 59, 50, 0, time.UTC),
			"Friday, 01-Jan-00 00:00:10 GMT", 20 * time.Second},
		{"the same in IMF-fixdate (control)", time.Date(2099, 12, 31, 23, 59, 50, 0, time.UTC),
			"Fri, 01 Jan 2100 00:00:10 GMT", 20 * time.Second},
		{"50 years and 11 months ahead is in the past", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
			"Thursday, 31-Dec-76 00:00:00 GMT", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{"Retry-After": {tt.value}}
			got, ok := parseRetryAfter(h, tt.now)
			if !ok || got != tt.want {
				t.Errorf("parseRetryAfter(%q) at %v = %v, %v; want %v, true", tt.value, tt.now, got, ok, tt.want)
			}
		})
	}
}

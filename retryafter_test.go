package retryhttp

import (
	"math"
	"net/http"
	"testing"
	"time"
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
			got, ok := ParseRetryAfter(tc.header, now)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got (%v, %v); want (%v, %v)", got, ok, tc.want, tc.ok)
			}
		})
	}
}

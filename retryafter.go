package retryhttp

import (
	"math"
	"net/http"
	"strings"
	"time"
)

// Headers by which a server asks for a delay before the next attempt, in
// the order they are read. The millisecond forms are more precise, so they
// win when they hold a valid value.
const (
	headerAmzRetryAfter = "X-Amz-Retry-After" // milliseconds, sent by AWS services
	headerRetryAfterMs  = "Retry-After-Ms"    // milliseconds, sent by some Azure and OpenAI APIs
	headerRetryAfter    = "Retry-After"       // RFC 9110 §10.2.3: delay-seconds or an HTTP-date
)

// parseRetryAfter returns the delay a response's headers ask for before the
// next attempt, and whether they ask for one.
//
// It reads x-amz-retry-after and retry-after-ms, in milliseconds, then
// Retry-After (RFC 9110 §10.2.3), in seconds or as an HTTP-date. It returns
// the first valid one. A date is measured from now. A date in the past asks
// for no wait (0, true). A header present twice with different values is
// invalid, and so is anything else: a sign, a fraction, a unit, a malformed
// date. A number too large for a time.Duration asks for the longest wait
// there is. No Policy honours it, so the response goes back to the caller.
//
// The returned duration is never negative.
func parseRetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if d, ok := parseDelay(h[headerAmzRetryAfter], time.Millisecond); ok {
		return d, true
	}
	if d, ok := parseDelay(h[headerRetryAfterMs], time.Millisecond); ok {
		return d, true
	}
	vs := h[headerRetryAfter]
	if d, ok := parseDelay(vs, time.Second); ok {
		return d, true
	}
	v, ok := single(vs)
	if !ok {
		return 0, false
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if _, err := time.Parse(time.RFC850, v); err == nil {
		t = rfc850Year(t, now)
	}
	if d := t.Sub(now); d > 0 {
		return d, true
	}
	return 0, true
}

// rfc850Year reads the two-digit year of an RFC 850 date t as RFC 9110
// §5.6.7 requires. It is the latest year with those last two digits that is
// not more than 50 years after now. time.Parse puts it in 1969 to 2068.
func rfc850Year(t, now time.Time) time.Time {
	limit := now.AddDate(50, 0, 0)
	in := func(y int) time.Time {
		return time.Date(y, t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), t.Location())
	}
	d := in(now.Year() - now.Year()%100 + t.Year()%100 + 100) // the next century's
	for d.After(limit) {
		d = in(d.Year() - 100)
	}
	return d
}

// single returns the one value of a header, trimmed of surrounding spaces;
// repeated identical values count as one.
func single(vs []string) (string, bool) {
	if len(vs) == 0 {
		return "", false
	}
	v := strings.Trim(vs[0], " \t")
	for _, o := range vs[1:] {
		if strings.Trim(o, " \t") != v {
			return "", false
		}
	}
	return v, v != ""
}

// parseDelay reads a header value of decimal digits only, in the given unit.
func parseDelay(vs []string, unit time.Duration) (time.Duration, bool) {
	v, ok := single(vs)
	if !ok {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n > (math.MaxInt64-int64(c-'0'))/10 {
			n = math.MaxInt64 // keep checking the syntax; the value saturates
			continue
		}
		if n != math.MaxInt64 {
			n = n*10 + int64(c-'0')
		}
	}
	if n > int64(math.MaxInt64/unit) {
		return math.MaxInt64, true
	}
	return time.Duration(n) * unit, true
}

// serverSpread is how much later than a server's delay sd a retry may
// come. Up to 10% more than asked spreads clients told the same number. At
// least BaseDelay spreads a crowd told "Retry-After: 0".
func (p *Policy) serverSpread(sd time.Duration) time.Duration {
	return max(sd/10, p.baseDelay(Transient))
}

// serverPause is how long a response's delay d holds or pauses a
// RateLimiter: d within MaxServerDelay. A delay whose spread would overflow
// a Duration holds nothing: no retry could wait it out.
func serverPause(p *Policy, d time.Duration) time.Duration {
	d = min(d, p.maxServerDelay())
	if d+p.serverSpread(d) < d {
		return 0
	}
	return d
}

// serverDelay is the delay the response asks for, unless the Policy ignores
// server-requested delays.
func serverDelay(p *Policy, resp *http.Response, now time.Time) (time.Duration, bool) {
	if resp == nil || p.MaxServerDelay < 0 {
		return 0, false
	}
	return parseRetryAfter(resp.Header, now)
}

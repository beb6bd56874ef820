// Package bench measures retryhttp side by side with the libraries users
// would pick instead, in one process: go-retryablehttp, failsafe-go's
// failsafehttp, and the AWS SDK for Go v2's standard retryer. It is a module
// of its own so that the root module keeps its three dependencies. Run
// ./run.sh to regenerate docs/benchmarks.md.
package bench

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/herdproof/retryhttp"
)

// Impl is one retry layer under test: New wraps a base RoundTripper. With
// zeroWait set, it is configured to wait nothing between attempts (to
// measure bookkeeping, not sleeping) and otherwise left at its defaults.
type Impl struct {
	Name string
	New  func(base http.RoundTripper, zeroWait bool) http.RoundTripper
}

// Impls are the implementations compared, the bare base first.
var Impls = []Impl{
	{"base", func(base http.RoundTripper, _ bool) http.RoundTripper { return base }},
	{"retryhttp", newRetryHTTP},
	{"retryablehttp", func(b http.RoundTripper, z bool) http.RoundTripper { return newRetryablehttp(b, z, false) }},
	{"retryablehttp+log", func(b http.RoundTripper, z bool) http.RoundTripper { return newRetryablehttp(b, z, true) }},
	{"failsafehttp", newFailsafe},
	{"awsretry", newAWS},
}

func newRetryHTTP(base http.RoundTripper, zeroWait bool) http.RoundTripper {
	tr := &retryhttp.Transport{Base: base}
	if zeroWait {
		tr.Policy.Rand = func(int64) int64 { return 0 } // full jitter at its floor: no wait
	}
	return tr
}

// newRetryablehttp configures go-retryablehttp as its README does: NewClient,
// the base as its HTTPClient's transport, its RoundTripper. Its default
// logger writes a line per request to stderr; withLog keeps that logger's
// formatting but sends the lines to io.Discard, so the benchmark output stays
// readable while the cost is paid.
func newRetryablehttp(base http.RoundTripper, zeroWait, withLog bool) http.RoundTripper {
	c := retryablehttp.NewClient()
	c.HTTPClient.Transport = base
	c.Logger = nil
	if withLog {
		c.Logger = log.New(io.Discard, "", log.LstdFlags)
	}
	if zeroWait {
		c.RetryWaitMin, c.RetryWaitMax = 0, 0
	}
	return &retryablehttp.RoundTripper{Client: c}
}

// newFailsafe is failsafehttp's documented setup: its RetryPolicyBuilder
// (2 retries, Retry-After aware) around the base. It waits nothing between
// attempts by default, so zeroWait changes nothing.
func newFailsafe(base http.RoundTripper, _ bool) http.RoundTripper {
	return failsafehttp.NewRoundTripper(base, failsafehttp.NewRetryPolicyBuilder().Build())
}

// awsTransport drives an AWS SDK for Go v2 retryer the way its retry
// middleware does (aws/retry/middleware.go, handleAttempt): an attempt token
// before each attempt, released with the attempt's error together with the
// retry token; IsErrorRetryable, MaxAttempts, GetRetryToken for the quota,
// RetryDelay and a sleep. The SDK turns an HTTP status into an error in its
// deserializers; here a 429 or 5xx becomes a statusError carrying the
// status code, which the retryer's default checks read. Discarded responses
// are drained and closed, as the SDK's deserializers do. It measures the
// standard mode's cost per request; the throttling comparisons drive the
// adaptive mode through a real client instead (AWSAdaptivePeer), whose
// attempt tokens wait as the SDK's own do.
type awsTransport struct {
	base    http.RoundTripper
	retryer aws.RetryerV2
}

func nopRelease(error) error { return nil }

// token is the attempt token taken before attempt n (from 1): the
// retryer's for the first attempt, and for later ones the no-op the
// middleware gets from its retry metadata, which exists only inside the
// SDK's stack.
func (t *awsTransport) token(ctx context.Context, n int) (func(error) error, error) {
	if n == 1 {
		return t.retryer.GetAttemptToken(ctx)
	}
	return nopRelease, nil
}

func newAWS(base http.RoundTripper, zeroWait bool) http.RoundTripper {
	r := retry.NewStandard(func(o *retry.StandardOptions) {
		if zeroWait {
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		}
	})
	return &awsTransport{base: base, retryer: r}
}

type statusError struct{ code int }

func (e *statusError) Error() string       { return "http status " + strconv.Itoa(e.code) }
func (e *statusError) HTTPStatusCode() int { return e.code }
func (e *statusError) ErrorCode() string {
	if e.code == http.StatusTooManyRequests {
		return "Throttling"
	}
	return ""
}

func (t *awsTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	releaseRetry := nopRelease
	for attempt := 1; ; attempt++ {
		release, err := t.token(ctx, attempt)
		if err != nil {
			return nil, err
		}
		r := req
		if attempt > 1 && req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			r = req.Clone(ctx)
			r.Body = body
		}
		resp, err := t.base.RoundTrip(r)
		opErr := err
		if err == nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500) {
			opErr = &statusError{resp.StatusCode}
		}
		releaseRetry(opErr)
		release(opErr)
		if opErr == nil {
			return resp, nil
		}
		done := func() (*http.Response, error) {
			if resp != nil {
				return resp, nil
			}
			return nil, err
		}
		if !t.retryer.IsErrorRetryable(opErr) || attempt >= t.retryer.MaxAttempts() {
			return done()
		}
		rel, qerr := t.retryer.GetRetryToken(ctx, opErr)
		if qerr != nil {
			return done()
		}
		releaseRetry = rel
		delay, derr := t.retryer.RetryDelay(attempt, opErr)
		if derr != nil {
			return done()
		}
		if resp != nil {
			io.CopyN(io.Discard, resp.Body, 4096)
			resp.Body.Close()
		}
		if delay > 0 {
			timer := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				timer.Stop()
				return nil, errors.Join(ctx.Err(), err)
			case <-timer.C:
			}
		}
	}
}

package bench

import (
	"context"
	"io"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/herdproof/retryhttp"
)

// Names of the matrix's default peers.
const (
	PeerNone      = "none"
	PeerAWS       = "aws-adaptive"
	PeerFailsafe  = "failsafe-throttler"
	PeerRetryHTTP = "retryhttp"
)

// ClientEnv is what the matrix gives a peer to make one client with.
type ClientEnv struct {
	// Base is the server, called in memory: the client's transport.
	Base http.RoundTripper
	// URL is the server's address.
	URL string
	// Rand is a seeded source of uniform integers in [0, n), safe for
	// concurrent use, for a library that takes one for its jitter (a
	// retryhttp Policy.Rand), so that a run repeats.
	Rand func(n int64) int64
}

// ThrottlePeer is one implementation in the throttling matrix.
type ThrottlePeer struct {
	Name string
	// NewClient makes one client (each client of a workload gets its
	// own, as each process of a fleet has its own) and returns its call:
	// one request through the client with ctx, reporting whether it got
	// a success.
	NewClient func(env ClientEnv) func(ctx context.Context) bool
}

// DefaultThrottlePeers are the peers of the matrix, in its tables' order:
// no limiter (retryhttp's Transport without one), the AWS SDK's adaptive
// mode through a real client, failsafe-go's adaptive throttler, and
// retryhttp with its default RateLimiter.
func DefaultThrottlePeers() []ThrottlePeer {
	return []ThrottlePeer{
		RetryHTTPPeer(PeerNone, nil),
		AWSAdaptivePeer(),
		TransportPeer(PeerFailsafe, func(base http.RoundTripper) http.RoundTripper {
			return newFailsafeThrottler(base, ThrottleConfig{})
		}),
		RetryHTTPPeer(PeerRetryHTTP, func() *retryhttp.RateLimiter { return &retryhttp.RateLimiter{} }),
	}
}

// RetryHTTPPeer is this library's Transport with the zero Policy (but for
// Policy.Rand, seeded so that a run repeats) and the default Budget, with a
// RateLimiter from newLimiter per client; nil newLimiter means no limiter.
// Plug a variant in with, for example:
//
//	bench.RetryHTTPPeer("maxwait-250ms", func() *retryhttp.RateLimiter {
//		return &retryhttp.RateLimiter{MaxWait: 250 * time.Millisecond}
//	})
func RetryHTTPPeer(name string, newLimiter func() *retryhttp.RateLimiter) ThrottlePeer {
	return ThrottlePeer{Name: name, NewClient: func(env ClientEnv) func(context.Context) bool {
		tr := &retryhttp.Transport{Base: env.Base, Policy: retryhttp.Policy{Rand: env.Rand}}
		if newLimiter != nil {
			tr.Limiter = newLimiter()
		}
		return roundTripCall(tr, env.URL)
	}}
}

// TransportPeer is a peer that is an http.RoundTripper over the base: each
// call is one GET through it.
func TransportPeer(name string, newTransport func(base http.RoundTripper) http.RoundTripper) ThrottlePeer {
	return ThrottlePeer{Name: name, NewClient: func(env ClientEnv) func(context.Context) bool {
		return roundTripCall(newTransport(env.Base), env.URL)
	}}
}

func roundTripCall(rt http.RoundTripper, url string) func(context.Context) bool {
	return func(ctx context.Context) bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			panic(err)
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode/100 == 2
	}
}

// AWSAdaptivePeer is the AWS SDK for Go v2's adaptive retry mode driven
// through a real client: an STS client (sts.New) with
// retry.NewAdaptiveMode() and its defaults, static credentials, its
// BaseEndpoint at the server and the server as its HTTP client's
// transport. Each call is a GetCallerIdentity: the SDK's whole middleware
// stack runs (serialising, signing, its retry loop, its attempt tokens and
// their waits, deserialising the 429's Throttling error). One difference
// from a real clock remains: see awsclock.go.
func AWSAdaptivePeer() ThrottlePeer {
	return ThrottlePeer{Name: PeerAWS, NewClient: func(env ClientEnv) func(context.Context) bool {
		client := sts.New(sts.Options{
			Region:       "us-east-1",
			BaseEndpoint: aws.String(env.URL),
			Credentials:  credentials.NewStaticCredentialsProvider("AKIDBENCHMARK", "benchmark-secret", ""),
			HTTPClient:   &http.Client{Transport: env.Base},
			Retryer:      retry.NewAdaptiveMode(),
		})
		return func(ctx context.Context) bool {
			_, err := client.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
			return err == nil
		}
	}}
}

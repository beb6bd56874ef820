package retryhttp

import (
	"net"
	"reflect"
)

// This file is the one place where the Transport recognises net/http's
// connection failures that net/http reports without an exported type or
// sentinel. Each is identified by its type's package and name where it has a
// type of its own, and by its exact text only where net/http offers nothing
// else. Every entry has a test that provokes the real error from net/http
// (neterrors_test.go), so a Go release that renames a type or rewords a
// message fails those tests instead of silently turning a retryable failure
// into a permanent one.

// A stream above the LastStreamID of an HTTP/2 graceful-shutdown GOAWAY was
// provably not processed (RFC 9113 §6.8). net/http replays such a stream
// itself on a new connection whenever it can rewind the body, keyless writes
// included; when it cannot (no GetBody), neither can the Transport. What
// reaches the Transport after a GOAWAY is therefore the GoAwayError of a
// stream at or below LastStreamID, which the server may have processed:
// retried for idempotent and keyed requests, not for keyless writes.

// netHTTPMessages are net/http errors made with errors.New, by exact text.
// Each means the connection broke while the request was in flight: the
// server may or may not have processed it, so a write without a key is not
// retried after it.
var netHTTPMessages = map[string]bool{
	// The keep-alive race: the server closed an idle connection just as
	// it was taken for this request (transport.go, errServerClosedIdle).
	// net/http replays it by itself only for GET, HEAD, OPTIONS, TRACE and
	// requests carrying Idempotency-Key or X-Idempotency-Key; the rest
	// reach us. The request may have been written before the close was
	// seen, so it is not proof that nothing was processed.
	"http: server closed idle connection": true,
	// An HTTP/2 connection whose health-check ping went unanswered
	// (HTTP2Config.SendPingTimeout and PingTimeout) is closed under its
	// streams (h2_bundle.go, closeForLostPing).
	"http2: client connection lost": true,
}

// connClosedUnder reports whether err's chain holds one of net/http's
// untyped connection failures, or a connection closed under the request
// (net.ErrClosed).
func connClosedUnder(err error) bool {
	return walkChain(err, func(e error) bool {
		// net.ErrClosed, "use of closed network connection": the
		// connection was closed under the attempt (a pool, an idle
		// timeout, a teardown racing the request). A new connection may
		// well succeed; the AWS SDKs retry it too (aws-sdk-go-v2 issue
		// 2737).
		return netHTTPMessages[e.Error()] || isGoAwayError(e) || e == net.ErrClosed
	})
}

// isGoAwayError reports whether e is an HTTP/2 GoAwayError: the server sent
// GOAWAY and closed the connection with this request's stream still open.
// net/http's type is unexported and golang.org/x/net/http2's cannot be
// imported here, so the type is identified by package and name.
func isGoAwayError(e error) bool {
	t := reflect.TypeOf(e)
	if t == nil {
		return false
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() == reflect.Struct &&
		(t.PkgPath() == "net/http" && t.Name() == "http2GoAwayError" ||
			t.PkgPath() == "golang.org/x/net/http2" && t.Name() == "GoAwayError")
}

// walkChain calls f on err and every error it wraps, depth first, until f
// returns true; it reports whether f did.
func walkChain(err error, f func(error) bool) bool {
	for err != nil {
		if f(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if walkChain(e, f) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// anyTimeout reports whether any error in err's chain reports Timeout() true,
// as os.IsTimeout reads a single error. errors.As would stop at the first
// error with the method, which may wrap the real timeout without saying so
// (a *net.OpError around a wrapped deadline).
func anyTimeout(err error) bool {
	return walkChain(err, func(e error) bool {
		t, ok := e.(interface{ Timeout() bool })
		return ok && t.Timeout()
	})
}

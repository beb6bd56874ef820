package retryhttp

// Status and error classification: what an attempt's outcome means for
// retrying. This file is the one place where status codes and errors are
// sorted into classes.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"slices"
	"syscall"
)

// A Class says what an attempt's outcome means for retrying.
type Class uint8

const (
	// Success is a response that is not an error: 1xx, 2xx, 3xx. It ends the
	// request, and a retry that ends in Success gives its tokens back.
	Success Class = iota
	// Permanent is a failure that another attempt would not fix: 4xx other
	// than 429, 500, 501 and other 5xx by default, the caller's cancellation,
	// certificate errors, malformed requests. It is returned as it is.
	Permanent
	// Transient is a failure that may pass: 502, 503, 504, or a network
	// error before a response. Retried after BaseDelay-based backoff, at
	// RetryCost tokens.
	Transient
	// Throttling is the server asking the client to slow down: 429. Retried
	// after ThrottleBaseDelay-based backoff, at ThrottleRetryCost tokens.
	Throttling
)

func (c Class) String() string {
	switch c {
	case Success:
		return "success"
	case Permanent:
		return "permanent"
	case Transient:
		return "transient"
	case Throttling:
		return "throttling"
	}
	return "class(" + itoa(int(c)) + ")"
}

// retryable reports whether the class is one the Transport retries.
func (c Class) retryable() bool { return c == Transient || c == Throttling }

// ErrAttemptTimeout is the cause of an attempt cut off by
// Policy.AttemptTimeout. Such attempts' errors match it with errors.Is.
// DefaultClassify treats them as Transient. The caller's own deadline is
// never reported as ErrAttemptTimeout.
var ErrAttemptTimeout = errors.New("retryhttp: attempt timed out")

// DefaultClassify is the classifier a Policy uses when its Classify is nil.
// Exactly one of resp and err is non-nil.
//
// Responses: 502, 503 and 504 are Transient, and 429 is Throttling. Any
// other status of 400 or above is Permanent. 500 is among them: the server
// may have done the work before failing. Anything below 400 is Success.
//
// Errors: context.Canceled is Permanent. So are certificate and TLS
// protocol errors, and any error not recognised as a network failure.
// Network failures are Transient: dial errors, refused, reset or aborted
// connections, broken pipes and unreachable hosts. So are DNS failures
// other than "no such host", and EOF before a response. So is a connection
// closed under the request, by a keep-alive race, an HTTP/2 GOAWAY or a
// lost health-check ping. HTTP/2 stream resets are Transient, but an
// ENHANCE_YOUR_CALM reset is Throttling. Timeouts are Transient:
// ErrAttemptTimeout, context.DeadlineExceeded, and any error whose Timeout
// method reports true. A forward proxy's refusal of a CONNECT tunnel is
// classified by its status, as a response would be.
//
// The Transport never retries once the request's own context has ended,
// whatever the class. While that context is alive, a Permanent
// context.Canceled is taken as Transient: the cancellation was not the
// caller's. A second one in a row is not retried again: the base cancels
// for good. A cancellation of a losing hedged copy is always Transient.
//
// To retry more, wrap it:
//
//	Classify: func(resp *http.Response, err error) retryhttp.Class {
//		if resp != nil && resp.StatusCode == http.StatusRequestTimeout {
//			return retryhttp.Transient
//		}
//		return retryhttp.DefaultClassify(resp, err)
//	}
func DefaultClassify(resp *http.Response, err error) Class {
	if err != nil {
		return classifyError(err)
	}
	if resp == nil {
		return Permanent
	}
	return statusClass(resp.StatusCode)
}

func classifyError(err error) Class {
	if errors.Is(err, ErrAttemptTimeout) {
		return Transient
	}
	// Somebody cancelled. A deadline, on the other hand, is a timeout like
	// any other (net/http's own timeouts match context.DeadlineExceeded):
	// the Transport itself checks the caller's context before retrying, so
	// the caller's deadline is never retried whatever the class says.
	if errors.Is(err, context.Canceled) {
		return Permanent
	}
	// The peer is not who it claims to be, or does not speak TLS: the same
	// answer comes back however often we ask.
	var (
		certErr      *tls.CertificateVerificationError
		unknownCA    x509.UnknownAuthorityError
		hostnameErr  x509.HostnameError
		invalidCert  x509.CertificateInvalidError
		recordHdrErr tls.RecordHeaderError
		alertErr     tls.AlertError
	)
	if errors.As(err, &certErr) || errors.As(err, &unknownCA) || errors.As(err, &hostnameErr) ||
		errors.As(err, &invalidCert) || errors.As(err, &recordHdrErr) || errors.As(err, &alertErr) {
		return Permanent
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		if dnsErr.IsNotFound {
			return Permanent
		}
		return Transient
	}
	var proxyErr *proxyConnectError
	if errors.As(err, &proxyErr) {
		return statusClass(proxyErr.StatusCode)
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, syscall.ETIMEDOUT),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF):
		return Transient
	}
	if code, ok := http2StreamErrorCode(err); ok {
		switch code {
		case 0x2, 0x7: // INTERNAL_ERROR, REFUSED_STREAM: the stream's reset
			return Transient
		case 0xb: // ENHANCE_YOUR_CALM: the server wants fewer requests
			return Throttling
		}
		return Permanent
	}
	if opError(err, "dial", "proxyconnect") != nil || connClosedUnder(err) || anyTimeout(err) {
		return Transient
	}
	return Permanent
}

// statusClass is DefaultClassify's reading of a status code.
func statusClass(code int) Class {
	switch code {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return Transient
	case http.StatusTooManyRequests:
		return Throttling
	}
	if code >= 400 {
		return Permanent
	}
	return Success
}

// neverSent reports whether err proves that the request did not reach the
// server. Either its connection was never made: a dial error, also under an
// HTTP proxy's "proxyconnect" error. Or a forward proxy refused the tunnel.
func neverSent(err error) bool {
	var proxyErr *proxyConnectError
	return opError(err, "dial", "proxyconnect") != nil || errors.As(err, &proxyErr)
}

// opError returns the first *net.OpError in err's chain whose Op is one of
// ops. Unlike errors.As, it looks past an OpError of another Op (a
// "proxyconnect" error wraps the "dial" error of the proxy).
func opError(err error, ops ...string) *net.OpError {
	var found *net.OpError
	walkChain(err, func(e error) bool {
		if oe, ok := e.(*net.OpError); ok && slices.Contains(ops, oe.Op) {
			found = oe
			return true
		}
		return false
	})
	return found
}

// http2StreamErrorCode finds an HTTP/2 stream error in err's chain and
// returns its error code (RFC 9113 §7). Neither of the stream error types
// can be named here for errors.As. The chain is walked instead, and the
// type identified by its package and name, never its text.
func http2StreamErrorCode(err error) (code uint32, ok bool) {
	walkChain(err, func(e error) bool {
		v := reflect.ValueOf(e)
		if t := v.Type(); t.Kind() == reflect.Struct &&
			(t.PkgPath() == "net/http" && t.Name() == "http2StreamError" ||
				t.PkgPath() == "golang.org/x/net/http2" && t.Name() == "StreamError") {
			if f := v.FieldByName("Code"); f.IsValid() && f.CanUint() {
				code, ok = uint32(f.Uint()), true
				return true
			}
		}
		return false
	})
	return code, ok
}

// net/http reports some connection failures without an exported type or
// sentinel. Each is identified by its type's package and name where it has
// a type, and by its exact text only where there is nothing else. Every
// entry has a test that provokes the real error (status_test.go). A Go
// release that renames a type or rewords a message then fails those tests,
// instead of turning a retryable failure into a permanent one.

// A stream above the LastStreamID of an HTTP/2 GOAWAY was provably not
// processed (RFC 9113 §6.8). net/http sends such a stream again by itself
// when it can rewind the body. What reaches the Transport is a stream at or
// below LastStreamID, which the server may have processed. It is retried
// for idempotent and keyed requests, not for keyless writes.

// netHTTPMessages are net/http errors made with errors.New, by exact text.
// Each means the connection broke while the request was in flight: the
// server may or may not have processed it, so a write without a key is not
// retried after it.
var netHTTPMessages = map[string]bool{
	// The keep-alive race: the server closed an idle connection just as
	// it was taken for this request. net/http sends idempotent and keyed
	// requests again by itself; the rest reach us. The request may have
	// been written before the close, so nothing proves it unprocessed.
	"http: server closed idle connection": true,
	// An HTTP/2 connection whose health-check ping went unanswered
	// (HTTP2Config.SendPingTimeout and PingTimeout) is closed under its
	// streams.
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

// isGoAwayError reports whether e is an HTTP/2 GoAwayError: the server
// sent GOAWAY and closed the connection with this request's stream open.
// The type cannot be named here, so it is identified by package and name.
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

package retryhttp

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strconv"
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
	// Hedge is not an outcome: it is the class a RetryBudget's Withdraw
	// receives for a hedged copy of an attempt that has not answered yet
	// (Policy.HedgeDelay). The token bucket charges HedgeCost for it.
	Hedge
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
	case Hedge:
		return "hedge"
	}
	return "class(" + itoa(int(c)) + ")"
}

// retryable reports whether the class is one the Transport retries.
func (c Class) retryable() bool { return c == Transient || c == Throttling }

// ErrAttemptTimeout is the cause of an attempt cut off by
// Policy.AttemptTimeout. Errors of such attempts match it with errors.Is, and
// DefaultClassify treats them as Transient; the caller's own deadline is
// never reported as ErrAttemptTimeout.
var ErrAttemptTimeout = errors.New("retryhttp: attempt timed out")

// DefaultClassify is the classifier a Policy uses when its Classify is nil.
// Exactly one of resp and err is non-nil.
//
// Responses: 502, 503 and 504 are Transient, 429 is Throttling, any other
// status of 400 or above is Permanent (500 among them: the server may have
// done the work before failing), anything below 400 is Success.
//
// Errors: context.Canceled is Permanent; so are certificate and TLS protocol
// errors, and any error not recognised as a network failure (an unsupported
// scheme, an invalid header). Recognised network failures are Transient:
// dial errors, refused, reset or aborted connections, broken pipes,
// unreachable hosts, DNS failures other than "no such host", EOF before a
// response, a connection closed under the request (net.ErrClosed, net/http's
// "server closed idle connection" keep-alive race, an HTTP/2 GOAWAY followed
// by a close, an HTTP/2 connection lost to an unanswered health-check ping),
// HTTP/2 stream resets (INTERNAL_ERROR, REFUSED_STREAM; an ENHANCE_YOUR_CALM
// reset is Throttling), and timeouts (ErrAttemptTimeout,
// context.DeadlineExceeded, and any error in the chain whose Timeout method
// reports true, as os.IsTimeout reads them). A forward proxy's refusal of a
// CONNECT tunnel (a *ProxyConnectError) is classified by its status as a
// response would be. Whatever the class, the Transport never retries once
// the request's own context has ended: that is the caller's cancellation or
// deadline, not the attempt's.
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
	var proxyErr *ProxyConnectError
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
// server: the connection for it was never made (a dial error, also under an
// HTTP proxy's "proxyconnect" error, whose inner error the outermost
// *net.OpError hides), or a forward proxy refused the tunnel to it.
func neverSent(err error) bool {
	var proxyErr *ProxyConnectError
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

func itoa(i int) string { return strconv.Itoa(i) }

// http2StreamErrorCode finds an HTTP/2 stream error in err's chain and returns
// its error code (RFC 9113 §7). net/http's HTTP/2 support reports a stream
// reset with an unexported type, and golang.org/x/net/http2 with its own
// StreamError; neither can be named here for errors.As, so the chain is
// walked and the type identified by its package and name, never its text.
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

// PeekBody returns up to n bytes from the start of resp's body and puts them
// back, so that whoever reads the body next (the caller, or the Transport's
// drain) sees it whole. It is for classifiers that must look inside an error
// body, such as AWS's 400 ThrottlingException: they read a bounded prefix,
// never the whole body. A read error is returned with what was read, which
// is put back too.
func PeekBody(resp *http.Response, n int) ([]byte, error) {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody || n <= 0 {
		return nil, nil
	}
	buf := make([]byte, n)
	m, err := io.ReadFull(resp.Body, buf)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		err = nil
	}
	buf = buf[:m]
	resp.Body = &peekedBody{Reader: io.MultiReader(bytes.NewReader(buf), resp.Body), Closer: resp.Body}
	return buf, err
}

// peekedBody is a body with its first bytes read and put back.
type peekedBody struct {
	io.Reader
	io.Closer
}

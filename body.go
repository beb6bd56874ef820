package retryhttp

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"
)

// The request and response bodies of a call: the next attempt's request,
// and the discarding, closing and handing over of responses.

// drainLimit bounds how much of a discarded response body is read, so that
// its connection can be reused. A longer body is closed unread: that costs
// a new connection, but never unbounded reading.
const drainLimit = 64 << 10

// drainTimeout bounds how long draining a discarded body may take: a body
// that stalls is closed, and the retry goes on.
const drainTimeout = 100 * time.Millisecond

// nextRequest returns the request of the retry that follows out, or nil when
// its body cannot be had again. A request without a body is sent again as it
// is: nothing in it changes, and the base is done with it once the response
// is closed. One with a body gets a copy with a fresh body from GetBody.
func nextRequest(req, out *http.Request) *http.Request {
	if req.GetBody == nil || req.Body == nil || req.Body == http.NoBody {
		return out
	}
	body, err := req.GetBody()
	if err != nil {
		return nil
	}
	next := shallowCopy(out)
	next.Body = body
	return next
}

// shallowCopy returns a copy of r that shares its header, URL and body.
func shallowCopy(r *http.Request) *http.Request {
	r2 := new(http.Request)
	*r2 = *r
	return r2
}

func closeBody(b io.ReadCloser) {
	if b != nil {
		b.Close()
	}
}

// discard drains a response that will not be returned, so that its
// connection can be reused, closes it and releases its attempt. The drain is
// bounded in bytes (drainLimit) and in time (drainTimeout): a body that is
// longer, or slower, is closed unread, which costs a new connection but never
// the request's time.
func discard(resp *http.Response, release func()) {
	if resp != nil && resp.Body != nil && resp.Body != http.NoBody {
		body := resp.Body
		// Closing a body ends a read blocked in it (net/http's bodies,
		// HTTP/1 and HTTP/2, allow that from another goroutine).
		timer := time.AfterFunc(drainTimeout, func() { body.Close() })
		io.CopyN(io.Discard, body, drainLimit)
		if timer.Stop() {
			body.Close()
		}
	}
	if release != nil {
		release()
	}
}

func releaseAll(release func(), cancel context.CancelFunc) {
	if release != nil {
		release()
	}
	if cancel != nil {
		cancel()
	}
}

// onClose makes closing body also run the given cleanups (either may be
// nil). RoundTrip calls it only when there is one, so that a response with
// nothing to clean up is returned untouched.
func onClose(body io.ReadCloser, release func(), cancel context.CancelFunc) io.ReadCloser {
	if body == nil {
		body = http.NoBody
	}
	cb := &cleanupBody{ReadCloser: body, release: release, cancel: cancel}
	if w, ok := body.(io.Writer); ok { // a 101 Switching Protocols body is writable
		return &cleanupRWBody{cleanupBody: cb, w: w}
	}
	return cb
}

type cleanupBody struct {
	io.ReadCloser
	once    sync.Once
	release func()
	cancel  context.CancelFunc
}

func (b *cleanupBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() {
		if b.release != nil {
			b.release()
		}
		if b.cancel != nil {
			b.cancel()
		}
	})
	return err
}

type cleanupRWBody struct {
	*cleanupBody
	w io.Writer
}

func (b *cleanupRWBody) Write(p []byte) (int, error) { return b.w.Write(p) }

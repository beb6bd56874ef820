package retryhttp

import (
	"net/http"
	"strings"

	"github.com/google/uuid"
)

// DefaultIdempotencyHeader is the header that carries a write's idempotency
// key unless Policy.IdempotencyHeader names another.
const DefaultIdempotencyHeader = "Idempotency-Key"

// idempotentMethod reports whether RFC 9110 §9.2.2 defines the method as
// idempotent: repeating it has the same effect on the server as sending it
// once. An empty method means GET.
func idempotentMethod(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace,
		http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

func (p *Policy) idempotencyHeader() string {
	if p.IdempotencyHeader == "" {
		return DefaultIdempotencyHeader
	}
	return http.CanonicalHeaderKey(p.IdempotencyHeader)
}

func (p *Policy) newKey() string {
	if p.NewIdempotencyKey != nil {
		return p.NewIdempotencyKey()
	}
	return uuid.NewString()
}

// headerKey returns the value of header name in h, looking first under the
// canonical key and then, for callers who wrote into the map directly
// (h["idempotency-key"]), under any spelling of it.
func headerKey(h http.Header, name string) (string, bool) {
	if vs := h[name]; len(vs) > 0 {
		return vs[0], true
	}
	for k, vs := range h {
		if len(vs) > 0 && strings.EqualFold(k, name) {
			return vs[0], true
		}
	}
	return "", false
}

package retryhttp

import (
	"crypto/rand"
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
	return newUUID()
}

// newUUID returns a random (version 4) UUID string. It is uuid.NewString
// without the allocation of the reader call: the 16 bytes stay on the stack.
func newUUID() string {
	var u uuid.UUID
	rand.Read(u[:])         // never returns an error (crypto/rand, Go 1.24+)
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return u.String()
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

// cloneHeaderWith returns a deep copy of h with name set to value, in two
// allocations: the map, and one slice holding every value.
func cloneHeaderWith(h http.Header, name, value string) http.Header {
	nv := 1
	for _, vs := range h {
		nv += len(vs)
	}
	all := make([]string, 0, nv)
	h2 := make(http.Header, len(h)+1)
	for k, vs := range h {
		if vs == nil {
			h2[k] = nil // keep "do not send this header" markers
			continue
		}
		n := len(all)
		all = append(all, vs...)
		h2[k] = all[n:len(all):len(all)]
	}
	all = append(all, value)
	h2[name] = all[len(all)-1:]
	return h2
}

package retryhttp

import (
	"crypto/rand"
	"net/http"
	"strings"
	"sync"

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

// newKey returns the key for a write that carries none.
func (t *Transport) newKey() string {
	if t.Policy.NewIdempotencyKey != nil {
		return t.Policy.NewIdempotencyKey()
	}
	return t.keys.newUUID()
}

// keySource makes random (version 4) UUIDs from crypto/rand, reading the
// random bytes for keyBatch keys at a time: one read of the system's random
// source costs far more than formatting a key, and that read is most of what
// a key used to cost. Each batch belongs to one goroutine at a time (a
// sync.Pool hands it out), each 16 bytes are used for one key only and then
// zeroed, so keys stay as unpredictable as crypto/rand's output: 122 random
// bits each. The zero keySource is ready to use.
type keySource struct {
	pool sync.Pool // of *keyBatch
}

// keyBatch is the random bytes of up to keyBatch keys; next is the offset
// of the first unused one.
type keyBatch struct {
	buf  [keysPerBatch * 16]byte
	next int
}

const keysPerBatch = 16

func (s *keySource) newUUID() string {
	b, _ := s.pool.Get().(*keyBatch)
	if b == nil {
		b = &keyBatch{next: keysPerBatch * 16}
	}
	if b.next == len(b.buf) {
		rand.Read(b.buf[:]) // never returns an error (crypto/rand, Go 1.24+)
		b.next = 0
	}
	var u uuid.UUID
	copy(u[:], b.buf[b.next:b.next+16])
	clear(b.buf[b.next : b.next+16])
	b.next += 16
	s.pool.Put(b)
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return u.String()
}

// headerKey returns the value of header name in h, looking first under the
// canonical key and then, for callers who wrote into the map directly
// (h["idempotency-key"]), under any spelling of it. An empty value is no key:
// it identifies nothing, and a server that deduplicates cannot use it.
func headerKey(h http.Header, name string) (string, bool) {
	if vs := h[name]; len(vs) > 0 && vs[0] != "" {
		return vs[0], true
	}
	for k, vs := range h {
		if len(vs) > 0 && vs[0] != "" && strings.EqualFold(k, name) {
			return vs[0], true
		}
	}
	return "", false
}

// cloneHeaderWith returns a deep copy of h with name set to value, in two
// allocations: the map, and one slice holding every value. Any other
// spelling of name (an empty key written into the map directly) is left out,
// so that exactly one value is sent.
func cloneHeaderWith(h http.Header, name, value string) http.Header {
	nv := 1
	for _, vs := range h {
		nv += len(vs)
	}
	all := make([]string, 0, nv)
	h2 := make(http.Header, len(h)+1)
	for k, vs := range h {
		if k != name && len(k) == len(name) && strings.EqualFold(k, name) {
			continue
		}
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

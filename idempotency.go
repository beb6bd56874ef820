package retryhttp

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"unsafe"
)

// defaultIdempotencyHeader is the header that carries a write's
// idempotency key unless Policy.IdempotencyHeader names another.
const defaultIdempotencyHeader = "Idempotency-Key"

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
		return defaultIdempotencyHeader
	}
	return http.CanonicalHeaderKey(p.IdempotencyHeader)
}

// keyedRequest is the copy of a write's request that carries a generated
// key. It is allocated in one piece with its keyText, so that a write's key
// costs a handful of allocations, not one per part.
type keyedRequest struct {
	req http.Request
	keyText
}

// keyText holds a generated key's text. It also holds the header's values
// when they fit in vals.
type keyText struct {
	key  [36]byte
	vals [4]string
}

// withNewKey returns out with a new key under name, in a header that is
// otherwise req's. When out is req, it returns a copy. Any other out is the
// call's own copy of req, made for Policy.Timeout: it takes the key itself,
// so that the request is copied once. withNewKey returns nil when
// Policy.NewIdempotencyKey made an empty key. An empty value identifies
// nothing, so the write stays unkeyed.
func (t *Transport) withNewKey(req, out *http.Request, name string) *http.Request {
	p := &t.Policy
	var key string
	if p.NewIdempotencyKey != nil {
		if key = p.NewIdempotencyKey(); key == "" {
			return nil
		}
	}
	var kt *keyText
	if out == req {
		kr := new(keyedRequest)
		kr.req = *out
		out, kt = &kr.req, &kr.keyText
	} else {
		kt = new(keyText)
	}
	if key == "" {
		t.keys.newUUID(&kt.key)
		// The bytes are never written again: the string may share them.
		key = unsafe.String(&kt.key[0], len(kt.key))
	}
	out.Header = cloneHeaderWith(req.Header, name, key, kt.vals[:0])
	return out
}

// keySource makes random (version 4) UUIDs from crypto/rand. It reads the
// random bytes of keysPerBatch keys at a time, so that the system's random
// source is read once per batch. Each batch belongs to one goroutine at a
// time: a sync.Pool hands it out. Each 16 bytes are used for one key only
// and zeroed as they are taken. Keys stay as unpredictable as crypto/rand's
// output: 122 random bits each. The zero keySource is ready to use.
type keySource struct {
	pool sync.Pool // of *keyBatch
}

// keyBatch is the random bytes of up to keysPerBatch keys; next is the
// offset of the first unused one.
type keyBatch struct {
	buf  [keysPerBatch * 16]byte
	next int
}

const keysPerBatch = 64

// newUUID writes a new UUID into dst in its 36-character form.
func (s *keySource) newUUID(dst *[36]byte) {
	b, _ := s.pool.Get().(*keyBatch)
	if b == nil {
		b = &keyBatch{next: keysPerBatch * 16}
	}
	if b.next == len(b.buf) {
		rand.Read(b.buf[:]) // never returns an error (crypto/rand, Go 1.24+)
		b.next = 0
	}
	u := (*[16]byte)(b.buf[b.next : b.next+16])
	b.next += 16
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	encodeUUID(dst, u)
	*u = [16]byte{}
	s.pool.Put(b)
}

// encodeUUID writes u in its canonical form, xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func encodeUUID(dst *[36]byte, u *[16]byte) {
	hex.Encode(dst[0:8], u[0:4])
	dst[8] = '-'
	hex.Encode(dst[9:13], u[4:6])
	dst[13] = '-'
	hex.Encode(dst[14:18], u[6:8])
	dst[18] = '-'
	hex.Encode(dst[19:23], u[8:10])
	dst[23] = '-'
	hex.Encode(dst[24:36], u[10:16])
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

// cloneHeaderWith returns a deep copy of h with name set to value: a new map,
// and one slice holding every value, buf if it has the capacity. Any other
// spelling of name (an empty key written into the map directly) is left out,
// so that exactly one value is sent.
func cloneHeaderWith(h http.Header, name, value string, buf []string) http.Header {
	nv := 1
	for _, vs := range h {
		nv += len(vs)
	}
	all := buf[:0]
	if cap(all) < nv {
		all = make([]string, 0, nv)
	}
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

package retryhttp

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of a PerHost's zero fields.
const (
	// defaultMaxHosts is the most destinations a PerHost tracks at once.
	defaultMaxHosts = 4096
	// defaultHostIdleTimeout is how long a destination may go without a
	// request before a PerHost forgets it.
	defaultHostIdleTimeout = 10 * time.Minute
)

// A PerHost isolates the destinations of one Transport from each other.
// Each destination (scheme, host and port) gets a Budget and a RateLimiter
// of its own, made the first time a request goes there. One dead host then
// spends only its own budget. One host that answers 429 slows only the
// requests to it. Envoy keeps budgets per cluster, and the AWS SDKs per
// service client, for the same reason.
//
// Set it as Transport.PerHost, in place of Budget and Limiter. At most
// MaxHosts destinations are tracked. One with no request for about
// IdleTimeout is forgotten when a new one is added. A forgotten destination
// that comes back starts afresh. A request to a known destination takes no
// lock.
//
// The zero PerHost is ready to use: a token bucket of DefaultBudgetTokens
// for each destination, and no rate limiting. It is safe for concurrent
// use. Its fields must not change after its first use. One PerHost belongs
// to one Transport.
type PerHost struct {
	// Budget makes the budget of a destination; dest is its scheme, host
	// and port ("https://api.example.com:443"). Any Budget will do: a
	// fleet budget can name its shared key after dest. Nil means a token
	// bucket of DefaultBudgetTokens for each destination.
	Budget func(dest string) Budget
	// Limiter makes the RateLimiter of a destination. Nil means that
	// destinations are not rate limited.
	Limiter func(dest string) *RateLimiter
	// MaxHosts is the most destinations tracked at once, each spelling of
	// one ("a.test" and "A.test:80") counted: when a new one would go past
	// it, the ones idle longest are forgotten first. Zero means
	// defaultMaxHosts.
	MaxHosts int
	// IdleTimeout is how long a destination may go without a request
	// before it can be forgotten. Zero means defaultHostIdleTimeout.
	IdleTimeout time.Duration

	// Lookups read an immutable map with no lock. New destinations go
	// into dirty, under mu. They are copied into a new read map once the
	// lookups that took the lock add up to an eighth of it. A copy then
	// costs a few lookups per destination, however many there are.
	read   atomic.Pointer[hostMaps]
	mu     sync.Mutex
	dirty  map[hostKey]*host // not in read yet
	misses int               // lookups that took mu since the last copy
	n      int               // in read and dirty
	swept  time.Time         // the last sweep
}

// hostKey names a destination without allocating: the scheme and the host
// with its port, the default port left out.
type hostKey struct{ scheme, host string }

// hostMaps are the keys known to lookups without a lock, by scheme: a map
// keyed by one string is the fastest map lookup there is.
type hostMaps struct {
	http, https map[string]*host
	other       map[hostKey]*host
}

func (m *hostMaps) lookup(k hostKey) *host {
	if m == nil {
		return nil
	}
	switch k.scheme {
	case "https":
		return m.https[k.host]
	case "http":
		return m.http[k.host]
	}
	return m.other[k]
}

// each calls f for every key.
func (m *hostMaps) each(f func(hostKey, *host)) {
	if m == nil {
		return
	}
	for h, v := range m.http {
		f(hostKey{"http", h}, v)
	}
	for h, v := range m.https {
		f(hostKey{"https", h}, v)
	}
	for k, v := range m.other {
		f(k, v)
	}
}

func (m *hostMaps) store(k hostKey, h *host) {
	switch k.scheme {
	case "https":
		m.https[k.host] = h
	case "http":
		m.http[k.host] = h
	default:
		m.other[k] = h
	}
}

func newHostMaps() *hostMaps {
	return &hostMaps{http: map[string]*host{}, https: map[string]*host{}, other: map[hostKey]*host{}}
}

// A host is one destination's state.
type host struct {
	budget  Budget
	limiter *RateLimiter
	hedges  lazyHedging // made on the first hedged request
	used    atomic.Bool // a request went there since the last sweep
	idle    time.Time   // made, or last found used by a sweep; guarded by mu
}

func (ph *PerHost) maxHosts() int {
	if ph.MaxHosts <= 0 {
		return defaultMaxHosts
	}
	return ph.MaxHosts
}

func (ph *PerHost) idleTimeout() time.Duration {
	return orDefault(ph.IdleTimeout, defaultHostIdleTimeout)
}

// get returns the state of u's destination, made on its first request. The
// URL's scheme and host, as they are, are looked up first: a destination
// is known under each spelling it was sent to ("a.test", "a.test:80"),
// which saves normalizing the host on every request.
func (ph *PerHost) get(u *url.URL) *host {
	k := hostKey{u.Scheme, u.Host}
	if h := ph.read.Load().lookup(k); h != nil {
		if !h.used.Load() { // read-mostly: no shared write per request
			h.used.Store(true)
		}
		return h
	}
	return ph.getLocked(k)
}

// getLocked looks the spelling k up under mu, then its destination, and
// adds either when it is new, making room first: every spelling counts
// against MaxHosts.
func (ph *PerHost) getLocked(k hostKey) *host {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if h := ph.read.Load().lookup(k); h != nil { // published meanwhile
		h.used.Store(true)
		return h
	}
	h := ph.dirty[k]
	if h == nil {
		canon := k.canonical()
		if h = ph.read.Load().lookup(canon); h == nil {
			h = ph.dirty[canon]
		}
		need := 0 // keys to add
		if h == nil {
			need++
		}
		if k != canon {
			need++
		}
		ph.makeRoom(need, h)
		if h == nil {
			h = ph.add(canon) // idle since now, not used yet
		} else {
			h.used.Store(true)
		}
		if k != canon && ph.n < ph.maxHosts() { // else looked up under mu each time
			ph.alias(k, h)
		}
	} else {
		h.used.Store(true)
	}
	if ph.misses++; ph.misses >= (ph.n-len(ph.dirty))/8+1 {
		ph.publish()
	}
	return h
}

// makeRoom sweeps before need keys are added, when they would go past
// MaxHosts or the last sweep is half an IdleTimeout old; keep, the
// destination being looked up (nil for a new one), stays. Must hold mu.
func (ph *PerHost) makeRoom(need int, keep *host) {
	now := time.Now()
	if ph.n+need > ph.maxHosts() || now.Sub(ph.swept) >= ph.idleTimeout()/2 {
		ph.sweep(now, need, keep)
	}
}

// publish makes new read maps of the read ones and dirty. Must hold mu.
func (ph *PerHost) publish() {
	m := newHostMaps()
	ph.read.Load().each(m.store)
	for k, h := range ph.dirty {
		m.store(k, h)
	}
	ph.read.Store(m)
	ph.dirty, ph.misses = nil, 0
}

// canonical returns the key of k's destination: scheme and host in lower
// case (but for an IPv6 zone), the port as a number, left out when it is the scheme's default or
// empty (net/http dials "a.test:" and "a.test:080" as "a.test:80").
func (k hostKey) canonical() hostKey {
	scheme, h := strings.ToLower(k.scheme), strings.ToLower(k.host)
	if i := strings.IndexByte(k.host, '%'); i >= 0 { // an IPv6 zone: an interface name, case and all
		h = h[:i] + k.host[i:]
	}
	if i := strings.LastIndexByte(h, ':'); i > strings.LastIndexByte(h, ']') { // a port
		name, port := h[:i], h[i+1:]
		if n, err := strconv.ParseUint(port, 10, 16); err == nil {
			port = strconv.FormatUint(n, 10)
		}
		h = name
		if port != "" && ":"+port != defaultPort(scheme) {
			h = name + ":" + port
		}
	}
	return hostKey{scheme, h}
}

func defaultPort(scheme string) string {
	switch scheme {
	case "http":
		return ":80"
	case "https":
		return ":443"
	}
	return ""
}

// dest is the name a destination is given to the Budget and Limiter funcs.
func (k hostKey) dest() string {
	if strings.LastIndexByte(k.host, ':') <= strings.LastIndexByte(k.host, ']') { // no port
		return k.scheme + "://" + k.host + defaultPort(k.scheme)
	}
	return k.scheme + "://" + k.host
}

// add makes the state of a new destination. Must hold mu.
func (ph *PerHost) add(k hostKey) *host {
	dest := k.dest()
	h := &host{idle: time.Now()} // idle since now, unless used again
	if ph.Budget != nil {
		h.budget = ph.Budget(dest)
	}
	if h.budget == nil || isNilPointer(h.budget) {
		h.budget = NewTokenBucket(DefaultBudgetTokens)
	}
	if ph.Limiter != nil {
		h.limiter = ph.Limiter(dest)
	}
	ph.alias(k, h)
	return h
}

// alias records h under the key k. Must hold mu.
func (ph *PerHost) alias(k hostKey, h *host) {
	if ph.dirty == nil {
		ph.dirty = make(map[hostKey]*host)
	}
	ph.dirty[k] = h
	ph.n++
}

// sweep forgets the destinations idle for IdleTimeout. When need more keys
// would go past MaxHosts, it also forgets the ones idle longest. It goes
// down to seven eighths of MaxHosts less need. A stream of new
// destinations then sweeps once in a while, not on each. It never forgets
// keep. A destination goes with all its spellings. Must hold mu.
func (ph *PerHost) sweep(now time.Time, need int, keep *host) {
	ph.swept = now
	keys := make(map[*host][]hostKey, ph.n)
	add := func(k hostKey, h *host) { keys[h] = append(keys[h], k) }
	ph.read.Load().each(add)
	for k, h := range ph.dirty {
		add(k, h)
	}
	n := ph.n
	var idle []*host
	for h, ks := range keys {
		switch {
		case h == keep || h.used.Load():
			h.used.Store(false)
			h.idle = now
		case now.Sub(h.idle) >= ph.idleTimeout():
			delete(keys, h)
			n -= len(ks)
		default:
			idle = append(idle, h)
		}
	}
	if max := ph.maxHosts(); n+need > max {
		// Idle longest first; then, if every one was used, any.
		target := max - max/8 - need
		slices.SortFunc(idle, func(a, b *host) int { return a.idle.Compare(b.idle) })
		for _, h := range idle {
			if n <= target {
				break
			}
			n -= len(keys[h])
			delete(keys, h)
		}
		for h, ks := range keys {
			if n <= target {
				break
			}
			if h != keep {
				n -= len(ks)
				delete(keys, h)
			}
		}
	}
	all := newHostMaps()
	for h, ks := range keys {
		for _, k := range ks {
			all.store(k, h)
		}
	}
	ph.read.Store(all)
	ph.dirty, ph.misses, ph.n = nil, 0, n
}

// Len reports how many destinations are tracked now.
func (ph *PerHost) count() int {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	seen := make(map[*host]bool, ph.n)
	ph.read.Load().each(func(_ hostKey, h *host) { seen[h] = true })
	for _, h := range ph.dirty {
		seen[h] = true
	}
	return len(seen)
}

// Lookup reports the budget and the RateLimiter (nil when none) of the
// destination that rawURL goes to, if it is tracked. It makes nothing.
func (ph *PerHost) lookup(rawURL string) (Budget, *RateLimiter, bool) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, nil, false
	}
	k := hostKey{u.Scheme, u.Host}.canonical()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	h := ph.read.Load().lookup(k)
	if h == nil {
		h = ph.dirty[k]
	}
	if h == nil {
		return nil, nil, false
	}
	return h.budget, h.limiter, true
}

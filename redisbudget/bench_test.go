package redisbudget

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
)

type okBase struct{ resp http.Response }

func (b *okBase) RoundTrip(*http.Request) (*http.Response, error) { return &b.resp, nil }

// BenchmarkSuccessPath compares a first-try success through a Transport
// with the local token bucket and with the Redis budget: the success path
// never talks to Redis.
func BenchmarkSuccessPath(b *testing.B) {
	s := startRedis(&testing.T{})
	defer s.stop()
	base := &okBase{resp: http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}}
	get, _ := http.NewRequest("GET", "http://example.test/", nil)
	for _, c := range []struct {
		name   string
		budget func() retryhttp.Budget
	}{
		{"local", func() retryhttp.Budget { return retryhttp.NewTokenBucket(500) }},
		{"redis", func() retryhttp.Budget {
			bud, _ := New(Options{Client: s.clientNoCleanup(), Key: "bench"})
			return bud
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			tr := &retryhttp.Transport{Base: base, Budget: c.budget()}
			b.ReportAllocs()
			for b.Loop() {
				tr.RoundTrip(get)
			}
		})
	}
}

// BenchmarkWithdraw measures a retry's cost to the budget: with the default
// lease of two retries, every second withdrawal is a Redis round trip.
func BenchmarkWithdraw(b *testing.B) {
	s := startRedis(&testing.T{})
	defer s.stop()
	for _, lease := range []int64{DefaultLease, 10 * retryhttp.RetryCost} {
		b.Run("lease="+itoa(lease), func(b *testing.B) {
			bud, _ := New(Options{Client: s.clientNoCleanup(), Key: "bench:" + itoa(lease), Capacity: 1 << 50, Lease: lease, Timeout: time.Second})
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := bud.Withdraw(context.Background(), retryhttp.Transient); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

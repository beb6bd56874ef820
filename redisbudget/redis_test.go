package redisbudget

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server the test started on a free loopback port,
// in a temp dir, stopped at the end of the test.
type redisServer struct {
	t    *testing.T
	port int
	dir  string
	args []string // more arguments for redis-server
	cmd  *exec.Cmd
}

// startRedis starts a redis-server of the test's own. The package
// redis-server must be installed (.ci/run installs it).
func startRedis(t *testing.T, args ...string) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is not installed (apt-get install -y redis-server): %v", err)
	}
	s := &redisServer{t: t, port: freePort(t), dir: t.TempDir(), args: args}
	s.start()
	t.Cleanup(s.stop)
	return s
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *redisServer) start() {
	s.t.Helper()
	s.cmd = exec.Command("redis-server", append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--dir", s.dir, "--save", "", "--appendonly", "no", "--enable-debug-command", "local"}, s.args...)...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr(), 100*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server did not listen on %s: %v", s.addr(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *redisServer) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

func (s *redisServer) restart() {
	s.stop()
	s.start()
}

// client returns a go-redis client of the server, closed at the end.
func (s *redisServer) client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1, DialTimeout: 50 * time.Millisecond,
		ReadTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// clientNoCleanup is client for a benchmark, whose fake T runs no cleanups.
func (s *redisServer) clientNoCleanup() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.addr(), ContextTimeoutEnabled: true})
}

// tokens reads the bucket under key.
func (s *redisServer) tokens(key string) int64 {
	s.t.Helper()
	v, err := s.client().HGet(context.Background(), key, "tokens").Int64()
	if err != nil {
		s.t.Fatalf("HGET %s tokens: %v", key, err)
	}
	return v
}

func newBudget(t *testing.T, rdb redis.UniversalClient, key string, opts ...func(*Options)) *Budget {
	t.Helper()
	o := Options{Client: rdb, Key: key, Timeout: 200 * time.Millisecond}
	for _, f := range opts {
		f(&o)
	}
	b, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var _ = fmt.Sprint

// pause stops the server's process (SIGSTOP): it accepts connections and
// reads nothing, as a Redis stuck in a long command, a fork or a
// partition would.
func (s *redisServer) pause() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatal(err)
	}
}

// resume continues a paused server (SIGCONT).
func (s *redisServer) resume() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatal(err)
	}
}

// latencyProxy forwards TCP connections to target, delaying every byte by
// delay in each direction: a Redis one network hop away.
type latencyProxy struct {
	l     net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func startLatencyProxy(t *testing.T, target string, delay time.Duration) *latencyProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &latencyProxy{l: l}
	p.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			p.wg.Go(func() { delayed(up, c, delay) })
			p.wg.Go(func() { delayed(c, up, delay) })
		}
	})
	t.Cleanup(p.close)
	return p
}

func (p *latencyProxy) addr() string { return p.l.Addr().String() }

func (p *latencyProxy) close() {
	p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// delayed copies src to dst, each chunk written delay after it was read,
// in order.
func delayed(dst, src net.Conn, delay time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			time.Sleep(time.Until(c.at))
			if _, err := dst.Write(c.b); err != nil {
				break
			}
		}
		dst.Close()
		for range q {
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now().Add(delay)}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
	src.Close()
}

func TestMain(m *testing.M) {
	// go-redis logs every failed dial: the tests kill their servers on
	// purpose, and the budget reports what matters itself.
	redis.SetLogger(quietLog{})
	os.Exit(m.Run())
}

type quietLog struct{}

func (quietLog) Printf(context.Context, string, ...any) {}

// lateness measures how late this machine wakes a sleeping goroutine while
// a test runs: a shared CI machine, or one running -race, can pause a
// process for longer than a budget's Timeout, and a test about the budget's
// figures must tell that from a fault of the budget. Stop it to read the
// worst lateness seen.
type lateness struct {
	stop  chan struct{}
	done  chan struct{}
	worst time.Duration
}

func startLateness() *lateness {
	l := &lateness{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			t0 := time.Now()
			time.Sleep(10 * time.Millisecond)
			l.worst = max(l.worst, time.Since(t0)-10*time.Millisecond)
		}
	}()
	return l
}

// Stop ends the measurement and returns the worst lateness seen.
func (l *lateness) Stop() time.Duration {
	close(l.stop)
	<-l.done
	return l.worst
}

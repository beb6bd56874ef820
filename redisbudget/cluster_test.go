package redisbudget

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/redis/go-redis/v9"
)

// redisCluster is a real Redis Cluster of three masters, with or without a
// replica each, every node a redis-server of the test's own.
type redisCluster struct {
	t     *testing.T
	nodes []*redisServer
}

// startCluster starts three cluster-enabled servers and joins them with
// redis-cli --cluster create (the package redis-tools).
func startCluster(t *testing.T) *redisCluster { return startClusterOf(t, 0, 500) }

// startClusterOf starts a cluster of three masters with replicas replicas
// each and the given cluster-node-timeout (ms).
func startClusterOf(t *testing.T, replicas, nodeTimeout int) *redisCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redis-cli is not installed (apt-get install -y redis-tools): %v", err)
	}
	c := &redisCluster{t: t}
	var addrs []string
	for range 3 * (1 + replicas) {
		// The cluster bus gets a port of its own (cluster-port), so that
		// port+10000 need not be free.
		n := startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.Itoa(nodeTimeout), "--cluster-port", strconv.Itoa(freePort(t)),
			// A replica syncs at once, not after the 5 s Redis 7 waits
			// for more replicas to share a diskless sync.
			"--repl-diskless-sync-delay", "0")
		c.nodes = append(c.nodes, n)
		addrs = append(addrs, n.addr())
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...),
		"--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitOK()
	if replicas > 0 {
		waitFor(t, "every replica in sync", func() bool {
			for _, n := range c.nodes {
				if role, _ := n.role(); role == "" {
					return false
				}
			}
			return true
		})
	}
	return c
}

// role reports the node's role ("master", or "slave" once its link to its
// master is up) and, for a replica, its master's port.
func (n *redisServer) role() (role string, masterPort int64) {
	rdb := redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1, ReadTimeout: time.Second})
	defer rdb.Close()
	info, err := rdb.Info(context.Background(), "replication").Result()
	if err != nil {
		return "", 0
	}
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = v
		}
	}
	switch fields["role"] {
	case "master":
		return "master", 0
	case "slave":
		if fields["master_link_status"] != "up" {
			return "", 0
		}
		port, _ := strconv.ParseInt(fields["master_port"], 10, 64)
		return "slave", port
	}
	return "", 0
}

// serving returns the running node that is master of key's slot by its
// own account and by its CLUSTER SLOTS, or nil if none is yet.
func (c *redisCluster) serving(key string) *redisServer {
	slot := redisSlot(hashTag(key))
	for _, n := range c.nodes {
		if n.cmd == nil {
			continue
		}
		if role, _ := n.role(); role != "master" {
			continue
		}
		rdb := redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1, ReadTimeout: time.Second})
		slots, err := rdb.ClusterSlots(context.Background()).Result()
		rdb.Close()
		if err != nil {
			continue
		}
		for _, r := range slots {
			if r.Start <= slot && slot <= r.End && len(r.Nodes) > 0 && r.Nodes[0].Addr == n.addr() {
				return n
			}
		}
	}
	return nil
}

// replicaOf returns a running replica of master, in sync, or nil.
func (c *redisCluster) replicaOf(master *redisServer) *redisServer {
	for _, n := range c.nodes {
		if n.cmd == nil || n == master {
			continue
		}
		if role, port := n.role(); role == "slave" && port == int64(master.port) {
			return n
		}
	}
	return nil
}

// hashTag is the part of key Redis Cluster hashes.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// waitOK waits until every running node says cluster_state:ok.
func (c *redisCluster) waitOK() {
	c.t.Helper()
	waitFor(c.t, "cluster_state:ok on every node", func() bool {
		for _, n := range c.nodes {
			if n.cmd == nil {
				continue
			}
			rdb := redis.NewClient(&redis.Options{Addr: n.addr()})
			info, err := rdb.ClusterInfo(context.Background()).Result()
			rdb.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		return true
	})
}

func (c *redisCluster) client() *redis.ClusterClient {
	var addrs []string
	for _, n := range c.nodes {
		addrs = append(addrs, n.addr())
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true,
		MaxRedirects: 1, ReadTimeout: time.Second, DialTimeout: 100 * time.Millisecond})
	c.t.Cleanup(func() { rdb.Close() })
	return rdb
}

// owner returns the node that serves key's slot.
func (c *redisCluster) owner(rdb *redis.ClusterClient, key string) *redisServer {
	c.t.Helper()
	m, err := rdb.MasterForKey(context.Background(), key)
	if err != nil {
		c.t.Fatal(err)
	}
	addr := m.Options().Addr
	for _, n := range c.nodes {
		if n.addr() == addr {
			return n
		}
	}
	c.t.Fatalf("no node at %s", addr)
	return nil
}

// The budget through a real 3-master Redis Cluster: two processes share one
// bucket exactly; two keys with different hash tags live on their own
// slots; the node holding the bucket goes away (fallback) and comes back
// (recovery, a fresh bucket).
func TestCluster(t *testing.T) {
	c := startCluster(t)
	const key = "retry-budget:{orders-api}"
	// The accounting is exact only without fallbacks: a loaded machine gets
	// a generous Timeout, and any fallback is reported.
	exact := func(o *Options) {
		o.Timeout = time.Second
		o.OnFallback = func(err error) {
			if err != nil {
				t.Errorf("fell back: %v", err)
			}
		}
	}
	b1 := newBudget(t, c.client(), key, exact)
	b2 := newBudget(t, c.client(), key, exact)
	other := newBudget(t, c.client(), "retry-budget:{billing-api}", exact)

	t.Run("one bucket for the fleet", func(t *testing.T) {
		var retries int
		for {
			_, ok1 := b1.Withdraw(context.Background(), retryhttp.Transient)
			_, ok2 := b2.Withdraw(context.Background(), retryhttp.Transient)
			retries += btoi(ok1) + btoi(ok2)
			if !ok1 && !ok2 {
				break
			}
		}
		if retries != 35 {
			t.Errorf("got %d retries from two processes; want 35, one bucket", retries)
		}
		if _, ok := other.Withdraw(context.Background(), retryhttp.Transient); !ok {
			t.Error("another key's bucket was refused: it is a bucket of its own")
		}
		rdb := c.client()
		s1, s2 := rdb.ClusterKeySlot(context.Background(), key).Val(), rdb.ClusterKeySlot(context.Background(), "retry-budget:{billing-api}").Val()
		if s1 != int64(redisSlot("orders-api")) || s1 == s2 {
			t.Errorf("got slots %d and %d; want %d (the hash tag's) and another", s1, s2, redisSlot("orders-api"))
		}
	})

	t.Run("shards spread over the nodes", func(t *testing.T) {
		const shards = 3
		rdb := c.client()
		nodes := map[*redisServer]bool{}
		for i := range shards {
			nodes[c.owner(rdb, ShardKey(key, i))] = true
		}
		if len(nodes) < 2 {
			t.Errorf("the %d shards of %q live on %d node(s); want them spread", shards, key, len(nodes))
		}
		var budgets []*Budget
		used := map[string]bool{}
		for range 9 {
			b := newBudget(t, c.client(), key, exact, func(o *Options) { o.Shards = shards })
			budgets = append(budgets, b)
			used[b.key] = true
		}
		retries := 0
		for more := true; more; {
			more = false
			for _, b := range budgets {
				if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); ok {
					retries++
					more = true
				}
			}
		}
		// Each shard holds 500/3 = 166 tokens: 11 retries.
		if want := 11 * len(used); retries != want {
			t.Errorf("got %d retries from %d shards in use; want %d (11 a shard, at most 35 for the fleet)", retries, len(used), want)
		}
		for k := range used {
			if n := rdb.Exists(context.Background(), k).Val(); n != 1 {
				t.Errorf("shard %s: not in the cluster", k)
			}
		}
	})

	t.Run("the node holding the key goes away and comes back", func(t *testing.T) {
		var changes []error
		b := newBudget(t, c.client(), key, func(o *Options) {
			o.Timeout = 100 * time.Millisecond
			o.RetryAfter = 100 * time.Millisecond
			o.OnFallback = func(err error) { changes = append(changes, err) }
		})
		owner := c.owner(c.client(), key)
		owner.stop()
		start := time.Now()
		if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
			t.Fatal("refused with the bucket's node down; want the fallback to pay")
		}
		if d := time.Since(start); d > 150*time.Millisecond {
			t.Errorf("the withdrawal took %v; want about the 100ms Timeout", d)
		}
		if down, err := b.Fallback(); !down || err == nil {
			t.Fatalf("got fallback %v (%v); want true and the cause", down, err)
		}
		owner.start() // same port, same nodes.conf: it takes its slots back
		c.waitOK()
		waitFor(t, "the budget back on the cluster", func() bool {
			b.Withdraw(context.Background(), retryhttp.Transient)
			down, _ := b.Fallback()
			return !down
		})
		// The node came back without data: the bucket starts full again.
		if got, err := b.Tokens(context.Background()); err != nil || got < DefaultCapacity-2*DefaultLease {
			t.Errorf("got %d tokens (%v) after the node came back; want a fresh bucket less a lease or two", got, err)
		}
		if len(changes) < 2 || changes[0] == nil || changes[len(changes)-1] != nil {
			t.Errorf("OnFallback calls %v: want a fallback first and a recovery last", changes)
		}
	})
}

// redisSlot is Redis Cluster's hash slot of a hash tag: CRC16 (XMODEM)
// mod 16384.
func redisSlot(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

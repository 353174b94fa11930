package redis

import (
	"context"
	"net"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"
)

// ConnStats counts a client's connections as envoyproxy/ratelimit's Redis
// pool stats count them (ratelimit.redis_pool.cx_total, cx_active).
type ConnStats struct {
	client goredis.UniversalClient
	dialed atomic.Uint64
}

// CountConns starts counting client's connections; for a Cluster, every
// node's.
func CountConns(client goredis.UniversalClient) *ConnStats {
	c := &ConnStats{client: client}
	switch cl := client.(type) {
	case *goredis.ClusterClient:
		cl.OnNewNode(func(node *goredis.Client) { node.AddHook(dialCounter{&c.dialed}) })
	default:
		client.AddHook(dialCounter{&c.dialed})
	}
	return c
}

// Total is how many connections were opened.
func (c *ConnStats) Total() uint64 { return c.dialed.Load() }

// Active is how many are open now, idle or in use.
func (c *ConnStats) Active() uint64 { return uint64(c.client.PoolStats().TotalConns) }

// dialCounter is a go-redis hook that counts successful dials.
type dialCounter struct{ n *atomic.Uint64 }

func (d dialCounter) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err == nil {
			d.n.Add(1)
		}
		return conn, err
	}
}

func (d dialCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (d dialCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

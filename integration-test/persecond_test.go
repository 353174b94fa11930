package integration

import (
	"net/http"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

const perSecondConfig = `
domain: ps
descriptors:
  - key: fast
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: slow
    rate_limit: {unit: hour, requests_per_unit: 3}
`

// keysOn lists every key held by the given servers (each node of a Cluster).
func keysOn(t *testing.T, servers ...*redistest.Server) []string {
	t.Helper()
	var keys []string
	for _, s := range servers {
		reply, err := s.Do("KEYS", "*")
		if err != nil {
			t.Fatalf("KEYS on %s: %v", s.Addr, err)
		}
		if reply != "" {
			keys = append(keys, strings.Split(reply, "\n")...)
		}
	}
	return keys
}

// TestRedisPerSecond: REDIS_PERSECOND=true (the reference README's two-Redis
// set-up) starts, on every topology, and counts per-second limits in the
// second Redis and every other limit in the first.
func TestRedisPerSecond(t *testing.T) {
	type topology struct {
		env     map[string]string // REDIS_TYPE and REDIS_URL without the prefix
		servers []*redistest.Server
	}
	single := func(t *testing.T) topology {
		s := redistest.Start(t)
		return topology{map[string]string{"TYPE": "SINGLE", "URL": s.Addr}, []*redistest.Server{s}}
	}
	cluster := func(t *testing.T) topology {
		nodes := redistest.StartCluster(t, 3)
		return topology{map[string]string{"TYPE": "cluster", "URL": nodes[0].Addr + "," + nodes[1].Addr}, nodes}
	}
	sentinel := func(t *testing.T) topology {
		st := redistest.StartSentinel(t)
		return topology{map[string]string{"TYPE": "sentinel", "URL": st.MasterName + "," + strings.Join(st.SentinelAddrs(), ",")},
			[]*redistest.Server{st.Master}}
	}
	for _, tc := range []struct {
		name            string
		main, perSecond func(*testing.T) topology
	}{
		{"single", single, single},
		{"sentinel main, cluster per-second", sentinel, cluster},
	} {
		t.Run(tc.name, func(t *testing.T) {
			main, ps := tc.main(t), tc.perSecond(t)
			env := writeConfig(t, map[string]string{"ps.yaml": perSecondConfig})
			env["REDIS_PERSECOND"] = "true"
			for k, v := range main.env {
				env["REDIS_"+k] = v
			}
			for k, v := range ps.env {
				env["REDIS_PERSECOND_"+k] = v
			}
			p := start(t, env)
			for i := range 4 {
				want := rlsv3.RateLimitResponse_OK
				if i == 3 {
					want = rlsv3.RateLimitResponse_OVER_LIMIT
				}
				resp := p.should(t, "ps", configtest.Desc("fast=a"), configtest.Desc("slow=b"))
				if got := resp.GetOverallCode(); got != want {
					t.Errorf("call %d: %v, want %v (%v)", i+1, got, want, resp)
				}
			}
			// Then each limit alone: three per-second calls, two hourly.
			for range 3 {
				p.should(t, "ps", configtest.Desc("fast=a"))
			}
			for range 2 {
				p.should(t, "ps", configtest.Desc("slow=c"))
			}
			// Each call with a limit of a side is one count (a fixed
			// window's INCRBY, plain or in the script) on that side's
			// Redis (on a Cluster, spread over its masters). The
			// per-second keys may have expired by now; the counts are
			// counted.
			// Each side's store also ran one INCRBY, by 0, in its
			// permission probe for the plain path (src/redis/plainprobe.go),
			// but on a Cluster, which keeps the function.
			calls := func(side topology) (n int) {
				for _, s := range side.servers {
					n += commandCalls(t, s, "incrby")
				}
				if side.env["TYPE"] != "cluster" {
					n--
				}
				return n
			}
			if got := calls(ps); got != 4+3 {
				t.Errorf("REDIS_PERSECOND_URL counted %d hits, want 7 (the per-second limit's)", got)
			}
			if got := calls(main); got != 4+2 {
				t.Errorf("REDIS_URL counted %d hits, want 6 (the hour limit's)", got)
			}
			mainKeys := keysOn(t, main.servers...)
			slow := 0
			for _, k := range mainKeys {
				if strings.Contains(k, "slow") {
					slow++
				}
			}
			if len(mainKeys) < 2 || len(mainKeys) > 4 || slow != len(mainKeys) {
				t.Errorf("REDIS_URL holds %q, want the hour limit's two counters alone (a key per window: an edge may split them)", mainKeys)
			}
			// Both stores export their series side by side.
			resp, err := http.Get("http://" + p.httpAddr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			metrics := readBody(resp)
			for _, want := range []string{`redis="main"`, `redis="per_second"`} {
				if !strings.Contains(metrics, want) {
					t.Errorf("/metrics has no series labelled %s", want)
				}
			}
		})
	}
}

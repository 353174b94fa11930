package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
)

// scaleYAML is a multi-tenant config: exact tenant values, prefix wildcards
// (org-N-*) and a key-only default, in block style.
func scaleYAML(exact, wild int) string {
	return scaleRules(exact, wild, "  - key: tenant\n    value: %s\n    rate_limit: {unit: hour, requests_per_unit: %d}\n")
}

// scaleFlowYAML is scaleYAML with one line per rule, as large generated
// configs are often written (about 88 bytes a rule).
func scaleFlowYAML(exact, wild int) string {
	return scaleRules(exact, wild, "  - {key: tenant, value: %s, rate_limit: {unit: hour, requests_per_unit: %d}}\n")
}

// scaleRules writes the rules, each with rule (a format of the value and
// the limit); the default's value is null.
func scaleRules(exact, wild int, rule string) string {
	var b strings.Builder
	b.WriteString("domain: scale\ndescriptors:\n")
	for i := range exact {
		fmt.Fprintf(&b, rule, fmt.Sprintf("t-%d", i), 1_000_000_000-i%7)
	}
	for i := range wild {
		fmt.Fprintf(&b, rule, fmt.Sprintf("org-%d-*", i), 1_000_000_000-i%5)
	}
	fmt.Fprintf(&b, rule, "null", 1_000_000_000)
	return b.String()
}

// scaleXDS serves scaleYAML's rules as one RateLimitConfig resource from
// an xDS server, and returns the environment that points the service at it.
func scaleXDS(b *testing.B, exact, wild int) map[string]string {
	x := startXDS(b, grpc.MaxSendMsgSize(64<<20))
	var ds []*rlconfv3.RateLimitDescriptor
	add := func(value string, rpu int) {
		ds = append(ds, &rlconfv3.RateLimitDescriptor{Key: "tenant", Value: value,
			RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_HOUR, RequestsPerUnit: uint32(rpu)}})
	}
	for i := range exact {
		add(fmt.Sprintf("t-%d", i), 1_000_000_000-i%7)
	}
	for i := range wild {
		add(fmt.Sprintf("org-%d-*", i), 1_000_000_000-i%5)
	}
	add("", 1_000_000_000)
	x.set(b, "rl-node", "1", &rlconfv3.RateLimitConfig{Name: "scale", Domain: "scale", Descriptors: ds})
	return map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": x.addr, "CONFIG_GRPC_XDS_NODE_ID": "rl-node",
		"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "100ms", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "67108864"}
}

// scaleTenants is how many exact values the exact requests name, whatever
// the config's size: the small config has 80, and the same number of
// counters on both sides leaves the config as the only difference (4,096
// tenants against 80 measured the store's working set as well).
const scaleTenants = 80

// scaleRequests are requests of one kind against a config of exact and
// wild rules: exact hits (scaleTenants values spread over the config's),
// wildcard hits, or values that fall through every wildcard to the default.
func scaleRequests(kind string, exact, wild int) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, 4096)
	for i := range out {
		var v string
		switch kind {
		case "exact":
			v = fmt.Sprintf("t-%d", rand.IntN(scaleTenants)*(exact/scaleTenants))
		case "wildcard":
			v = fmt.Sprintf("org-%d-user-%d", rand.IntN(wild), rand.IntN(1000))
		default:
			v = fmt.Sprintf("nobody-%d", rand.IntN(10000))
		}
		out[i] = &rlsv3.RateLimitRequest{Domain: "scale", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: v}}}}}
	}
	return out
}

// BenchmarkConfigScale (part of make bench) compares the service on the
// embedded store with a tiny config (100 rules) and a large one (100,000
// rules, 20,000 of them wildcards): start-up time, resident memory, and
// throughput for exact hits, wildcard hits and fall-through requests, the
// two targets taking turns.
func BenchmarkConfigScale(b *testing.B) {
	for range b.N {
		type cfg struct {
			name        string
			exact, wild int
			yaml        func(exact, wild int) string // nil: through xDS
			tg          loadTarget
		}
		cfgs := []*cfg{{name: "100 rules", exact: 80, wild: 20, yaml: scaleYAML},
			{name: "100,000 rules", exact: 80_000, wild: 20_000, yaml: scaleYAML},
			{name: "100,000 rules, a line each", exact: 80_000, wild: 20_000, yaml: scaleFlowYAML},
			{name: "100,000 rules through xDS", exact: 80_000, wild: 20_000}}
		check := filepath.Join(filepath.Dir(serverBin), "config-check")
		if out, err := exec.Command("go", "build", "-trimpath", "-o", check, "../cmd/config-check").CombinedOutput(); err != nil {
			b.Fatalf("build config-check: %v\n%s", err, out)
		}
		rows := []string{"| config | file | start-up to healthy | peak RSS | RSS after start-up | RSS when quiet | config-check |", "|---|---|---|---|---|---|---|"}
		for _, c := range cfgs {
			var env map[string]string
			var dir, size string
			if c.yaml != nil {
				env = writeConfig(b, map[string]string{"scale.yaml": c.yaml(c.exact, c.wild)})
				dir = filepath.Join(env["RUNTIME_ROOT"], "ratelimit", "config")
				info, _ := os.Stat(filepath.Join(dir, "scale.yaml"))
				size = fmt.Sprintf("%.1f MB", float64(info.Size())/1e6)
			} else {
				env = scaleXDS(b, c.exact, c.wild)
				size = "one resource"
			}
			env["BACKEND_TYPE"], env["LOG_LEVEL"] = "memory", "warn"
			began := time.Now()
			p := start(b, env)
			up := time.Since(began)
			rss := memKB(b, p, "VmRSS")
			time.Sleep(12 * time.Second) // a quiet spell: src/memtrim gives the load's garbage back
			quiet, peak := memKB(b, p, "VmRSS"), memKB(b, p, "VmHWM")
			checked := "n/a"
			if dir != "" {
				began = time.Now()
				if out, err := exec.Command(check, dir).CombinedOutput(); err != nil {
					b.Fatalf("config-check: %v\n%s", err, out)
				}
				checked = time.Since(began).Round(10 * time.Millisecond).String()
			}
			c.tg = loadTarget{name: c.name, addr: p.grpcAddr, debugAddr: p.debugAddr, pid: p.cmd.Process.Pid}
			rows = append(rows, fmt.Sprintf("| %s | %s | %v | %d MiB | %d MiB | %d MiB | %s |", c.name, size, up.Round(10*time.Millisecond),
				peak>>10, rss>>10, quiet>>10, checked))
		}
		rows = append(rows, "", "| requests | config | req/s | ratio to 100 rules (by turn) | p50 | p99 | CPU µs/req |", "|---|---|---|---|---|---|---|")
		for _, kind := range []string{"exact", "wildcard", "fall-through"} {
			sessions := make([]*loadSession, len(cfgs))
			for i, c := range cfgs {
				sessions[i] = newLoadSession(b, c.tg, loadSpec{name: kind})
				sessions[i].reqs = scaleRequests(kind, c.exact, c.wild)
			}
			samples := make([]sample, len(cfgs))
			turns := make([][]loadResult, len(cfgs))
			rounds := max(1, *loadRounds)
			slice := *loadDuration / time.Duration(rounds)
			for round := range rounds {
				for i, ls := range sessions {
					warm := 300 * time.Millisecond
					if round == 0 {
						warm = *loadWarmup
					}
					ls.run(b, warm, false)
					got := ls.run(b, slice, true)
					turns[i] = append(turns[i], got.result())
					samples[i].add(got)
				}
			}
			base := samples[0].result()
			for i, c := range cfgs {
				r := samples[i].result()
				spread := ""
				if i > 0 {
					spread = turnRange(turns[i], turns[0], func(x loadResult) float64 { return x.perSec })
				}
				rows = append(rows, fmt.Sprintf("| %s | %s | %.0f | %.2f%s | %v | %v | %.1f |", kind, c.name, r.perSec, r.perSec/base.perSec, spread,
					r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.cpuTarget))
				if r.errors > 0 {
					b.Errorf("%s on %s: %d errors", kind, c.name, r.errors)
				}
			}
		}
		fmt.Fprintln(os.Stdout, strings.Join(rows, "\n"))
	}
}

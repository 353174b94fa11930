package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/tlstest"
)

// BenchmarkRapidResetAttack measures what HTTP/2 rapid reset costs
// well-behaved clients: their throughput (10 callers, closed loop) alone
// and while four attackers open and reset streams as fast as they can,
// each redialling whenever the service closes its connection (and so
// waiting in its address's line while it cools down), on plaintext gRPC and on
// gRPC over TLS. Reported: both rates, their ratio, and the service's peak
// resident memory. Loopback only; every loop ends with -load.duration
// (attackers waiting in line, with the cooldown).
//
//	go test ./integration-test -run '^$' -bench RapidReset -benchtime 1x -args -load.duration=5s
func BenchmarkRapidResetAttack(b *testing.B) {
	b.Run("plaintext", func(b *testing.B) { rapidResetAttack(b, false) })
	b.Run("TLS", func(b *testing.B) { rapidResetAttack(b, true) })
}

func rapidResetAttack(b *testing.B, useTLS bool) {
	env := writeConfig(b, map[string]string{"it.yaml": basicConfig})
	var tlsCfg *tls.Config
	if useTLS {
		ca := tlstest.NewCA(b, "server-ca")
		crt, key := ca.Issue(b, "ratelimit", "ratelimit.local")
		dir := b.TempDir()
		env["GRPC_SERVER_USE_TLS"] = "true"
		env["GRPC_SERVER_TLS_CERT"] = tlstest.Write(b, dir, "tls.crt", crt)
		env["GRPC_SERVER_TLS_KEY"] = tlstest.Write(b, dir, "tls.key", key)
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(ca.PEM)
		tlsCfg = &tls.Config{RootCAs: roots, ServerName: "ratelimit.local"}
	}
	p := start(b, env)
	client := p.client()
	if useTLS {
		conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		client = rlsv3.NewRateLimitServiceClient(conn)
	}
	legit := func(d time.Duration) float64 {
		var n atomic.Int64
		var wg sync.WaitGroup
		end := time.Now().Add(d)
		for g := range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(end); i++ {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=legit", "n="+string(rune('a'+g))))})
					cancel()
					if err == nil {
						n.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		return float64(n.Load()) / d.Seconds()
	}
	// dialers: 4 neighbours that open a connection per call (each call
	// given 10 s), as many short-lived clients do; their share of calls
	// answered.
	dialers := func(d time.Duration) (ok, all int64) {
		var okN, allN atomic.Int64
		var wg sync.WaitGroup
		end := time.Now().Add(d)
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					creds := grpc.WithTransportCredentials(insecure.NewCredentials())
					if useTLS {
						creds = grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg))
					}
					conn, err := grpc.NewClient(p.grpcAddr, creds)
					if err != nil {
						b.Error(err)
						return
					}
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it",
						Descriptors: descs(configtest.Desc("user=dialer", "n="+string(rune('a'+g))))})
					cancel()
					conn.Close()
					allN.Add(1)
					if err == nil {
						okN.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		return okN.Load(), allN.Load()
	}
	d := *loadDuration
	alone := legit(d)

	// attack runs four attackers against addr while legit, then dialers,
	// measure.
	var dialOK, dialAll int64
	attack := func(addr string) (rate float64, closed int64) {
		stop := make(chan struct{})
		var attacks sync.WaitGroup
		var goaways atomic.Int64
		req := &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=attacker"))}
		for range 4 {
			attacks.Add(1)
			go func() {
				defer attacks.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					var c *h2
					var frames <-chan http2.Frame
					if useTLS {
						var err error
						if c, frames, err = tryDialH2TLS(b, addr, tlsCfg); err != nil {
							continue // waited in line until the handshake timed out
						}
					} else {
						c, frames = dialH2(b, addr)
					}
					go func() {
						for i := uint32(0); i < 100000; i++ {
							if c.call(2*i+1, req) != nil || c.reset(2*i+1) != nil {
								return
							}
						}
					}()
					for f := range frames {
						if _, ok := f.(*http2.GoAwayFrame); ok {
							goaways.Add(1)
						}
					}
					c.conn.Close()
				}
			}()
		}
		rate = legit(d)
		dialOK, dialAll = dialers(d)
		close(stop)
		attacks.Wait()
		return rate, goaways.Load()
	}
	under, closed := attack(p.grpcAddr)
	b.ReportMetric(float64(dialOK)/float64(max(dialAll, 1)), "dialers-answered")
	b.Logf("neighbours dialling per call: %d of %d calls answered", dialOK, dialAll)
	b.ReportMetric(alone, "legit-req/s-alone")
	b.ReportMetric(under, "legit-req/s-attacked")
	b.ReportMetric(under/alone, "ratio")
	b.ReportMetric(float64(closed), "attack-conns-closed")
	b.ReportMetric(float64(memKB(b, p, "VmHWM"))/1024, "peak-RSS-MiB")
}

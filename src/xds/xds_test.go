package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/escape"
	"github.com/openrls/ratelimit/src/reload"
	"github.com/openrls/ratelimit/src/tlstest"
)

// serveADS runs go-control-plane's own xDS server and snapshot cache on a
// free loopback port, with cb and opts, until the test ends.
func serveADS(t *testing.T, cb serverv3.Callbacks, opts ...grpc.ServerOption) (addr string, cache cachev3.SnapshotCache) {
	t.Helper()
	cache = cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	gs := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(context.Background(), cache, cb))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String(), cache
}

// startServer is serveADS whose nacks receives the error message of every
// NACK.
func startServer(t *testing.T) (addr string, cache cachev3.SnapshotCache, nacks <-chan string) {
	t.Helper()
	nackc := make(chan string, 1024)
	addr, cache = serveADS(t, serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, req *discoveryv3.DiscoveryRequest) error {
			if req.GetErrorDetail() != nil {
				select {
				case nackc <- req.GetErrorDetail().GetMessage():
				default: // a NACK storm: the test counting them has failed already
				}
			}
			return nil
		}})
	return addr, cache, nackc
}

func setConfig(t *testing.T, cache cachev3.SnapshotCache, version string, cfgs ...*rlconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.SetSnapshot(context.Background(), "node-1", snap); err != nil {
		t.Fatal(err)
	}
}

func limitConfig(rpu uint32, unit rlconfv3.RateLimitUnit) *rlconfv3.RateLimitConfig {
	return &rlconfv3.RateLimitConfig{Name: "web", Domain: "web", Descriptors: []*rlconfv3.RateLimitDescriptor{{
		Key: "user", RateLimit: &rlconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: rpu, Name: "per_user"},
		Descriptors: []*rlconfv3.RateLimitDescriptor{{Key: "path", Value: "/a", ShadowMode: true,
			RateLimit: &rlconfv3.RateLimitPolicy{Unlimited: true}}},
	}}}
}

func TestRunFollowsTheServer(t *testing.T) {
	addr, cache, nacks := startServer(t)
	installed := make(chan string, 16)
	rejected := make(chan error, 16)
	h := reload.NewHolder(func(c *config.Config, err error) {
		if err != nil {
			rejected <- err
			return
		}
		installed <- dump(c)
	})
	log := logrus.New()
	log.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{ServerURL: addr, NodeID: "node-1", RetryInterval: 50 * time.Millisecond, Logger: log,
			Install: h.Install})
	}()
	defer func() { cancel(); <-done }()

	expect := func(want string) {
		t.Helper()
		select {
		case got := <-installed:
			if !strings.Contains(got, want) {
				t.Fatalf("installed config:\n%s\nwant it to contain %q", got, want)
			}
		case err := <-rejected:
			t.Fatalf("config rejected: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatalf("no config installed within 10s, want %q", want)
		}
	}
	setConfig(t, cache, "1", limitConfig(5, rlconfv3.RateLimitUnit_MINUTE))
	expect(`web.user: 5 per minute, fixed_window, name "per_user"`)
	setConfig(t, cache, "2", limitConfig(9, rlconfv3.RateLimitUnit_HOUR))
	expect("web.user: 9 per hour")

	setConfig(t, cache, "3", limitConfig(1, rlconfv3.RateLimitUnit_UNKNOWN))
	select {
	case err := <-rejected:
		if !strings.Contains(err.Error(), `xds:web`) || !strings.Contains(err.Error(), `unknown unit "unknown"`) {
			t.Errorf("rejection = %v, want a positioned unknown-unit error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("invalid config not rejected within 10s")
	}
	// The snapshot cache resends a NACKed config at once; the client must
	// NACK the repeats with the same errors without validating (and logging)
	// each again.
	var first string
	for i := range 3 {
		select {
		case msg := <-nacks:
			if i == 0 {
				first = msg
			} else if msg != first {
				t.Errorf("NACK %d says %q, want the first one's %q", i+1, msg, first)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d NACKs within 10s, want the resent config NACKed again", i)
		}
	}
	if n := len(rejected); n != 0 {
		t.Errorf("the resent config was validated %d more times, want once", n)
	}
	if !strings.Contains(dump(h.Load()), "web.user: 9 per hour") {
		t.Errorf("after a rejected update, serving:\n%s\nwant the last good config", dump(h.Load()))
	}
	setConfig(t, cache, "4", limitConfig(3, rlconfv3.RateLimitUnit_SECOND))
	expect("web.user: 3 per second")
}

func TestRunReconnects(t *testing.T) {
	// Nothing listens at first: Run must keep trying, then pick up the
	// server once it appears on that address.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	installed := make(chan struct{}, 4)
	log := logrus.New()
	log.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{ServerURL: addr, NodeID: "node-1", RetryInterval: 20 * time.Millisecond, Logger: log,
			Install: func(build func() (*config.Config, error)) error {
				_, err := build()
				installed <- struct{}{}
				return err
			}})
	}()
	defer func() { cancel(); <-done }()

	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(context.Background(), cache, nil))
	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("address %s was taken meanwhile: %v", addr, err)
	}
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	setConfig(t, cache, "1", limitConfig(5, rlconfv3.RateLimitUnit_MINUTE))
	select {
	case <-installed:
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not reconnect and install within 15s")
	}
}

func TestRunOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "xds-ca")
	sc, sk := ca.Issue(t, "control-plane", "xds.internal")
	cc, ck := ca.Issue(t, "ratelimit")
	serverCert, err := tls.X509KeyPair(sc, sk)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	addr, cache := serveADS(t, nil, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{serverCert},
		ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})))
	setConfig(t, cache, "1", limitConfig(5, rlconfv3.RateLimitUnit_MINUTE))

	dial, err := TLSDialOption(TLSOptions{CAFile: tlstest.Write(t, dir, "ca.pem", ca.PEM), ServerName: "xds.internal",
		CertFile: tlstest.Write(t, dir, "c.pem", cc), KeyFile: tlstest.Write(t, dir, "c.key", ck)})
	if err != nil {
		t.Fatal(err)
	}
	installed := make(chan struct{}, 4)
	log := logrus.New()
	log.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{ServerURL: addr, NodeID: "node-1", RetryInterval: 20 * time.Millisecond, Logger: log,
			DialOptions: []grpc.DialOption{dial},
			Install: func(build func() (*config.Config, error)) error {
				_, err := build()
				installed <- struct{}{}
				return err
			}})
	}()
	defer func() { cancel(); <-done }()
	select {
	case <-installed:
	case <-time.After(10 * time.Second):
		t.Fatal("no config over mutual TLS within 10s")
	}
	if _, err := TLSDialOption(TLSOptions{CAFile: filepath.Join(dir, "missing.pem")}); err == nil {
		t.Error("TLSDialOption with a missing CA file: nil error")
	}
}

// TestRenderRoundTrip: what render writes parses back to exactly the
// resource's strings, whatever bytes they hold (quotes, backslashes, YAML
// indicators, line breaks, non-ASCII), nested and with every field.
func TestRenderRoundTrip(t *testing.T) {
	hostile := []string{`a"b`, `c\d`, "e\nf", "#g", "&h", "*i", "j: k", "- l", "{m}", "ü n", "\x7f", "'o'", " p ", "q\tr"}
	var ds []*rlconfv3.RateLimitDescriptor
	for i, v := range hostile {
		md, err := structpb.NewStruct(map[string]any{"owner": v, "n": float64(i), "nested": map[string]any{"v": v}})
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, &rlconfv3.RateLimitDescriptor{Key: "k" + v, Value: v, ShadowMode: i%2 == 0, DetailedMetric: i%3 == 0,
			QuotaMode: i%4 == 0, Metadata: md,
			RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: uint32(i + 1), Name: "n" + v,
				Replaces: []*rlconfv3.RateLimitReplace{{Name: "r" + v}}},
			Descriptors: []*rlconfv3.RateLimitDescriptor{{Key: "inner" + v, RateLimit: &rlconfv3.RateLimitPolicy{Unlimited: true}}}})
	}
	rc := &rlconfv3.RateLimitConfig{Name: "x", Domain: `dom"ain`, Descriptors: ds}
	f, err := config.Parse("xds:x", render(rc))
	if err != nil {
		t.Fatalf("%v\n%s", err, render(rc))
	}
	if f.Domain != rc.Domain || len(f.Descriptors) != len(ds) {
		t.Fatalf("domain %q, %d descriptors; want %q, %d", f.Domain, len(f.Descriptors), rc.Domain, len(ds))
	}
	for i, d := range f.Descriptors {
		want := ds[i]
		l := d.Limits[0]
		// Compared as JSON: YAML reads 1 as an int, structpb holds a float.
		got, _ := json.Marshal(d.Metadata)
		wantMD, _ := json.Marshal(want.Metadata.AsMap())
		if d.QuotaMode != want.QuotaMode || string(got) != string(wantMD) {
			t.Errorf("descriptor %d: quota_mode %v, metadata %v; want %v, %v", i, d.QuotaMode, d.Metadata, want.QuotaMode, want.Metadata.AsMap())
		}
		if d.Key != escape.String(want.Key) || d.Value != escape.String(want.Value) || d.ShadowMode != want.ShadowMode ||
			d.DetailedMetric != want.DetailedMetric || l.RequestsPerUnit != want.RateLimit.RequestsPerUnit ||
			l.Name != want.RateLimit.Name || len(l.Replaces) != 1 || l.Replaces[0] != want.RateLimit.Replaces[0].Name ||
			len(d.Descriptors) != 1 || d.Descriptors[0].Key != escape.String(want.Descriptors[0].Key) || !d.Descriptors[0].Limits[0].Unlimited {
			t.Errorf("descriptor %d = %+v (limit %+v), want %+v", i, d, l, want)
		}
		// Each descriptor on a line of its own: errors and /explain name it.
		if i > 0 && d.Line <= f.Descriptors[i-1].Descriptors[0].Line || d.Descriptors[0].Line <= d.Line {
			t.Errorf("descriptor %d at line %d, its child at %d: not a line each", i, d.Line, d.Descriptors[0].Line)
		}
	}
}

// dump is the config's WriteDump lines as one string.
func dump(c *config.Config) string {
	var b strings.Builder
	_ = c.WriteDump(&b)
	return b.String()
}

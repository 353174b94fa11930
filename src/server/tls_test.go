package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/openrls/ratelimit/src/tlstest"
)

func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	return serveHealth(t, grpc.Creds(credentials.NewTLS(cfg)))
}

// serveHealth runs a gRPC server with opts and the health service on a free
// loopback port and returns its address.
func serveHealth(t *testing.T, opts ...grpc.ServerOption) string {
	t.Helper()
	gs := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// call dials with the given client TLS config and makes one health check.
func call(addr string, cfg *tls.Config) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func clientConfig(t *testing.T, serverCA *tlstest.CA, cert, key []byte) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(serverCA.PEM)
	cfg := &tls.Config{RootCAs: pool, ServerName: "ratelimit.local"}
	if cert != nil {
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA, rogueCA := tlstest.NewCA(t, "server-ca"), tlstest.NewCA(t, "client-ca"), tlstest.NewCA(t, "rogue-ca")
	sc, sk := serverCA.Issue(t, "ratelimit", "ratelimit.local")
	cfg, err := newTLSConfig(TLSOptions{
		CertFile:     tlstest.Write(t, dir, "server.pem", sc),
		KeyFile:      tlstest.Write(t, dir, "server.key", sk),
		ClientCAFile: tlstest.Write(t, dir, "clients.pem", clientCA.PEM),
		ClientSAN:    "envoy.mesh",
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, cfg)
	good, goodKey := clientCA.Issue(t, "envoy", "envoy.mesh")
	wrongSAN, wrongSANKey := clientCA.Issue(t, "other", "other.mesh")
	rogue, rogueKey := rogueCA.Issue(t, "envoy", "envoy.mesh")
	tests := []struct {
		name string
		cfg  *tls.Config
		ok   bool
	}{
		{"no client certificate", clientConfig(t, serverCA, nil, nil), false},
		{"certificate from another CA", clientConfig(t, serverCA, rogue, rogueKey), false},
		{"right CA, wrong SAN", clientConfig(t, serverCA, wrongSAN, wrongSANKey), false},
		{"right certificate", clientConfig(t, serverCA, good, goodKey), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := call(addr, tc.cfg); (err == nil) != tc.ok {
				t.Errorf("call error = %v, want success %v", err, tc.ok)
			}
		})
	}
}

func TestServerCertificateReloads(t *testing.T) {
	dir := t.TempDir()
	oldCA, newCA := tlstest.NewCA(t, "old"), tlstest.NewCA(t, "new")
	c1, k1 := oldCA.Issue(t, "ratelimit", "ratelimit.local")
	certFile, keyFile := tlstest.Write(t, dir, "tls.crt", c1), tlstest.Write(t, dir, "tls.key", k1)
	cfg, err := newTLSConfig(TLSOptions{CertFile: certFile, KeyFile: keyFile}, 0)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, cfg)
	if err := call(addr, clientConfig(t, oldCA, nil, nil)); err != nil {
		t.Fatalf("before rotation: %v", err)
	}
	c2, k2 := newCA.Issue(t, "ratelimit", "ratelimit.local")
	tlstest.Write(t, dir, "tls.key", k2)
	tlstest.Write(t, dir, "tls.crt", c2)
	future := time.Now().Add(time.Minute) // make the change visible whatever the mtime granularity
	_ = os.Chtimes(certFile, future, future)
	if err := call(addr, clientConfig(t, newCA, nil, nil)); err != nil {
		t.Errorf("after rotation, a client trusting the new CA: %v", err)
	}
	if err := call(addr, clientConfig(t, oldCA, nil, nil)); err == nil {
		t.Errorf("after rotation, the old certificate is still served")
	}
}

func TestBrokenRotationKeepsServing(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "ca")
	c, k := ca.Issue(t, "ratelimit", "ratelimit.local")
	certFile := tlstest.Write(t, dir, "tls.crt", c)
	var reports []error
	var mu sync.Mutex
	cfg, err := newTLSConfig(TLSOptions{CertFile: certFile, KeyFile: tlstest.Write(t, dir, "tls.key", k),
		OnReloadError: func(err error) { mu.Lock(); reports = append(reports, err); mu.Unlock() }}, 0)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, cfg)
	tlstest.Write(t, dir, "tls.crt", []byte("half-written"))
	future := time.Now().Add(time.Minute)
	_ = os.Chtimes(certFile, future, future)
	for range 3 {
		if err := call(addr, clientConfig(t, ca, nil, nil)); err != nil {
			t.Errorf("with a broken certificate file on disk: %v, want the old certificate still served", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 1 {
		t.Errorf("a broken rotation, three handshakes: %d reports (%v), want exactly 1", len(reports), reports)
	}
}

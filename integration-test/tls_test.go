package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/tlstest"
)

// mtlsEnv is the env of a server with gRPC mTLS: its certificate from
// serverCA, client certificates required from clientCA.
func mtlsEnv(t *testing.T, dir string, serverCA, clientCA *tlstest.CA) map[string]string {
	t.Helper()
	sc, sk := serverCA.Issue(t, "ratelimit", "ratelimit.local")
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["GRPC_SERVER_USE_TLS"] = "true"
	env["GRPC_SERVER_TLS_CERT"] = tlstest.Write(t, dir, "tls.crt", sc)
	env["GRPC_SERVER_TLS_KEY"] = tlstest.Write(t, dir, "tls.key", sk)
	env["GRPC_CLIENT_TLS_CACERT"] = tlstest.Write(t, dir, "clients.pem", clientCA.PEM)
	return env
}

// clientTLS is a client's TLS config trusting serverCA, with a client
// certificate for envoy.mesh from clientCA unless it is nil.
func clientTLS(t *testing.T, serverCA, clientCA *tlstest.CA) *tls.Config {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(serverCA.PEM)
	cfg := &tls.Config{RootCAs: roots, ServerName: "ratelimit.local"}
	if clientCA != nil {
		c, k := clientCA.Issue(t, "envoy", "envoy.mesh")
		pair, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

func TestGRPCMutualTLS(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA, rogueCA := tlstest.NewCA(t, "server-ca"), tlstest.NewCA(t, "client-ca"), tlstest.NewCA(t, "rogue")
	env := mtlsEnv(t, dir, serverCA, clientCA)
	env["GRPC_CLIENT_TLS_SAN"] = "envoy.mesh"
	p := start(t, env)

	try := func(ca *tlstest.CA) error {
		conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS(t, serverCA, ca))))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=a"))})
		return err
	}
	if err := try(nil); err == nil {
		t.Error("a client without a certificate was served")
	}
	if err := try(rogueCA); err == nil {
		t.Error("a client with a certificate from another CA was served")
	}
	if err := try(clientCA); err != nil {
		t.Errorf("a client with the right certificate: %v", err)
	}

	// The HTTP port checks no client certificate, so POST /json, which
	// would answer anyone, is off while gRPC requires one.
	if code, body := postJSON(t, p, jsonUser); code != http.StatusForbidden || !strings.Contains(body, "JSON_ENDPOINT_ENABLED") {
		t.Errorf("POST /json under mTLS: %d %q, want 403 naming JSON_ENDPOINT_ENABLED", code, body)
	}

	// A rotation to garbage keeps the old certificate, and says so once.
	tlstest.Write(t, dir, "tls.crt", []byte("not a certificate"))
	future := time.Now().Add(time.Minute)
	_ = os.Chtimes(env["GRPC_SERVER_TLS_CERT"], future, future)
	eventually(t, "the broken rotation logged", func() bool {
		if err := try(clientCA); err != nil {
			t.Fatalf("after a rotation to garbage, a good client: %v, want the old certificate still served", err)
		}
		return strings.Contains(p.stderr.String(), "do not load")
	})
	if !strings.Contains(metricsBody(t, p), "ratelimit_tls_certificate_reload_errors_total 1") {
		t.Errorf("/metrics lacks ratelimit_tls_certificate_reload_errors_total 1")
	}
}

// TestJSONUnderMutualTLSWhenEnabled: JSON_ENDPOINT_ENABLED=true serves POST
// /json under mTLS (the operator's explicit choice).
func TestJSONUnderMutualTLSWhenEnabled(t *testing.T) {
	env := mtlsEnv(t, t.TempDir(), tlstest.NewCA(t, "server-ca"), tlstest.NewCA(t, "client-ca"))
	env["JSON_ENDPOINT_ENABLED"] = "true"
	p := start(t, env)
	if code, body := postJSON(t, p, jsonUser); code != http.StatusOK {
		t.Errorf("POST /json with JSON_ENDPOINT_ENABLED=true: %d %q, want 200", code, body)
	}
}

const jsonUser = `{"domain":"it","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}`

// TestRapidResetIsCutOffOverTLS: the HTTP/2 guard works on gRPC over TLS
// and mutual TLS as on plaintext (it watches the decrypted connection): a
// rapid-reset connection gets GOAWAY (ENHANCE_YOUR_CALM) and is closed, a
// well-behaved client (with its certificate, under mTLS) keeps being
// answered, and the guard counts the event.
func TestRapidResetIsCutOffOverTLS(t *testing.T) {
	for _, mutual := range []bool{false, true} {
		t.Run(map[bool]string{false: "TLS", true: "mutual TLS"}[mutual], func(t *testing.T) {
			dir := t.TempDir()
			serverCA, clientCA := tlstest.NewCA(t, "server-ca"), tlstest.NewCA(t, "client-ca")
			env := mtlsEnv(t, dir, serverCA, clientCA)
			env["GRPC_ABUSE_COOLDOWN"] = "2s"
			if mutual {
				env["GRPC_CLIENT_TLS_SAN"] = "envoy.mesh"
			} else {
				delete(env, "GRPC_CLIENT_TLS_CACERT")
			}
			p := start(t, env)
			var certCA *tlstest.CA
			if mutual {
				certCA = clientCA
			}
			cfg := clientTLS(t, serverCA, certCA)
			legit, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
			if err != nil {
				t.Fatal(err)
			}
			defer legit.Close()
			ask := func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, err := rlsv3.NewRateLimitServiceClient(legit).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=legit"))})
				return err
			}
			if err := ask(); err != nil {
				t.Fatalf("a well-behaved client before the attack: %v", err)
			}
			c, frames := dialH2TLS(t, p.grpcAddr, cfg)
			rapidReset(t, c, frames)
			if err := ask(); err != nil {
				t.Errorf("a well-behaved client after the attack: %v", err)
			}
			if m := metricsBody(t, p); !strings.Contains(m, `ratelimit_grpc_guard_total{event="rapid_reset"} 1`) {
				t.Errorf("metrics lack the rapid reset:\n%s", m)
			}
		})
	}
}

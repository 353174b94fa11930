package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/openrls/ratelimit/src/tlstest"
)

func TestGRPCMutualTLS(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA, rogueCA := tlstest.NewCA(t, "server-ca"), tlstest.NewCA(t, "client-ca"), tlstest.NewCA(t, "rogue")
	sc, sk := serverCA.Issue(t, "ratelimit", "ratelimit.local")
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["GRPC_SERVER_USE_TLS"] = "true"
	env["GRPC_SERVER_TLS_CERT"] = tlstest.Write(t, dir, "tls.crt", sc)
	env["GRPC_SERVER_TLS_KEY"] = tlstest.Write(t, dir, "tls.key", sk)
	env["GRPC_CLIENT_TLS_CACERT"] = tlstest.Write(t, dir, "clients.pem", clientCA.PEM)
	env["GRPC_CLIENT_TLS_SAN"] = "envoy.mesh"
	p := start(t, env)

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(serverCA.PEM)
	try := func(ca *tlstest.CA) error {
		cfg := &tls.Config{RootCAs: roots, ServerName: "ratelimit.local"}
		if ca != nil {
			c, k := ca.Issue(t, "envoy", "envoy.mesh")
			pair, err := tls.X509KeyPair(c, k)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(desc("user=a"))})
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
}

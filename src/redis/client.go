package redis

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/tlsclient"
)

// ClientOptions describes one Redis deployment, in the terms of the
// REDIS_* settings.
type ClientOptions struct {
	// URL is host:port (or a socket path with Network "unix") for "single",
	// "master-name,host:port,..." for "sentinel", "host:port,..." for
	// "cluster".
	URL          string
	Type         string // single, sentinel or cluster
	Network      string // tcp or unix; single only
	Auth         string // "password" or "user:password"
	SentinelAuth string // the same, for the sentinels
	TLS          *tls.Config
	PoolSize     int
	// PoolTimeout is how long a call waits for a free connection when all
	// PoolSize are busy (REDIS_POOL_ON_EMPTY_*); 0 means Timeout.
	PoolTimeout time.Duration
	// Timeout bounds dialing and every read and write.
	Timeout time.Duration
}

// NewClient builds the go-redis client for o. It neither retries commands
// nor redials within a call: a request that cannot be answered within the
// timeout is better answered Unavailable at once, and the next request tries
// again.
func NewClient(o ClientOptions) (goredis.UniversalClient, error) {
	user, pass := splitAuth(o.Auth)
	addrs := splitList(o.URL)
	if len(addrs) == 0 {
		return nil, errors.New("redis: empty URL")
	}
	t, pt := o.Timeout, o.PoolTimeout
	if pt <= 0 {
		pt = t
	}
	switch o.Type {
	case "", "single":
		if len(addrs) != 1 {
			return nil, fmt.Errorf("redis: single wants one address, got %q", o.URL)
		}
		network := o.Network
		if network == "" {
			network = "tcp"
		}
		return goredis.NewClient(&goredis.Options{Network: network, Addr: addrs[0], Username: user, Password: pass,
			TLSConfig: o.TLS, PoolSize: o.PoolSize, PoolTimeout: pt, DialTimeout: t, ReadTimeout: t, WriteTimeout: t,
			ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1}), nil
	case "sentinel":
		if len(addrs) < 2 {
			return nil, fmt.Errorf("redis: sentinel wants master-name,host:port[,...], got %q", o.URL)
		}
		suser, spass := splitAuth(o.SentinelAuth)
		return goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: addrs[0], SentinelAddrs: addrs[1:],
			SentinelUsername: suser, SentinelPassword: spass, Username: user, Password: pass, TLSConfig: o.TLS,
			PoolSize: o.PoolSize, PoolTimeout: pt, DialTimeout: t, ReadTimeout: t, WriteTimeout: t,
			ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1}), nil
	case "cluster":
		return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, Username: user, Password: pass,
			TLSConfig: o.TLS, PoolSize: o.PoolSize, PoolTimeout: pt, DialTimeout: t, ReadTimeout: t, WriteTimeout: t,
			ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1}), nil
	}
	return nil, fmt.Errorf("redis: unknown type %q", o.Type)
}

// splitAuth splits "user:password"; a value without a colon is a password.
func splitAuth(s string) (user, pass string) {
	if u, p, ok := strings.Cut(s, ":"); ok {
		return u, p
	}
	return "", s
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// TLSConfig builds the client TLS config from PEM files. caFile empty means
// the system roots; certFile and keyFile go together. skipHostname verifies
// the chain but not the server name (REDIS_TLS_SKIP_HOSTNAME_VERIFICATION).
func TLSConfig(caFile, certFile, keyFile string, skipHostname bool) (*tls.Config, error) {
	cfg, err := tlsclient.Config(caFile, certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	if skipHostname {
		roots := cfg.RootCAs
		cfg.InsecureSkipVerify = true // replaced by the chain check below
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("redis: server sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
			return err
		}
	}
	return cfg, nil
}

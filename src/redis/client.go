package redis

import (
	"context"
	"crypto/tls"
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
	// URL is an address (see Address: host:port, a redis:// URL, or a
	// socket path with Network "unix") for "single",
	// "master-name,address,..." for "sentinel", "address,..." for
	// "cluster".
	URL          string
	Type         string // single, sentinel or cluster
	Network      string // tcp or unix; single only
	Auth         string // "password" or "user:password"; wins over a URL's
	SentinelAuth string // the same, for the sentinels
	// Credentials, when set, is asked for the user and password of every
	// new connection (REDIS_AUTH_FILE), in place of Auth: a rotated
	// secret applies without a restart. A user it leaves empty is the
	// URL's.
	Credentials func(ctx context.Context) (user, pass string, err error)
	// MaxConnAge closes a connection this long after it was made (0:
	// never): ElastiCache ends IAM-authenticated ones after 12 hours.
	MaxConnAge time.Duration
	TLS        *tls.Config
	PoolSize   int
	// PoolTimeout is how long a call waits for a free connection when all
	// PoolSize are busy (REDIS_POOL_ON_EMPTY_*); 0 means Timeout.
	PoolTimeout time.Duration
	// Timeout bounds dialing and every read and write.
	Timeout time.Duration
}

// deployment is what ClientOptions' URL names, its addresses read.
type deployment struct {
	master     string // sentinel only
	addrs      []string
	user, pass string // the first URL's credentials
	db         int
	tls        bool // a rediss:// URL
}

// deployment reads o's URL: its addresses (redis:// URLs read), the
// credentials and database the URLs give, checked for o's Type and
// Network. The error never holds a password.
func (o ClientOptions) deployment() (deployment, error) {
	var d deployment
	list := splitList(o.URL)
	if len(list) == 0 {
		return d, errors.New("empty")
	}
	network := o.Network
	switch o.Type {
	case "", "single":
		if len(list) != 1 {
			return d, fmt.Errorf("single wants one address, got %q", MaskURL(o.URL))
		}
	case "sentinel":
		if len(list) < 2 {
			return d, fmt.Errorf("sentinel wants master-name,host:port[,...], got %q", MaskURL(o.URL))
		}
		d.master, list = list[0], list[1:]
		network = "tcp"
	case "cluster":
		network = "tcp"
	default:
		return d, fmt.Errorf("unknown type %q", o.Type)
	}
	if network == "" {
		network = "tcp"
	}
	seen := false
	for i, s := range list {
		a, err := ParseAddress(s)
		if err == nil {
			err = checkAddress(a, network)
		}
		if err != nil {
			return d, err
		}
		d.addrs = append(d.addrs, a.Addr)
		if !a.URL {
			continue
		}
		if !seen {
			d.user, d.pass, d.db, d.tls, seen = a.User, a.Password, a.DB, a.TLS, true
		} else if a.User != d.user || a.Password != d.pass || a.DB != d.db || a.TLS != d.tls {
			return d, fmt.Errorf("address %d (%s) has other credentials, database or scheme than the first URL: one deployment has one of each", i+1, MaskURL(s))
		}
	}
	if o.Type == "cluster" && d.db != 0 {
		return d, fmt.Errorf("database %d: Redis Cluster has database 0 only", d.db)
	}
	return d, nil
}

// NewClient builds the go-redis client for o. It neither retries commands
// nor redials within a call: a request that cannot be answered within the
// timeout is better answered Unavailable at once, and the next request tries
// again.
func NewClient(o ClientOptions) (goredis.UniversalClient, error) {
	d, err := o.deployment()
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	user, pass := splitAuth(o.Auth)
	// As in the reference: REDIS_AUTH's user and password each win over
	// the URL's.
	if user == "" {
		user = d.user
	}
	if pass == "" {
		pass = d.pass
	}
	tlsCfg := o.TLS
	if tlsCfg == nil && d.tls {
		if tlsCfg, err = TLSConfig("", "", "", false); err != nil {
			return nil, fmt.Errorf("redis: rediss://: %w", err)
		}
	}
	var creds func(ctx context.Context) (string, string, error)
	if o.Credentials != nil {
		creds = func(ctx context.Context) (string, string, error) {
			u, p, err := o.Credentials(ctx)
			if u == "" {
				u = d.user
			}
			return u, p, err
		}
	}
	t, pt := o.Timeout, o.PoolTimeout
	if pt <= 0 {
		pt = t
	}
	switch o.Type {
	case "sentinel":
		// A sentinel's own credentials are SENTINEL_AUTH's; the URLs'
		// are the master's, as its database.
		suser, spass := splitAuth(o.SentinelAuth)
		return goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: d.master, SentinelAddrs: d.addrs,
			SentinelUsername: suser, SentinelPassword: spass, Username: user, Password: pass, CredentialsProviderContext: creds,
			DB: d.db, TLSConfig: tlsCfg, PoolSize: o.PoolSize, ConnMaxLifetime: o.MaxConnAge, PoolTimeout: pt, DialTimeout: t, ReadTimeout: t, WriteTimeout: t,
			ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1}), nil
	case "cluster":
		return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: d.addrs, Username: user, Password: pass,
			CredentialsProviderContext: creds, ConnMaxLifetime: o.MaxConnAge, TLSConfig: tlsCfg, PoolSize: o.PoolSize, PoolTimeout: pt, DialTimeout: t, ReadTimeout: t, WriteTimeout: t,
			ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1}), nil
	}
	network := o.Network
	if network == "" {
		network = "tcp"
	}
	return goredis.NewClient(&goredis.Options{Network: network, Addr: d.addrs[0], Username: user, Password: pass,
		CredentialsProviderContext: creds, ConnMaxLifetime: o.MaxConnAge, DB: d.db, TLSConfig: tlsCfg, PoolSize: o.PoolSize, PoolTimeout: pt, DialTimeout: t, ReadTimeout: t, WriteTimeout: t,
		ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1}), nil
}

// Check reports what is wrong with o's URL for its type and network, or
// nil: the settings' check at start-up, before any dial.
func (o ClientOptions) Check() error {
	_, err := o.deployment()
	return err
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
		tlsclient.SkipHostname(cfg)
	}
	return cfg, nil
}

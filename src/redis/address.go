package redis

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Address is one address of a REDIS_URL list: host:port (or a socket
// path), or a redis:// URL as envoyproxy/ratelimit's Redis client reads
// it: redis://[user[:password]@]host[:port][/db][?username=&password=&db=],
// the path's database winning over db= and the user info over the query.
// rediss:// is the same over TLS.
type Address struct {
	Addr string // host:port, or a socket path
	// User and Password are the URL's credentials; REDIS_AUTH, when set,
	// wins over each (as in the reference, where an explicit AUTH is
	// never replaced by the URL's).
	User, Password string
	DB             int
	TLS            bool // rediss://
	URL            bool // written as a URL
}

// defaultPort is Redis's, for a URL without one.
const defaultPort = "6379"

// ParseAddress reads one address. A plain address is taken as it is
// written (its network decides what it must look like, see checkAddress);
// a URL that cannot be read is an error naming what is wrong, never with
// its password.
func ParseAddress(s string) (Address, error) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return Address{Addr: s}, nil
	}
	a := Address{URL: true}
	switch strings.ToLower(scheme) {
	case "redis":
	case "rediss":
		a.TLS = true
	default:
		return a, fmt.Errorf("%s: unknown scheme %q (want redis:// or rediss://, or host:port)", MaskURL(s), scheme)
	}
	u, err := url.Parse("redis://" + rest)
	if err != nil {
		// url's errors quote the whole URL, password included.
		return a, fmt.Errorf("%s: not a valid URL", MaskURL(s))
	}
	if u.Host == "" {
		return a, fmt.Errorf("%s: no host", MaskURL(s))
	}
	a.Addr = u.Host
	if u.Port() == "" {
		a.Addr = net.JoinHostPort(u.Hostname(), defaultPort)
	} else if p, err := strconv.ParseUint(u.Port(), 10, 16); err != nil || p == 0 {
		return a, fmt.Errorf("%s: port %q is not a port number", MaskURL(s), u.Port())
	}
	q := u.Query()
	a.User, a.Password = q.Get("username"), q.Get("password")
	if n := u.User.Username(); n != "" {
		a.User = n
	}
	if p, ok := u.User.Password(); ok {
		a.Password = p
	}
	db := q.Get("db")
	if u.Path != "" && u.Path != "/" {
		db = strings.TrimPrefix(u.Path, "/")
	}
	if db != "" {
		n, err := strconv.ParseUint(db, 10, 31)
		if err != nil {
			return a, fmt.Errorf("%s: database %q is not a number", MaskURL(s), db)
		}
		a.DB = int(n)
	}
	return a, nil
}

// WantsTLS reports whether a REDIS_URL value names a rediss:// address:
// the TLS settings (REDIS_TLS_CACERT, ...) then apply without REDIS_TLS.
func WantsTLS(list string) bool {
	for _, s := range splitList(list) {
		if a, err := ParseAddress(s); err == nil && a.TLS {
			return true
		}
	}
	return false
}

// checkAddress checks a plain address for its network: host:port with a
// port number for tcp, a non-empty path for unix. An address that can
// never be dialed is a settings error, not a Redis that is not up yet.
func checkAddress(a Address, network string) error {
	if network == "unix" {
		if a.URL {
			return fmt.Errorf("%s is a TCP address (a URL), but the socket type is unix", a.Addr)
		}
		if a.Addr == "" {
			return fmt.Errorf("empty socket path")
		}
		return nil
	}
	_, port, err := net.SplitHostPort(a.Addr)
	if err != nil {
		return fmt.Errorf("%q: want host:port or redis://host:port (%v)", a.Addr, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("%q: port %q is not a port number", a.Addr, port)
	}
	return nil
}

// MaskURL returns s, a REDIS_URL value (a list, a URL or an address),
// with every password it holds replaced by "****": it goes to logs and
// errors.
func MaskURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = maskOne(p)
	}
	return strings.Join(parts, ",")
}

func maskOne(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	// The user info ends at the last @ before the path or query.
	end := len(rest)
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		end = i
	}
	if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
		if user, _, hasPass := strings.Cut(rest[:at], ":"); hasPass {
			rest = user + ":****" + rest[at:]
		}
	}
	if q := strings.IndexByte(rest, '?'); q >= 0 {
		params := strings.Split(rest[q+1:], "&")
		for i, kv := range params {
			k, _, _ := strings.Cut(kv, "=")
			if key, err := url.QueryUnescape(k); err != nil || strings.EqualFold(key, "password") {
				params[i] = k + "=****"
			}
		}
		rest = rest[:q+1] + strings.Join(params, "&")
	}
	return scheme + "://" + rest
}

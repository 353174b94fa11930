package memcache

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"sort"
	"strconv"
	"time"
)

// LookupSRV is how SRV records are read: net.Resolver.LookupSRV's shape.
type LookupSRV func(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)

// srvName is MEMCACHE_SRV's form, _service._proto.name, as the reference
// reads it.
var srvName = regexp.MustCompile(`^_(.+?)\._(.+?)\.(.+)$`)

// CheckSRV reports whether name is an SRV name this store can look up.
func CheckSRV(name string) error {
	if !srvName.MatchString(name) {
		return fmt.Errorf("%q: want _service._proto.name", name)
	}
	return nil
}

// SRVServers looks name up and returns its targets as host:port, sorted:
// the servers' order decides which holds a key, and DNS answers in any
// order (the reference sorts them the same way).
func SRVServers(ctx context.Context, lookup LookupSRV, name string) ([]string, error) {
	m := srvName.FindStringSubmatch(name)
	if m == nil {
		return nil, fmt.Errorf("memcache: SRV %w", CheckSRV(name))
	}
	_, recs, err := lookup(ctx, m[1], m[2], m[3])
	if err != nil {
		return nil, fmt.Errorf("memcache: SRV %s: %w", name, err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("memcache: SRV %s: no records", name)
	}
	out := make([]string, 0, len(recs))
	for _, r := range recs {
		out = append(out, net.JoinHostPort(r.Target, strconv.Itoa(int(r.Port))))
	}
	sort.Strings(out)
	return out, nil
}

// WatchSRV looks name up again every interval until ctx ends and sets the
// servers it finds; a failed lookup keeps the servers there are and is
// told to failed.
func (s *Store) WatchSRV(ctx context.Context, lookup LookupSRV, name string, interval time.Duration, failed func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		servers, err := SRVServers(ctx, lookup, name)
		if err == nil {
			err = s.SetServers(servers...)
		}
		if err != nil && ctx.Err() == nil {
			failed(err)
		}
	}
}

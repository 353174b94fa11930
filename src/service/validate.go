package service

import (
	"errors"
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Limits bounds what one request may hold, so that no request can make the
// service do unbounded work or build unbounded keys.
type Limits struct {
	MaxDescriptors int // per request
	MaxEntries     int // per descriptor
	// MaxStringBytes bounds a domain or key. Values are not bounded here:
	// they come from the client (a header, the path), and refusing a call
	// lets it through, since Envoy meets a failed call with its failure
	// mode, open by default. Counter keys and metric names hash long values
	// (package config), and gRPC bounds the message.
	MaxStringBytes int
	// MaxHits bounds a descriptor's hits_addend (a request's is 32 bits):
	// a cost no limit could hold is a client's mistake, and would swamp
	// the counters and metrics.
	MaxHits uint64
	// MaxKeys bounds the store keys one request touches: the limits its
	// descriptors match, summed. One request must not be able to hold the
	// store (and every request batched with it) for long.
	MaxKeys int
}

// DefaultLimits are generous for any Envoy route config and still small
// enough to keep a request cheap. MaxHits leaves room for usage reports in
// bytes or tokens far past any 32-bit limit (overdraft counts them).
var DefaultLimits = Limits{MaxDescriptors: 64, MaxEntries: 32, MaxStringBytes: 4096, MaxHits: 1 << 40, MaxKeys: 256}

func (l Limits) withDefaults() Limits {
	if l.MaxDescriptors <= 0 {
		l.MaxDescriptors = DefaultLimits.MaxDescriptors
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultLimits.MaxEntries
	}
	if l.MaxStringBytes <= 0 {
		l.MaxStringBytes = DefaultLimits.MaxStringBytes
	}
	if l.MaxHits == 0 {
		l.MaxHits = DefaultLimits.MaxHits
	}
	if l.MaxKeys <= 0 {
		l.MaxKeys = DefaultLimits.MaxKeys
	}
	return l
}

// validate reports the first thing wrong with req, phrased for the caller.
func validate(req *rlsv3.RateLimitRequest, lim Limits) error {
	switch d := req.GetDomain(); {
	case d == "":
		return errors.New("domain is empty")
	case len(d) > lim.MaxStringBytes:
		return fmt.Errorf("domain is %d bytes long, at most %d allowed", len(d), lim.MaxStringBytes)
	}
	descs := req.GetDescriptors()
	switch {
	case len(descs) == 0:
		return errors.New("no descriptors")
	case len(descs) > lim.MaxDescriptors:
		return fmt.Errorf("%d descriptors, at most %d allowed", len(descs), lim.MaxDescriptors)
	}
	for i, d := range descs {
		// A descriptor without entries matches nothing and is answered OK,
		// as the reference answers it: the request's other descriptors are
		// still limited (Envoy sends one when an action found no value).
		if len(d.GetEntries()) > lim.MaxEntries {
			return fmt.Errorf("descriptors[%d] has %d entries, at most %d allowed", i, len(d.GetEntries()), lim.MaxEntries)
		}
		for j, e := range d.GetEntries() {
			switch {
			case e.GetKey() == "":
				return fmt.Errorf("descriptors[%d].entries[%d].key is empty", i, j)
			case len(e.GetKey()) > lim.MaxStringBytes:
				return fmt.Errorf("descriptors[%d].entries[%d].key is %d bytes long, at most %d allowed", i, j, len(e.GetKey()), lim.MaxStringBytes)
			}
		}
		if h := d.GetHitsAddend(); h != nil && h.GetValue() > lim.MaxHits {
			return fmt.Errorf("descriptors[%d].hits_addend is %d, at most %d allowed (REQUEST_MAX_HITS)", i, h.GetValue(), lim.MaxHits)
		}
		if o := d.GetLimit(); o != nil {
			if o.GetUnit() == typev3.RateLimitUnit_UNKNOWN {
				return fmt.Errorf("descriptors[%d].limit.unit is UNKNOWN", i)
			}
			if m := o.GetUnitMultiplier(); m != nil && m.GetValue() == 0 {
				return fmt.Errorf("descriptors[%d].limit.unit_multiplier is 0", i)
			}
		}
	}
	return nil
}

package config

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// Counter keys
//
// A key is "{" domain entries... "}" ":" identity, where every string field is
// written as <byte length><tag><text>. The length prefix makes the encoding
// injective whatever bytes the values hold: ("a_b","c") and ("a","b_c") can
// never meet. The tag tells what the text is:
//
//	':' the value itself
//	'#' the first 128 bits of the value's SHA-256, in hex, for values longer
//	    than MaxRawField bytes, so keys stay bounded, and for every value
//	    under CACHE_KEY_HASH_VALUES or hash_value, so personal data (IPs,
//	    user ids, API keys) never appears in Redis
//	'*' a shared wildcard pattern (share_threshold): every value matching it
//	    counts on one key
//	'%' a hashed shared pattern
//
// The braces are a Redis Cluster hash tag: every limit of one descriptor value
// lands in one slot. The identity after them names the limit (algorithm and
// period in seconds), not its amount, so raising requests_per_unit keeps the
// count. Stores prepend their own prefix and format version.

// MaxRawField is the longest field written as itself in a key; longer ones are
// hashed.
const MaxRawField = 128

func appendField(b []byte, s string, raw, hashed byte, forceHash bool) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	if len(s) <= MaxRawField && !forceHash {
		b = append(b, raw)
		return append(b, s...)
	}
	return appendHash(append(b, hashed), s)
}

// appendHash appends the first 128 bits of s's SHA-256, in hex: how keys
// and metric names hold a value too long (or too private) to hold as is.
func appendHash(b []byte, s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return hex.AppendEncode(b, sum[:16])
}

func appendKeyStart(b []byte, domain string) []byte {
	b = append(b, '{')
	return appendField(b, domain, ':', '#', false)
}

// appendKeyEntry appends one entry; hash forces the value's hashed form
// (CACHE_KEY_HASH_VALUES, hash_value), so personal data never reaches Redis.
func appendKeyEntry(b []byte, n *Node, key, value string, hash bool) []byte {
	b = appendField(b, key, ':', '#', false)
	if n != nil && n.shareThreshold {
		return appendField(b, n.value, '*', '%', false)
	}
	return appendField(b, value, ':', '#', hash || n != nil && n.hashValue)
}

func appendKeyEnd(b []byte) []byte { return append(b, '}', ':') }

func appendIdentity(b []byte, l *Limit) []byte { return append(b, l.identity...) }

// Values renders a matched request descriptor's entries as its counter key
// holds them, for operators' eyes ("key=value,key2=value2"): a value the
// key hashes (CACHE_KEY_HASH_VALUES, hash_value, or longer than MaxRawField)
// appears only as '#' and its hash, a shared wildcard as its pattern, so
// that whatever shows request values shows no more than Redis holds.
// Entries past what the config matches appear as sent.
func (d *Domain) Values(entries []*rlv3.RateLimitDescriptor_Entry) string {
	var b []byte
	var lv *level
	if d != nil {
		lv = &d.root
	}
	for i, e := range entries {
		var n *Node
		if lv != nil {
			if n = lv.find(e.GetKey(), e.GetValue()); n != nil {
				lv = &n.children
			} else {
				lv = nil
			}
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(append(b, e.GetKey()...), '=')
		v := e.GetValue()
		switch {
		case n != nil && n.shareThreshold:
			b = append(b, n.value...)
		case len(v) > MaxRawField || d != nil && d.hashValues || n != nil && n.hashValue:
			b = appendHash(append(b, '#'), v)
		default:
			b = append(b, v...)
		}
	}
	return string(b)
}

package config

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
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
//	    than maxRawField bytes, so keys stay bounded, and for every value
//	    under CACHE_KEY_HASH_VALUES or hash_value, so personal data (IPs,
//	    user ids, API keys) never appears in Redis
//	'*' a shared wildcard pattern (share_threshold): every value matching it
//	    counts on one key
//	'%' a hashed shared pattern
//
// The braces group every limit of one descriptor value, so that a store that
// shards by key keeps a group together (Redis Cluster reads them as a hash
// tag: one slot). They are written here, not by a store, because they are part
// of the one key format every store has always written: a store adding them
// itself would have to find the group's end in a key again, and any other
// spelling would count anew from the first replica upgraded. The identity
// after them names the limit (algorithm and period in seconds), not its
// amount, so raising requests_per_unit keeps the count. Stores prepend their
// own prefix and format version, and name per-window state under the key
// (limiter.WindowKey).

// maxRawField is the longest field written as itself in a key; longer ones are
// hashed.
const maxRawField = 128

func appendField(b []byte, s string, raw, hashed byte, forceHash bool) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	if len(s) <= maxRawField && !forceHash {
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

// Values writes a request descriptor's entries as its counter key holds
// them, for operators' eyes ("key=value,key2=value2"), read back from the
// key its plan encoded (so the request is not matched again): a value the
// key hashes (CACHE_KEY_HASH_VALUES, hash_value, or longer than
// MaxRawField) appears only as '#' and its hash, a shared wildcard as its
// pattern, so that whatever shows request values shows no more than Redis
// holds. Entries past what the config matches appear as sent.
func (p *Plan) Values(i int) string {
	d := &p.Descs[i]
	k := p.keyBuf[d.keyStart:d.keyEnd]
	if len(k) < 2 || k[0] != '{' {
		return ""
	}
	k = k[1:]
	field := func() (tag byte, text []byte, ok bool) {
		n := 0
		for len(k) > 0 && k[0] >= '0' && k[0] <= '9' {
			n, k = n*10+int(k[0]-'0'), k[1:]
		}
		if len(k) == 0 {
			return 0, nil, false
		}
		tag, k = k[0], k[1:]
		if tag == '#' || tag == '%' {
			n = 32 // a hash: 128 bits in hex
		}
		if n < 0 || n > len(k) { // n < 0: a length past int, which the encoder never writes
			return 0, nil, false
		}
		text, k = k[:n], k[n:]
		return tag, text, true
	}
	if _, _, ok := field(); !ok { // the domain
		return ""
	}
	var b []byte
	for len(k) > 0 && k[0] != '}' {
		_, key, ok1 := field()
		tag, value, ok2 := field()
		if !ok1 || !ok2 {
			break
		}
		if len(b) > 0 {
			b = append(b, ',')
		}
		b = append(append(b, key...), '=')
		if tag == '#' || tag == '%' {
			b = append(b, '#')
		}
		b = append(b, value...)
	}
	return string(b)
}

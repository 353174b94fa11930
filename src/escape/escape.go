// Package escape maps any byte string onto valid UTF-8, one to one, for the
// domains, keys and values of requests and configs.
//
// A request may hold bytes that are not UTF-8 (Envoy copies header bytes as
// they come, and HTTP allows bytes above 0x7F in header values), but a
// protobuf string, a metric label and a log line must be UTF-8. Writing such
// a byte as \xNN alone would let the four characters `\xff` and the byte
// 0xFF share one counter. So every string that holds a backslash or a byte
// that is not UTF-8 is escaped whole: a backslash becomes `\\` and such a
// byte `\xNN`. Every other string, which is nearly every string, stays as it
// is. An escaped string always holds a backslash and a plain one never
// does, and an escaped one reads back unambiguously, so no two distinct
// inputs share an output.
package escape

import (
	"strings"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const hex = "0123456789abcdef"

// Needed reports whether s is not left as it is: it holds a backslash or a
// byte that is not UTF-8.
func Needed(s string) bool {
	return strings.IndexByte(s, '\\') >= 0 || !utf8.ValidString(s)
}

// String returns s escaped, or s itself when nothing needs escaping (no
// allocation).
func String(s string) string {
	if !Needed(s) {
		return s
	}
	return string(Append(make([]byte, 0, len(s)+8), s))
}

// Append appends the escaped form of s to b (whether or not Needed).
func Append(b []byte, s string) []byte {
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, '\\', 'x', hex[s[0]>>4], hex[s[0]&0xf])
		case r == '\\':
			b = append(b, '\\', '\\')
		default:
			b = append(b, s[:size]...)
		}
		s = s[size:]
	}
	return b
}

// Unescape returns what String was given to return s, and whether s is a
// possible output of String.
func Unescape(s string) (string, bool) {
	if strings.IndexByte(s, '\\') < 0 {
		return s, utf8.ValidString(s)
	}
	var b []byte
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b = append(b, s[i])
			continue
		}
		switch {
		case i+1 < len(s) && s[i+1] == '\\':
			b = append(b, '\\')
			i++
		case i+3 < len(s) && s[i+1] == 'x' && strings.IndexByte(hex, s[i+2]) >= 0 && strings.IndexByte(hex, s[i+3]) >= 0:
			b = append(b, byte(strings.IndexByte(hex, s[i+2])<<4|strings.IndexByte(hex, s[i+3])))
			i += 3
		default:
			return "", false
		}
	}
	out := string(b)
	// A \xNN that stands for a byte that is UTF-8 in place is not an output
	// of String, which writes such bytes as themselves.
	return out, String(out) == s
}

// Request escapes, in place, the domain and every entry's key and value of
// a request that decoded as valid protobuf (so as valid UTF-8): only
// strings with a backslash change. The gRPC codec calls it on every
// request, and the JSON endpoint too, so that both count a value alike.
func Request(req *rlsv3.RateLimitRequest) {
	if req == nil {
		return
	}
	if Needed(req.Domain) {
		req.Domain = String(req.Domain)
	}
	for _, d := range req.Descriptors {
		for _, e := range d.GetEntries() {
			if Needed(e.Key) {
				e.Key = String(e.Key)
			}
			if Needed(e.Value) {
				e.Value = String(e.Value)
			}
		}
	}
}

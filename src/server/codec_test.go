package server

import (
	"bytes"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/openrls/ratelimit/src/escape"
)

// wireWith marshals req, then swaps each placeholder for the raw bytes that
// proto.Marshal would refuse (same length, so lengths stay right).
func wireWith(t *testing.T, req *rlsv3.RateLimitRequest, swaps ...string) []byte {
	t.Helper()
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(swaps); i += 2 {
		if !bytes.Contains(b, []byte(swaps[i])) {
			t.Fatalf("placeholder %q not in the wire form", swaps[i])
		}
		b = bytes.Replace(b, []byte(swaps[i]), []byte(swaps[i+1]), 1)
	}
	return b
}

func entry(k, v string) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
}

func TestLenientCodec(t *testing.T) {
	tests := []struct {
		name    string
		wire    func(t *testing.T) []byte
		want    *rlsv3.RateLimitRequest // nil: want an error
		changed bool
	}{
		{"valid, untouched",
			func(t *testing.T) []byte {
				return wireWith(t, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{entry("user", "café")}, HitsAddend: 2})
			},
			&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{entry("user", "café")}, HitsAddend: 2}, false},
		{"valid with a backslash, escaped so that it cannot meet an escaped byte",
			func(t *testing.T) []byte {
				return wireWith(t, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{entry("user", `\xff`)}})
			},
			&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{entry("user", `\\xff`)}}, false},
		{"the byte 0xFF beside a backslash elsewhere: both escaped",
			func(t *testing.T) []byte {
				return wireWith(t, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{entry("user", "#"), entry("path", `a\b`)}}, "#", "\xff")
			},
			&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{entry("user", `\xff`), entry("path", `a\\b`)}}, true},
		{"Latin-1 byte in a nested value",
			func(t *testing.T) []byte {
				return wireWith(t, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{entry("user", "caf#")}, HitsAddend: 2}, "caf#", "caf\xe9")
			},
			&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{entry("user", `caf\xe9`)}, HitsAddend: 2}, true},
		{"several fields, valid UTF-8 beside invalid bytes kept",
			func(t *testing.T) []byte {
				return wireWith(t, &rlsv3.RateLimitRequest{Domain: "dom@",
					Descriptors: []*rlv3.RateLimitDescriptor{entry("k1", "é@@"), entry("k@", "v")}},
					"dom@", "dom\xff", "é@@", "é\xc3(", "k@", "k\x80")
			},
			&rlsv3.RateLimitRequest{Domain: `dom\xff`,
				Descriptors: []*rlv3.RateLimitDescriptor{entry("k1", `é\xc3(`), entry(`k\x80`, "v")}}, true},
		{"truncated wire stays an error",
			func(t *testing.T) []byte {
				b := wireWith(t, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{entry("user", "caf#")}}, "caf#", "caf\xe9")
				return b[:len(b)-2]
			},
			nil, false},
	}
	codec := newLenientCodec(nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wire := tc.wire(t)
			req := &rlsv3.RateLimitRequest{}
			err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, req)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("Unmarshal = %v, want an error", req)
				}
				return
			}
			if err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !proto.Equal(req, tc.want) {
				t.Errorf("Unmarshal = %v, want %v", req, tc.want)
			}
			if _, changed := escapeInvalidUTF8(wire, req.ProtoReflect().Descriptor(), 0); changed != tc.changed {
				t.Errorf("escapeInvalidUTF8 changed = %v, want %v", changed, tc.changed)
			}
		})
	}
}

// Any bytes at all: the codec never panics, and whenever it accepts a
// message, every string in it is valid UTF-8.
func FuzzLenientCodec(f *testing.F) {
	b, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{entry("user", "caf#")}, HitsAddend: 2})
	f.Add(b)
	f.Add(bytes.Replace(b, []byte("caf#"), []byte("caf\xe9"), 1))
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe})
	codec := newLenientCodec(nil)
	f.Fuzz(func(t *testing.T, wire []byte) {
		req := &rlsv3.RateLimitRequest{}
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, req); err != nil {
			return
		}
		if _, err := proto.Marshal(req); err != nil {
			t.Fatalf("accepted a message that does not marshal again: %v", err)
		}
		strs := []string{req.GetDomain()}
		for _, d := range req.GetDescriptors() {
			for _, e := range d.GetEntries() {
				strs = append(strs, e.GetKey(), e.GetValue())
			}
		}
		for _, s := range strs {
			if _, ok := escape.Unescape(s); !ok {
				t.Fatalf("accepted string %q is not an escaped form (two inputs could share it)", s)
			}
		}
	})
}

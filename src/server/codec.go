package server

import (
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/openrls/ratelimit/src/escape"
)

// lenientCodec is grpc-go's proto codec, except that a request whose string
// fields hold bytes that are not UTF-8 is accepted, with every string that
// holds such a byte or a backslash escaped (package escape: \xNN and \\,
// one to one), instead of refused before the handler runs; and that the
// strings of a valid RateLimitRequest holding a backslash are escaped the
// same way, so that the text `\xff` and the byte 0xFF never share a counter.
//
// Why: Envoy copies header values into descriptor values byte for byte, and
// HTTP allows such bytes in header values (obs-text); Envoy's serializer
// sends them on. Refused, the call fails, and Envoy applies its failure
// mode, which by default lets the request through: one stray byte in a
// limited header would escape every limit. Escaped, the value is counted
// like any other (configs are escaped alike when loaded, so matching by
// value is unaffected). Valid requests take the default codec's path, and
// nearly all of them hold no backslash.
//
// It also takes a large request's bytes from budget before decoding it,
// and leaves one that does not fit undecoded (see byteBudget).
type lenientCodec struct {
	encoding.CodecV2
	budget *byteBudget
}

func newLenientCodec(budget *byteBudget) lenientCodec {
	return lenientCodec{encoding.GetCodecV2(protocodec.Name), budget}
}

func (c lenientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if req, ok := v.(*rlsv3.RateLimitRequest); ok && c.budget != nil && !c.budget.admit(req, data.Len()) {
		return nil // answered ResourceExhausted by the budget's interceptor
	}
	err := c.unmarshal(data, v)
	if err != nil && c.budget != nil {
		c.budget.release(v)
	}
	return err
}

func (c lenientCodec) unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		if req, ok := v.(*rlsv3.RateLimitRequest); ok {
			escape.Request(req)
		}
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	fixed, changed := escapeInvalidUTF8(data.Materialize(), m.ProtoReflect().Descriptor(), 0)
	if !changed {
		return err
	}
	return proto.Unmarshal(fixed, m)
}

// maxDepth bounds the recursion into nested messages, as proto.Unmarshal's
// own limit does.
const maxDepth = 100

// escapeInvalidUTF8 returns b with every string field of md (nested
// messages included) that holds a byte that is not UTF-8 or a backslash
// escaped (package escape), and whether any string held a byte that is not
// UTF-8 (if none did, b is returned as it is). Wire data it cannot parse is
// left as it is: the unmarshal that follows reports it.
func escapeInvalidUTF8(b []byte, md protoreflect.MessageDescriptor, depth int) ([]byte, bool) {
	out, changed, invalid := escapeStrings(b, md, depth)
	if !invalid || !changed {
		return b, false
	}
	return out, true
}

// escapeStrings is escapeInvalidUTF8's walk: the rewritten message, whether
// any string changed, and whether any was not UTF-8.
func escapeStrings(b []byte, md protoreflect.MessageDescriptor, depth int) (out []byte, changed, invalid bool) {
	if depth > maxDepth {
		return b, false, false
	}
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return b, false, false
		}
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if m < 0 {
			return b, false, false
		}
		field := rest[:n+m]
		rest = rest[n+m:]
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil {
			out = append(out, field...)
			continue
		}
		val, _ := protowire.ConsumeBytes(field[n:])
		var fixed []byte
		ok := false
		switch {
		case fd.Kind() == protoreflect.StringKind && escape.Needed(string(val)):
			fixed, ok = escape.Append(nil, string(val)), true
			invalid = invalid || !utf8.Valid(val)
		case fd.Message() != nil && (fd.Kind() == protoreflect.MessageKind || fd.IsMap()):
			var bad bool
			fixed, ok, bad = escapeStrings(val, fd.Message(), depth+1)
			invalid = invalid || bad
		}
		if !ok {
			out = append(out, field...)
			continue
		}
		changed = true
		out = protowire.AppendTag(out, num, protowire.BytesType)
		out = protowire.AppendBytes(out, fixed)
	}
	return out, changed, invalid
}

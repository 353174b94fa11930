package server

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// lenientCodec is grpc-go's proto codec, except that a request whose string
// fields hold bytes that are not UTF-8 is accepted with those bytes escaped
// as \xNN, instead of refused before the handler runs.
//
// Why: Envoy copies header values into descriptor values byte for byte, and
// HTTP allows such bytes in header values (obs-text); Envoy's serializer
// sends them on. Refused, the call fails, and Envoy applies its failure
// mode, which by default lets the request through: one stray byte in a
// limited header would escape every limit. Escaped, the value is counted
// like any other (configs, being YAML, never name such bytes, so matching by
// value is unaffected). Valid requests take the default codec's path alone.
type lenientCodec struct{ encoding.CodecV2 }

func newLenientCodec() lenientCodec {
	return lenientCodec{encoding.GetCodecV2(protocodec.Name)}
}

func (c lenientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
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
// messages included) made valid UTF-8 by escaping each invalid byte as
// \xNN, and whether anything changed. Wire data it cannot parse is left as
// it is: the unmarshal that follows reports it.
func escapeInvalidUTF8(b []byte, md protoreflect.MessageDescriptor, depth int) ([]byte, bool) {
	if depth > maxDepth {
		return b, false
	}
	var out []byte
	changed := false
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return b, false
		}
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if m < 0 {
			return b, false
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
		case fd.Kind() == protoreflect.StringKind && !utf8.Valid(val):
			fixed, ok = escapeBytes(val), true
		case fd.Message() != nil && (fd.Kind() == protoreflect.MessageKind || fd.IsMap()):
			fixed, ok = escapeInvalidUTF8(val, fd.Message(), depth+1)
		}
		if !ok {
			out = append(out, field...)
			continue
		}
		changed = true
		out = protowire.AppendTag(out, num, protowire.BytesType)
		out = protowire.AppendBytes(out, fixed)
	}
	if !changed {
		return b, false
	}
	return out, true
}

// escapeBytes keeps valid UTF-8 and writes every other byte as \xNN.
func escapeBytes(s []byte) []byte {
	out := make([]byte, 0, len(s)+8)
	for len(s) > 0 {
		r, size := utf8.DecodeRune(s)
		if r == utf8.RuneError && size == 1 {
			out = fmt.Appendf(out, `\x%02x`, s[0])
		} else {
			out = append(out, s[:size]...)
		}
		s = s[size:]
	}
	return out
}

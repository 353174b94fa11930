package integration

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// rawCodec sends and receives messages as wire bytes, so a test can send
// what Go's proto package refuses to marshal.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// Envoy copies header values into descriptor values byte for byte, and a
// header may carry bytes that are not UTF-8 (obs-text). Protobuf strings must
// be UTF-8, and grpc-go refuses such a request before the handler runs;
// Envoy then applies its failure mode, by default letting the request
// through. So one stray byte in a limited header would escape every limit.
// The service must count such values like any other.
func TestInvalidUTF8DescriptorValueIsCounted(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	// Marshal with a placeholder of the same length, then put the bytes in.
	wire, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(desc("user=caf#"))})
	if err != nil {
		t.Fatal(err)
	}
	wire = bytes.Replace(wire, []byte("caf#"), []byte("caf\xe9"), 1)
	var codes []string
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var out []byte
		err := p.conn.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &wire, &out, grpc.ForceCodecV2(rawCodec{}))
		cancel()
		if err != nil {
			t.Fatalf("ShouldRateLimit with a non-UTF-8 value: %v", err)
		}
		resp := &rlsv3.RateLimitResponse{}
		if err := proto.Unmarshal(out, resp); err != nil {
			t.Fatal(err)
		}
		codes = append(codes, resp.GetOverallCode().String())
	}
	if got, want := fmt.Sprint(codes), "[OK OK OVER_LIMIT]"; got != want {
		t.Errorf("codes for a user value with a non-UTF-8 byte = %s, want %s (2 per hour)", got, want)
	}
}

package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/openrls/ratelimit/src/config/configtest"
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
	wire, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=caf#"))})
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

// TestEscapedByteAndItsTextCountApart: the byte 0xFF in a value and the
// four characters `\xff` are two values, counted apart (the escaping is one
// to one); a config value with a backslash still matches the request that
// carries it, over gRPC and POST /json alike.
func TestEscapedByteAndItsTextCountApart(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig + `
  - key: path
    value: 'C:\dir'
    rate_limit: {unit: hour, requests_per_unit: 7}
`}))
	wire, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=#"))})
	if err != nil {
		t.Fatal(err)
	}
	wire = bytes.Replace(wire, []byte("#"), []byte("\xff"), 1)
	callRaw := func() rlsv3.RateLimitResponse_Code {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var out []byte
		if err := p.conn.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &wire, &out, grpc.ForceCodecV2(rawCodec{})); err != nil {
			t.Fatal(err)
		}
		resp := &rlsv3.RateLimitResponse{}
		if err := proto.Unmarshal(out, resp); err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	// Two hits on the byte use up its limit of 2; the text is untouched.
	callRaw()
	callRaw()
	if got := callRaw(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("third hit on the byte 0xFF = %v, want OVER_LIMIT", got)
	}
	if got := p.should(t, "it", configtest.Desc(`user=\xff`)).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("the text \\xff after the byte 0xFF used its limit = %v, want OK (its own counter)", got)
	}
	if got := p.should(t, "it", configtest.Desc(`path=C:\dir`)).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 7 {
		t.Errorf(`path=C:\dir over gRPC matched a limit of %d, want the config's 7`, got)
	}
	resp, err := http.Post("http://"+p.httpAddr+"/json", "application/json",
		strings.NewReader(`{"domain":"it","descriptors":[{"entries":[{"key":"path","value":"C:\\dir"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(resp); !strings.Contains(body, `"requestsPerUnit":7`) && !strings.Contains(body, `"requestsPerUnit": 7`) {
		t.Errorf(`path=C:\dir over /json: %s, want the config's limit of 7`, body)
	}
}

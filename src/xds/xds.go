// Package xds loads the descriptor config from an xDS management server
// (CONFIG_TYPE=GRPC_XDS_SOTW): an ADS state-of-the-world stream of
// type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig
// resources. Every response is converted, validated by the config package
// exactly like files, and installed only if valid; it is then ACKed, else
// NACKed with the errors, and the last good config keeps serving.
package xds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	sotw "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/tlsclient"
)

// Options configures Run.
type Options struct {
	ServerURL string
	NodeID    string
	// RetryInterval paces NACKs of a config the server keeps resending;
	// without Backoff it is also the first wait before reconnecting,
	// doubling on each failure in a row up to ten times itself.
	RetryInterval time.Duration
	// Backoff, when its Initial is set, paces reconnects (of the stream and
	// of gRPC's connection) instead (XDS_CLIENT_BACKOFF_*).
	Backoff Backoff
	// NodeMetadata is sent as the node's metadata
	// (CONFIG_GRPC_XDS_NODE_METADATA); Headers as gRPC metadata on the
	// stream (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
	NodeMetadata, Headers map[string]string
	// MaxMsgSize bounds one response (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES);
	// 0 keeps gRPC's 4 MiB.
	MaxMsgSize int
	// Install serves what build returns if it succeeds (reload.Holder's
	// Install); every response goes through it, bad ones included, so that
	// load errors are counted and logged in one place.
	Install func(build func() (*config.Config, error)) error
	// Build combines the resources as files are combined.
	Build  config.Options
	Logger logrus.FieldLogger
	// DialOptions default to a plaintext connection.
	DialOptions []grpc.DialOption
}

// Backoff is an exponential backoff: waits start at Initial and double up
// to Max; with Jitter each is spread by +/-RandomFactor of itself.
type Backoff struct {
	Initial, Max time.Duration
	RandomFactor float64
	Jitter       bool
}

// wait returns the wait after attempt failures in a row (1 for the first);
// rnd is uniform in [0, 1).
func (b Backoff) wait(attempt int, rnd float64) time.Duration {
	d := b.Initial
	for i := 1; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if b.Jitter && b.RandomFactor > 0 {
		d = time.Duration(float64(d) * (1 + b.RandomFactor*(2*rnd-1)))
	}
	return d
}

// TLSOptions configure a TLS connection to the xDS server.
type TLSOptions struct {
	CAFile            string // PEM; empty means the system roots
	CertFile, KeyFile string // optional client certificate
	ServerName        string // verify this name instead of the URL's host
}

// TLSDialOption builds the transport credentials for o.
func TLSDialOption(o TLSOptions) (grpc.DialOption, error) {
	cfg, err := tlsclient.Config(o.CAFile, o.CertFile, o.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("xds: %w", err)
	}
	cfg.ServerName = o.ServerName
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}

// Run keeps an ADS stream open until ctx ends, reconnecting with backoff.
func Run(ctx context.Context, o Options) error {
	if len(o.DialOptions) == 0 {
		o.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	dopts := slices.Clone(o.DialOptions)
	if o.Backoff.Initial > 0 {
		cfg := backoff.Config{BaseDelay: o.Backoff.Initial, Multiplier: 2, MaxDelay: o.Backoff.Max}
		if o.Backoff.Jitter {
			cfg.Jitter = o.Backoff.RandomFactor
		}
		dopts = append(dopts, grpc.WithConnectParams(grpc.ConnectParams{Backoff: cfg, MinConnectTimeout: 20 * time.Second}))
	} else {
		o.Backoff = Backoff{Initial: o.RetryInterval, Max: 10 * o.RetryInterval}
	}
	if o.MaxMsgSize > 0 {
		dopts = append(dopts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.MaxMsgSize)))
	}
	conn, err := grpc.NewClient(o.ServerURL, dopts...)
	if err != nil {
		return fmt.Errorf("xds: %s: %w", o.ServerURL, err)
	}
	defer conn.Close()
	node := &corev3.Node{Id: o.NodeID}
	if len(o.NodeMetadata) > 0 {
		md := map[string]any{}
		for k, v := range o.NodeMetadata {
			md[k] = v
		}
		if node.Metadata, err = structpb.NewStruct(md); err != nil {
			return fmt.Errorf("xds: node metadata: %w", err)
		}
	}
	failures := 0
	for {
		received, err := session(ctx, conn, node, o)
		if ctx.Err() != nil {
			return nil
		}
		if received {
			failures = 0
		}
		failures++
		wait := o.Backoff.wait(failures, rand.Float64())
		o.Logger.WithError(err).WithField("retry_in", wait).Warn("xds config stream ended; reconnecting")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// session runs one stream; it reports whether any response arrived.
func session(ctx context.Context, conn *grpc.ClientConn, node *corev3.Node, o Options) (bool, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for k, v := range o.Headers {
		sctx = metadata.AppendToOutgoingContext(sctx, k, v)
	}
	c := sotw.NewADSClient(sctx, node, resource.RateLimitConfigType)
	if err := c.InitConnect(conn); err != nil {
		return false, err
	}
	received := false
	// Management servers commonly answer a NACK by sending the rejected
	// resources again (go-control-plane's snapshot cache does, at once).
	// Validating and logging each repeat would spin both ends and flood the
	// log, so a repeat is NACKed with the same errors after RetryInterval; a
	// corrected config pushed meanwhile arrives in answer to that NACK.
	var rejected []*anypb.Any
	var rejectedErr string
	for {
		resp, err := c.Fetch()
		if err != nil {
			return received, err
		}
		received = true
		if rejected != nil && sameResources(resp.Resources, rejected) {
			o.Logger.Debug("xds server resent the rejected config; NACKing it again")
			select {
			case <-ctx.Done():
				return received, ctx.Err()
			case <-time.After(o.RetryInterval):
			}
			if err := c.Nack(rejectedErr); err != nil {
				return received, err
			}
			continue
		}
		rejected = nil
		err = o.Install(func() (*config.Config, error) {
			files, err := decodeFiles(resp.Resources)
			if err != nil {
				return nil, err
			}
			return config.Build(files, o.Build)
		})
		if err != nil {
			o.Logger.WithError(err).Error("xds config rejected; keeping the last good config")
			rejected, rejectedErr = resp.Resources, err.Error()
			if err := c.Nack(rejectedErr); err != nil {
				return received, err
			}
			continue
		}
		o.Logger.WithField("resources", len(resp.Resources)).Info("xds config loaded")
		if err := c.Ack(); err != nil {
			return received, err
		}
	}
}

// sameResources reports whether two responses carry the same resources.
func sameResources(a, b []*anypb.Any) bool {
	return slices.EqualFunc(a, b, func(x, y *anypb.Any) bool { return proto.Equal(x, y) })
}

// decodeFiles converts RateLimitConfig resources into parsed config files, named
// "xds:<resource name>". Problems in every resource are reported together.
func decodeFiles(resources []*anypb.Any) ([]*config.File, error) {
	var files []*config.File
	var errs []error
	for _, a := range resources {
		rc := &rlconfv3.RateLimitConfig{}
		if err := a.UnmarshalTo(rc); err != nil {
			errs = append(errs, fmt.Errorf("xds: resource of type %s: %w", a.GetTypeUrl(), err))
			continue
		}
		name := rc.GetName()
		if name == "" {
			name = rc.GetDomain()
		}
		f, err := config.Parse("xds:"+name, render(rc))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		files = append(files, f)
	}
	return files, errors.Join(errs...)
}

// render writes a resource as the YAML the config package parses, so that
// both sources share one validation: a line per descriptor (its position is
// what errors and /explain name), every string double-quoted (strconv.Quote
// writes only escapes YAML shares), in the plain block shape the config
// package decodes in pieces. Writing it directly, rather than through
// yaml.Marshal of a map tree, keeps 100,000 rules from taking a gigabyte.
func render(rc *rlconfv3.RateLimitConfig) []byte {
	var b bytes.Buffer
	b.WriteString("domain: ")
	b.WriteString(strconv.Quote(rc.GetDomain()))
	b.WriteString("\ndescriptors:\n")
	renderDescriptors(&b, rc.GetDescriptors(), "  ")
	return b.Bytes()
}

// yamlSafeJSON escapes, in JSON from json.Marshal, the runes JSON leaves
// raw but YAML refuses (DEL, C1 controls but NEL, U+FFFE and U+FFFF). They
// can only stand inside strings, where \uXXXX means the same in both.
func yamlSafeJSON(js []byte) string {
	var b strings.Builder
	for _, r := range string(js) {
		if r == 0x7f || (r >= 0x80 && r <= 0x9f && r != 0x85) || r == 0xfffe || r == 0xffff {
			fmt.Fprintf(&b, "\\u%04x", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func renderDescriptors(b *bytes.Buffer, ds []*rlconfv3.RateLimitDescriptor, indent string) {
	inner := indent + "  "
	for _, d := range ds {
		b.WriteString(indent)
		b.WriteString("- key: ")
		b.WriteString(strconv.Quote(d.GetKey()))
		b.WriteByte('\n')
		field := func(name, value string) {
			b.WriteString(inner)
			b.WriteString(name)
			b.WriteString(": ")
			b.WriteString(value)
			b.WriteByte('\n')
		}
		if d.GetValue() != "" {
			field("value", strconv.Quote(d.GetValue()))
		}
		if d.GetShadowMode() {
			field("shadow_mode", "true")
		}
		if d.GetDetailedMetric() {
			field("detailed_metric", "true")
		}
		if d.GetQuotaMode() {
			field("quota_mode", "true")
		}
		if md := d.GetMetadata(); len(md.GetFields()) > 0 {
			// JSON is YAML's flow style; Marshal escapes line breaks, so
			// it stays on one line.
			if js, err := json.Marshal(md.AsMap()); err == nil {
				field("metadata", yamlSafeJSON(js))
			}
		}
		if p := d.GetRateLimit(); p != nil {
			var rl []string
			if p.GetUnlimited() {
				rl = append(rl, "unlimited: true")
			} else {
				rl = append(rl, "unit: "+strconv.Quote(strings.ToLower(p.GetUnit().String())),
					"requests_per_unit: "+strconv.FormatUint(uint64(p.GetRequestsPerUnit()), 10))
			}
			if p.GetName() != "" {
				rl = append(rl, "name: "+strconv.Quote(p.GetName()))
			}
			if rs := p.GetReplaces(); len(rs) > 0 {
				names := make([]string, len(rs))
				for i, r := range rs {
					names[i] = "{name: " + strconv.Quote(r.GetName()) + "}"
				}
				rl = append(rl, "replaces: ["+strings.Join(names, ", ")+"]")
			}
			field("rate_limit", "{"+strings.Join(rl, ", ")+"}")
		}
		if len(d.GetDescriptors()) > 0 {
			b.WriteString(inner)
			b.WriteString("descriptors:\n")
			renderDescriptors(b, d.GetDescriptors(), inner+"  ")
		}
	}
}

// Package tracing sets up OpenTelemetry tracing (TRACING_ENABLED): a span per
// ShouldRateLimit call, continuing the W3C trace context Envoy sends in gRPC
// metadata, and a child span per store round trip. When disabled it adds
// nothing to the request path.
package tracing

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/openrls/ratelimit/src/limiter"
)

// Options configures Setup. The exporters read the standard
// OTEL_EXPORTER_OTLP_* variables themselves (endpoint, headers, TLS).
type Options struct {
	Enabled      bool
	Protocol     string // "http" (default) or "grpc"
	ServiceName  string
	Namespace    string
	InstanceID   string
	SamplingRate float64 // 0..1; 1 samples everything
	// Exporter replaces the OTLP exporter (tests use an in-memory one).
	Exporter sdktrace.SpanExporter
}

// Tracing is the configured tracer provider; its zero value is disabled.
type Tracing struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
}

// Setup builds the provider; with Enabled false it returns a disabled
// Tracing and no error.
func Setup(ctx context.Context, o Options) (*Tracing, error) {
	if !o.Enabled {
		return &Tracing{}, nil
	}
	exp := o.Exporter
	if exp == nil {
		var err error
		switch strings.ToLower(o.Protocol) {
		case "", "http":
			exp, err = otlptracehttp.New(ctx)
		case "grpc":
			exp, err = otlptracegrpc.New(ctx)
		default:
			return nil, fmt.Errorf("tracing: unknown exporter protocol %q (want http or grpc)", o.Protocol)
		}
		if err != nil {
			return nil, fmt.Errorf("tracing: exporter: %w", err)
		}
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(o.ServiceName)}
	if o.Namespace != "" {
		attrs = append(attrs, semconv.ServiceNamespace(o.Namespace))
	}
	if o.InstanceID != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(o.InstanceID))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewWithAttributes(semconv.SchemaURL, attrs...)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SamplingRate))),
	)
	return &Tracing{provider: tp, tracer: tp.Tracer("github.com/openrls/ratelimit")}, nil
}

// Enabled reports whether spans are recorded.
func (t *Tracing) Enabled() bool { return t.provider != nil }

// ServerOptions instrument a gRPC server: one span per call, parented on
// the caller's W3C traceparent.
func (t *Tracing) ServerOptions() []grpc.ServerOption {
	if !t.Enabled() {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.provider),
		otelgrpc.WithPropagators(propagation.TraceContext{}),
	))}
}

// Store wraps a store so that each Apply is a span; disabled, it returns
// the store itself.
func (t *Tracing) Store(s limiter.Store) limiter.Store {
	if !t.Enabled() {
		return s
	}
	return tracedStore{s, t.tracer}
}

// Shutdown flushes pending spans.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

type tracedStore struct {
	limiter.Store
	tracer trace.Tracer
}

func (s tracedStore) Apply(ctx context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	ctx, span := s.tracer.Start(ctx, "ratelimit.store.apply", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.Int("ratelimit.hits", len(b.Hits)), attribute.Bool("ratelimit.all_or_nothing", b.AllOrNothing)))
	defer span.End()
	outs, err := s.Store.Apply(ctx, b)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return outs, err
}

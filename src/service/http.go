package service

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/openrls/ratelimit/src/escape"
)

// JSONOptions bound POST /json. Zero fields take the defaults.
type JSONOptions struct {
	// MaxBytes bounds a request body, as REQUEST_MAX_BYTES bounds a gRPC
	// request message; default 256 KiB.
	MaxBytes int
	// MaxInFlight bounds the bodies being read at once; past it a request
	// is answered 503 at once, so that the memory bodies hold stays under
	// MaxInFlight x MaxBytes; default 64.
	MaxInFlight int
	// MaxInFlightPerAddress bounds the bodies one client address has
	// being read at once, so that slow uploads from one address cannot
	// take every slot; default MaxInFlight/8, at least 1.
	MaxInFlightPerAddress int
}

// bodySlots are the body-reading slots of /json: in all, and per client
// address.
type bodySlots struct {
	all     chan struct{}
	perAddr int
	mu      sync.Mutex
	byAddr  map[string]int
}

// take takes a slot for a body from addr (host:port), and reports whether
// one was free in all and for addr.
func (b *bodySlots) take(addr string) bool {
	select {
	case b.all <- struct{}{}:
	default:
		return false
	}
	host := hostOf(addr)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byAddr[host] >= b.perAddr {
		<-b.all
		return false
	}
	b.byAddr[host]++
	return true
}

// give gives back addr's slot.
func (b *bodySlots) give(addr string) {
	host := hostOf(addr)
	b.mu.Lock()
	if b.byAddr[host]--; b.byAddr[host] <= 0 {
		delete(b.byAddr, host)
	}
	b.mu.Unlock()
	<-b.all
}

// hostOf is a remote address's host: one client, whatever its ports.
func hostOf(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// JSONHandler serves POST /json: a proto3-JSON RateLimitRequest in, a
// proto3-JSON RateLimitResponse out, with 200 for OK, 429 for OVER_LIMIT, 400
// for a bad request, 413 for a body past MaxBytes and 503 when no decision
// could be made (or too many bodies are being read).
func (s *Server) JSONHandler(o JSONOptions) http.Handler {
	if o.MaxBytes <= 0 {
		o.MaxBytes = 256 << 10
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 64
	}
	if o.MaxInFlightPerAddress <= 0 {
		o.MaxInFlightPerAddress = max(1, o.MaxInFlight/8)
	}
	reading := &bodySlots{all: make(chan struct{}, o.MaxInFlight), perAddr: o.MaxInFlightPerAddress, byAddr: map[string]int{}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := readJSONRequest(w, r, o, reading)
		if req == nil {
			return
		}
		resp, err := s.ShouldRateLimit(r.Context(), req)
		if err != nil {
			st := status.Convert(err)
			http.Error(w, st.Message(), httpStatus(st.Code()))
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, "encode response: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write(out)
	})
}

// readJSONRequest reads, decodes and escapes r's RateLimitRequest, holding one of
// reading's slots while it reads the body; nil when it has answered r
// itself (a wrong method, a body too large, too many being read, bad JSON).
func readJSONRequest(w http.ResponseWriter, r *http.Request, o JSONOptions, reading *bodySlots) *rlsv3.RateLimitRequest {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST a JSON RateLimitRequest", http.StatusMethodNotAllowed)
		return nil
	}
	if r.ContentLength > int64(o.MaxBytes) {
		refuseBody(w)
		http.Error(w, fmt.Sprintf("the body is %d bytes, at most %d allowed (REQUEST_MAX_BYTES)", r.ContentLength, o.MaxBytes),
			http.StatusRequestEntityTooLarge)
		return nil
	}
	if !reading.take(r.RemoteAddr) {
		refuseBody(w)
		w.Header().Set("Retry-After", "1")
		http.Error(w, fmt.Sprintf("/json bodies are being read already (%d in all, %d per client address at most); retry",
			o.MaxInFlight, o.MaxInFlightPerAddress), http.StatusServiceUnavailable)
		return nil
	}
	body, err := readBody(w, r, o.MaxBytes)
	reading.give(r.RemoteAddr)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		http.Error(w, fmt.Sprintf("the body is over %d bytes (REQUEST_MAX_BYTES)", o.MaxBytes), http.StatusRequestEntityTooLarge)
		return nil
	case err != nil:
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return nil
	}
	req := &rlsv3.RateLimitRequest{}
	if err := protojson.Unmarshal(body, req); err != nil {
		http.Error(w, "invalid RateLimitRequest JSON: "+err.Error(), http.StatusBadRequest)
		return nil
	}
	// Decoded, escaped: as the gRPC codec does in one step, so both count
	// a value alike.
	escape.Request(req)
	return req
}

// refuseBody ends the connection of a request whose body is refused
// unread: net/http would otherwise read the rest of it after the answer,
// to keep the connection, from a client that may send it as slowly as it
// can, holding the connection until the read timeout.
func refuseBody(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

// readBody reads r's body, at most max bytes, into a buffer sized once
// from its Content-Length when it has one.
func readBody(w http.ResponseWriter, r *http.Request, max int) ([]byte, error) {
	var buf bytes.Buffer
	if n := r.ContentLength; n > 0 {
		buf.Grow(int(n) + 1)
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, int64(max)))
	return buf.Bytes(), err
}

func httpStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded, codes.Canceled:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

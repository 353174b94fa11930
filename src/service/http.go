package service

import (
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/openrls/ratelimit/src/escape"
)

// maxJSONBody bounds a POST /json body; a RateLimitRequest within the request
// Limits is far smaller.
const maxJSONBody = 1 << 20

// JSONHandler serves POST /json: a proto3-JSON RateLimitRequest in, a
// proto3-JSON RateLimitResponse out, with 200 for OK, 429 for OVER_LIMIT, 400
// for a bad request and 503 when no decision could be made.
func (s *Server) JSONHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST a JSON RateLimitRequest", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
		if err != nil {
			http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		req := &rlsv3.RateLimitRequest{}
		if err := protojson.Unmarshal(body, req); err != nil {
			http.Error(w, "invalid RateLimitRequest JSON: "+err.Error(), http.StatusBadRequest)
			return
		}
		escape.Request(req) // as the gRPC codec does, so both count a value alike
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

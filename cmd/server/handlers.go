package main

// The HTTP handlers main mounts: POST /json (or why it is off) and the
// debug port's views of the served config.

import (
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/reload"
	"github.com/openrls/ratelimit/src/service"
	"github.com/openrls/ratelimit/src/settings"
)

// jsonEndpoint is POST /json, or, when it is off, an answer that says why
// and how to turn it on.
func jsonEndpoint(s settings.Settings, svc *service.Server) http.Handler {
	if s.JSONEndpoint() {
		return svc.JSONHandler(service.JSONOptions{MaxBytes: s.RequestMaxBytes})
	}
	reason := "POST /json is off: set JSON_ENDPOINT_ENABLED=true to serve it"
	if s.GRPCClientTLSCACert != "" {
		reason = "POST /json is off while gRPC requires client certificates (GRPC_CLIENT_TLS_CACERT): " +
			"this port checks none; set JSON_ENDPOINT_ENABLED=true to serve it anyway"
	}
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, reason, http.StatusForbidden)
	})
}

// rlconfig serves the loaded config one line per limit, streamed, or with
// ?summary one line per domain, after a line with its version and load
// time.
func rlconfig(current *reload.Holder) http.Handler {
	return withConfig(current, func(w http.ResponseWriter, r *http.Request, cfg *config.Config) {
		fmt.Fprintf(w, "# version %s, loaded %s\n", cfg.Version(), current.LoadedAt().UTC().Format(time.RFC3339))
		if r.URL.Query().Has("summary") {
			_, _ = io.WriteString(w, cfg.Summary())
			return
		}
		_ = cfg.WriteDump(w)
	})
}

// explainHandler serves GET /explain?domain=D&descriptor=k=v,k2=v2 (the
// descriptor parameter repeated for several): how the served config decides
// that request (config.Explain), counting nothing. bin/client -explain asks
// it.
func explainHandler(current *reload.Holder) http.Handler {
	return withConfig(current, func(w http.ResponseWriter, r *http.Request, cfg *config.Config) {
		q := r.URL.Query()
		req, err := config.ParseRequest(q.Get("domain"), q["descriptor"])
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if req.Domain == "" || len(req.Descriptors) == 0 {
			http.Error(w, "want ?domain=D&descriptor=k=v[,k2=v2] (descriptor repeated for several)", http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "# config version %s\n", cfg.Version())
		if err := cfg.Explain(w, time.Now(), req.Domain, req.Descriptors); err != nil {
			fmt.Fprintln(w, "error:", err)
		}
	})
}

// withConfig serves plain text from the config being served, or 503
// before one is.
func withConfig(current *reload.Holder, serve func(http.ResponseWriter, *http.Request, *config.Config)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		cfg := current.Load()
		if cfg == nil {
			http.Error(w, "no config loaded", http.StatusServiceUnavailable)
			return
		}
		serve(w, r, cfg)
	})
}

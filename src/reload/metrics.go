package reload

import (
	"github.com/openrls/ratelimit/src/metrics"
)

// ExportMetrics exports the config loads and the served config's
// version and load time; from files, also as the reference's runtime
// loader counts them (runtime.load_attempts, runtime.num_values: the files
// of the served config).
func (h *Holder) ExportMetrics(reg *metrics.Registry, fromFiles bool) {
	if fromFiles {
		reg.StatFunc("runtime.load_attempts", func() uint64 { ok, failed := h.Counts(); return ok + failed })
		reg.GaugeStatFunc("runtime.num_values", func() uint64 {
			cfg := h.Load()
			var n uint64
			for _, d := range cfg.Domains() {
				n += uint64(len(cfg.Domain(d).Files))
			}
			return n
		})
	}
	reg.CounterFunc("ratelimit_config_load_success_total", "config.Config loads that were served.", nil,
		func() float64 { ok, _ := h.Counts(); return float64(ok) })
	reg.CounterFunc("ratelimit_config_load_error_total", "config.Config loads rejected; the last good config kept serving.", nil,
		func() float64 { _, failed := h.Counts(); return float64(failed) })
	reg.InfoFunc("ratelimit_config_info", "1, labelled with the served config's version (a hash of its rules; /rlconfig shows it).",
		"version", func() string {
			if cfg := h.Load(); cfg != nil {
				return cfg.Version()
			}
			return ""
		})
	reg.GaugeFunc("ratelimit_config_load_timestamp_seconds", "When the served config was loaded (Unix time; 0 before the first).", nil,
		func() float64 {
			if at := h.LoadedAt(); !at.IsZero() {
				return float64(at.UnixNano()) / 1e9
			}
			return 0
		})
	reg.StatFunc("ratelimit.service.config_load_success", func() uint64 { ok, _ := h.Counts(); return ok })
	reg.StatFunc("ratelimit.service.config_load_error", func() uint64 { _, failed := h.Counts(); return failed })
}

package service

import (
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/openrls/ratelimit/src/config"
)

// Headers names the RateLimit-* response headers.
type Headers struct {
	Enabled                 bool
	Limit, Remaining, Reset string // defaults: RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset
}

func (h Headers) withDefaults() Headers {
	if h.Limit == "" {
		h.Limit = "RateLimit-Limit"
	}
	if h.Remaining == "" {
		h.Remaining = "RateLimit-Remaining"
	}
	if h.Reset == "" {
		h.Reset = "RateLimit-Reset"
	}
	return h
}

// build returns the headers for an answer, taken from the descriptor the
// reference takes them from (headerHit); on OVER_LIMIT, Retry-After tells
// when the request could pass. Limits whose window is not exactly one unit
// use the policy form "10, 10;w=30" (window in seconds). globalQuota is
// QUOTA_MODE.
func (h Headers) build(dc *decision, resp *rlsv3.RateLimitResponse, globalQuota bool) []*corev3.HeaderValue {
	p, outs := dc.p, dc.outs
	j := headerHit(dc, globalQuota)
	if j < 0 {
		return nil
	}
	l, out := p.Refs[j].Limit, outs[j]
	limit := strconv.FormatUint(uint64(l.RequestsPerUnit), 10)
	if l.UnitMultiplier > 1 {
		limit += ", " + limit + ";w=" + strconv.FormatInt(int64(l.Window()/time.Second), 10)
	}
	hs := []*corev3.HeaderValue{
		{Key: h.Limit, Value: limit},
		{Key: h.Remaining, Value: strconv.FormatUint(min(out.Remaining, 1<<32-1), 10)},
		{Key: h.Reset, Value: ceilSeconds(untilReset(out))},
	}
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		// Every rejecting hit must free up; when only quota-mode ones
		// reject (all of them over), the first to free up lets it pass.
		var retry, quotaRetry time.Duration
		for i, o := range outs {
			switch {
			case o.Allowed:
			case !p.Hits[i].Advisory:
				retry = max(retry, o.RetryAfter)
			case p.Descs[p.Refs[i].Desc].Shadow():
			case quotaRetry == 0 || o.RetryAfter < quotaRetry:
				quotaRetry = o.RetryAfter
			}
		}
		if retry == 0 {
			retry = quotaRetry
		}
		hs = append(hs, &corev3.HeaderValue{Key: "Retry-After", Value: ceilSeconds(retry)})
	}
	return hs
}

// headerHit is the hit whose limit the headers describe, chosen among the
// descriptors' reported statuses (each descriptor's own hit, see pick) as
// envoyproxy/ratelimit chooses: the last descriptor that rejects the
// request (neither shadow nor quota mode), else the first with the fewest
// remaining. -1 when no descriptor has a limit.
func headerHit(dc *decision, globalQuota bool) int {
	p, outs := dc.p, dc.outs
	best, fewest := -1, uint64(math.MaxUint64)
	for i := range p.Descs {
		d := &p.Descs[i]
		j := dc.chosen[i]
		if j < 0 {
			continue
		}
		// As the status reports it (at most 2^32-1).
		rem := min(outs[j].Remaining, math.MaxUint32)
		if rem < fewest {
			best, fewest = j, rem
		}
		if !outs[j].Allowed && !d.Shadow() && !d.Quota() && !globalQuota {
			best, fewest = j, 0
		}
	}
	return best
}

func ceilSeconds(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

// dynamicMetadata describes the decision for Envoy's dynamic metadata in
// envoyproxy/ratelimit's shape, so that access-log formats built on it
// (%DYNAMIC_METADATA(envoy.filters.http.ratelimit:...)%) keep printing:
//
//	domain               the request's domain
//	descriptors[i]       entries as "key=value" strings, and, when the
//	                     request set them, limit (the override as protobuf
//	                     text: "requests_per_unit:9 unit:HOUR") and
//	                     hitsAddend
//	hitsAddend           the request's, when set
//	metadata             the config's metadata of every descriptor that
//	                     passed, merged (the first one's value wins)
//	quotaModeEnabled     whether any descriptor is in quota mode
//	quotaModeViolations  the indices of quota-mode descriptors past a limit
//
// and this service's own fields beside them:
//
//	descriptors[i]       limitOverride {requestsPerUnit, unit} as the
//	                     request set it; for a descriptor that passed, the
//	                     config's metadata
//	statuses[i]          {code, limitRemaining} of descriptor i and, with
//	                     rules (RESPONSE_DYNAMIC_METADATA_RULES), what
//	                     decided it: rule (its config path), source
//	                     (file:line, or xds:resource:line), match (exact,
//	                     wildcard, key_only, or none), override (the request
//	                     set the limit), limit {name, algorithm, window,
//	                     requestsPerUnit} of the limit the status reports
func dynamicMetadata(req *rlsv3.RateLimitRequest, dc *decision, resp *rlsv3.RateLimitResponse, globalQuota, rules bool) *structpb.Struct {
	p := dc.p
	// Built as structpb values directly: structpb.NewStruct on maps of any
	// costs twice the CPU of the whole decision.
	descs := make([]*structpb.Value, len(req.GetDescriptors()))
	statuses := make([]*structpb.Value, len(req.GetDescriptors()))
	quota := false
	var violations []*structpb.Value
	var passed *structpb.Struct // the metadata of every descriptor that passed, merged
	for i, d := range req.GetDescriptors() {
		m := requestFields(d)
		st := resp.GetStatuses()[i]
		dp := &p.Descs[i]
		if st.GetCode() == rlsv3.RateLimitResponse_OK && len(dp.Metadata()) > 0 && !dp.Unlimited {
			if md, err := structpb.NewValue(dp.Metadata()); err == nil {
				m["metadata"] = md
				passed = mergeMetadata(passed, md.GetStructValue())
			} else {
				// Metadata from YAML can hold values structpb cannot (e.g.
				// dates); the decision matters more than its description.
				m["metadataError"] = structpb.NewStringValue(err.Error())
			}
		}
		if inQuota := globalQuota || dp.Quota(); inQuota {
			quota = true
			if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
				violations = append(violations, structpb.NewNumberValue(float64(i)))
			}
		}
		descs[i] = object(m)
		status := map[string]*structpb.Value{"code": structpb.NewStringValue(st.GetCode().String()),
			"limitRemaining": structpb.NewNumberValue(float64(st.GetLimitRemaining()))}
		if rules {
			describeRule(status, d, &p.Descs[i], p, dc.chosen[i])
		}
		statuses[i] = object(status)
	}
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain()),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
		"statuses":    structpb.NewListValue(&structpb.ListValue{Values: statuses})}
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	if passed != nil {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	if quota {
		fields["quotaModeEnabled"] = structpb.NewBoolValue(true)
		fields["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: violations})
	}
	return &structpb.Struct{Fields: fields}
}

// requestFields describes what the request said of descriptor d: its
// entries as key=value, its limit override, its hits_addend.
func requestFields(d *rlv3.RateLimitDescriptor) map[string]*structpb.Value {
	entries := make([]*structpb.Value, len(d.GetEntries()))
	for j, e := range d.GetEntries() {
		entries[j] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
	}
	m := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
	if l := d.GetLimit(); l != nil {
		m["limit"] = structpb.NewStringValue(overrideText(l))
		m["limitOverride"] = object(map[string]*structpb.Value{"requestsPerUnit": structpb.NewNumberValue(float64(l.GetRequestsPerUnit())),
			"unit": structpb.NewStringValue(l.GetUnit().String())})
	}
	if h := d.GetHitsAddend(); h != nil {
		m["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
	}
	return m
}

// overrideText writes a request's limit override as the reference's
// metadata does (the message in protobuf text form, e.g.
// "requests_per_unit:9 unit:HOUR"), with one space between fields always:
// protobuf's own String() inserts a second one at random per build.
func overrideText(l *rlv3.RateLimitDescriptor_RateLimitOverride) string {
	var parts []string
	if n := l.GetRequestsPerUnit(); n != 0 {
		parts = append(parts, "requests_per_unit:"+strconv.FormatUint(uint64(n), 10))
	}
	if u := l.GetUnit(); u != 0 {
		parts = append(parts, "unit:"+u.String())
	}
	return strings.Join(parts, " ")
}

// mergeMetadata merges src into dst as the reference merges the metadata of
// the descriptors that passed: a key already there keeps its value, unless
// both values are mappings, which merge the same way. dst may be nil.
func mergeMetadata(dst, src *structpb.Struct) *structpb.Struct {
	if dst == nil {
		dst = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = cloneValue(v)
			continue
		}
		if hs, vs := have.GetStructValue(), v.GetStructValue(); hs != nil && vs != nil {
			mergeMetadata(hs, vs)
		}
	}
	return dst
}

// cloneValue copies v, so that merging into the top-level metadata never
// changes a descriptor's own.
func cloneValue(v *structpb.Value) *structpb.Value { return proto.Clone(v).(*structpb.Value) }

func object(m map[string]*structpb.Value) *structpb.Value {
	return structpb.NewStructValue(&structpb.Struct{Fields: m})
}

// describeRule adds to a status what decided it (see dynamicMetadata).
// j is the hit its status reports (decision.chosen), -1 for none.
func describeRule(status map[string]*structpb.Value, req *rlv3.RateLimitDescriptor, dp *config.DescPlan, p *config.Plan, j int) {
	if dp.Rule() != "" {
		status["rule"] = structpb.NewStringValue(dp.Rule())
		status["source"] = structpb.NewStringValue(dp.Source())
	}
	status["match"] = structpb.NewStringValue(dp.Match())
	if req.GetLimit() != nil {
		status["override"] = structpb.NewBoolValue(true)
	}
	if j < 0 {
		return
	}
	l := p.Refs[j].Limit
	limit := map[string]*structpb.Value{"algorithm": structpb.NewStringValue(l.Algorithm.String()),
		"window": structpb.NewStringValue(l.Window().String()), "requestsPerUnit": structpb.NewNumberValue(float64(l.RequestsPerUnit))}
	if l.Name != "" {
		limit["name"] = structpb.NewStringValue(l.Name)
	}
	status["limit"] = object(limit)
}

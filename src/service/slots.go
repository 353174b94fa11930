package service

import (
	"strconv"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
)

// slotsField is the dynamic metadata field that says, by descriptor
// index, how many slots of a concurrency limit the request took:
// {"slotsTaken": {"0": "1"}}. A refused request's stream ends too, and
// nothing in Envoy's configuration ties its stream-done release to
// whether it was admitted, or whether the service answered at all; a
// release whose hits_addend is
// %DYNAMIC_METADATA(envoy.filters.http.ratelimit:slotsTaken:0)% gives
// back exactly what was taken: a request refused, or answered by the
// failure policy, has no such field, and Envoy drops a release whose
// hits_addend does not format as a number.
const slotsField = "slotsTaken"

// addSlotsTaken adds slotsField to md (nil makes a new one) for each
// descriptor whose concurrency limits all took their slots: allowed and
// written (under STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT a rejection
// beside them writes nothing). A release gives back its hits_addend from
// every limit of its descriptor, so a descriptor where one concurrency
// limit took and another refused has no field: no release is right for
// both, and the slots taken free themselves by their bound. The values
// are strings, which Envoy's formatter prints as they are.
func addSlotsTaken(md *structpb.Struct, p *config.Plan, outs []limiter.Outcome, allOrNothing bool) *structpb.Struct {
	var taken map[string]*structpb.Value
	written := -1 // unknown until a descriptor takes slots: most requests never ask
	for i, d := range p.Descs {
		n, all := uint64(0), true
		for j := d.First; j < d.First+d.Count; j++ {
			if h := &p.Hits[j]; h.Rule.Algorithm == limiter.Concurrency && !h.Refund {
				n, all = h.Cost, all && outs[j].Allowed
			}
		}
		if n == 0 || !all {
			continue
		}
		if written < 0 {
			written = 0
			if limiter.Decide(limiter.Batch{Hits: p.Hits, AllOrNothing: allOrNothing}, outs) == limiter.CommitAll {
				written = 1
			}
		}
		if written == 0 {
			return md
		}
		if taken == nil {
			taken = map[string]*structpb.Value{}
		}
		taken[strconv.Itoa(i)] = structpb.NewStringValue(strconv.FormatUint(n, 10))
	}
	if taken == nil {
		return md
	}
	if md == nil {
		md = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	md.Fields[slotsField] = structpb.NewStructValue(&structpb.Struct{Fields: taken})
	return md
}

package metrics

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/DataDog/datadog-go/v5/statsd"
)

// Mogrifier turns a statsd name that its pattern matches into a DogStatsD
// name and tags (USE_DOG_STATSD_MOGRIFIERS, DOG_STATSD_MOGRIFIER_<X>_*):
// $0, $1, ... in Name and in each tag's value are the match's groups.
type Mogrifier struct {
	Pattern *regexp.Regexp
	Name    string
	// Tags are "key:value" templates, in the order they were written.
	Tags []MogrifierTag
}

// MogrifierTag is one tag template of a Mogrifier.
type MogrifierTag struct{ Key, Value string }

// DogStatsdOptions configures RunDogStatsd.
type DogStatsdOptions struct {
	Addr     string        // host:port of the agent (UDP)
	Interval time.Duration // counter flush period; 0 means 10s
	// Tags are EXTRA_TAGS: every stat carries them, first.
	Tags map[string]string
	// Mogrifiers are tried in order; the first whose pattern matches a
	// name applies.
	Mogrifiers []Mogrifier
}

// groupRef is a $n in a mogrifier's name or tag value.
var groupRef = regexp.MustCompile(`\$\d+`)

// expand writes tmpl with each $n replaced by group n of m; a $n past the
// groups stays as written, as the reference leaves it.
func expand(tmpl string, m []string) string {
	return groupRef.ReplaceAllStringFunc(tmpl, func(ref string) string {
		i, err := strconv.Atoi(ref[1:])
		if err != nil || i >= len(m) {
			return ref
		}
		return m[i]
	})
}

// dogName is what the reference's DogStatsD sink makes of a statsd name:
// the ".__k=v" parts (EXTRA_TAGS, as its stats library writes them into
// names) become tags k:v, then the first mogrifier that matches the rest
// renames it and adds its tags after those.
func dogName(name string, mogs []Mogrifier) (string, []string) {
	short, tagPart, hasTags := strings.Cut(name, ".__")
	var tags []string
	if hasTags {
		for _, kv := range strings.Split(tagPart, ".__") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				tags = append(tags, k+":"+v)
			}
		}
	}
	for _, mg := range mogs {
		m := mg.Pattern.FindStringSubmatch(short)
		if m == nil {
			continue
		}
		for _, t := range mg.Tags {
			tags = append(tags, t.Key+":"+expand(t.Value, m))
		}
		return expand(mg.Name, m), tags
	}
	return short, tags
}

// dogSink sends through the DogStatsD client the reference uses, with its
// options (no client-side aggregation: every flush's delta is sent as
// is). The client buffers and sends over UDP by itself; a lost datagram is
// not an error, as for plain statsd over UDP.
type dogSink struct {
	client *statsd.Client
	suffix string
	mogs   []Mogrifier
}

func (d *dogSink) counter(name string, delta uint64) {
	n, tags := dogName(name+d.suffix, d.mogs)
	_ = d.client.Count(n, int64(min(delta, math.MaxInt64)), tags, 1)
}

func (d *dogSink) gauge(name string, value uint64) {
	n, tags := dogName(name+d.suffix, d.mogs)
	_ = d.client.Gauge(n, float64(value), tags, 1)
}

// timer sends the exact milliseconds (the reference truncates to whole
// ones, which reads a sub-millisecond answer as 0).
func (d *dogSink) timer(name string, dur time.Duration) {
	n, tags := dogName(name+d.suffix, d.mogs)
	_ = d.client.TimeInMilliseconds(n, float64(dur)/float64(time.Millisecond), tags, 1)
}

func (d *dogSink) send() error { return d.client.Flush() }

// RunDogStatsd sends what RunStatsd sends, with the same names, timing
// and deltas, as DogStatsD (USE_DOG_STATSD): tags instead of name parts,
// renamed by the mogrifiers. It returns when ctx ends, after a last flush.
func (r *Registry) RunDogStatsd(ctx context.Context, o DogStatsdOptions) error {
	c, err := statsd.New(o.Addr, statsd.WithoutClientSideAggregation())
	if err != nil {
		return fmt.Errorf("dogstatsd: %w", err)
	}
	defer c.Close()
	r.runFlusher(ctx, o.Interval, &dogSink{client: c, suffix: tagSuffix(o.Tags), mogs: o.Mogrifiers}, nil, nil)
	return nil
}

package rlqstest

import (
	"math"
	"slices"
	"time"
)

// Recovery is how long after a change of demand (a move, an Envoy
// leaving or joining) the windows took to admit nine tenths of what is left (the
// limit less a token for each Envoy with demand, or the demand when it is
// below that), counted to the end of the first window that did; Back is
// false when none did before the next change or the end, and Took is then
// the time to that.
type Recovery struct {
	At, Took time.Duration
	Back     bool
}

// Recoveries are the recoveries from each change of demand from 10 s
// into the run (a per-second pattern's).
func (r *Result) Recoveries() []Recovery {
	p := r.Pattern
	var changes []time.Duration
	switch {
	case p.Moves > 0:
		for c := p.Moves; r.Begin.Add(c).Before(r.End); c += p.Moves {
			changes = append(changes, c)
		}
	case p.Spans != nil:
		for _, sp := range p.Spans {
			for _, c := range sp {
				if c > 0 && r.Begin.Add(c).Before(r.End) {
					changes = append(changes, c)
				}
			}
		}
		slices.Sort(changes)
	}
	var out []Recovery
	for k, c := range changes {
		if c < 10*time.Second {
			continue
		}
		until := r.End
		if k+1 < len(changes) {
			until = r.Begin.Add(changes[k+1])
		}
		out = append(out, r.recovery(c, until))
	}
	return out
}

// recovery is the recovery from the change at c into the run, looked for
// until until.
func (r *Result) recovery(c time.Duration, until time.Time) Recovery {
	p := r.Pattern
	limit, _ := p.Window()
	at := r.Begin.Add(c)
	for w := at.Truncate(time.Second); !w.Add(time.Second).After(until); w = w.Add(time.Second) {
		if w.Before(at) {
			continue
		}
		want, left := 0.0, limit
		for i, d := range p.Demands {
			if p.Active(i, r.Begin, w) {
				want, left = want+d, left-1
			}
		}
		if float64(r.Per[w.Unix()]) >= 0.9*math.Min(want, left) {
			return Recovery{At: c, Took: w.Add(time.Second).Sub(at), Back: true}
		}
	}
	return Recovery{At: c, Took: until.Sub(at)}
}

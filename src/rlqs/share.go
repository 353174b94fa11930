package rlqs

import (
	"math"
	"sort"
)

// fill shares capacity (tokens per second) among demands by max-min
// fairness (water-filling): a demand below the level every unsatisfied
// member gets is met in full, the rest get the level; what the demands
// leave over is then spread evenly, so every member has room to show that
// it wants more. An infinite demand (a bucket not yet measured) takes the
// level. The shares never sum past capacity.
func fill(capacity float64, demands []float64) []float64 {
	out := make([]float64, len(demands))
	if capacity <= 0 || len(demands) == 0 {
		return out
	}
	order := make([]int, len(demands))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return demands[order[a]] < demands[order[b]] })
	left := capacity
	for k, i := range order {
		level := left / float64(len(order)-k)
		d := math.Max(demands[i], 0)
		if d >= level {
			for _, j := range order[k:] {
				out[j] = level
			}
			return out
		}
		out[i] = d
		left -= d
	}
	extra := left / float64(len(demands))
	for i := range out {
		out[i] += extra
	}
	return out
}

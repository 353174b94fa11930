package rlqs

import (
	"math"
	"testing"
)

func TestFill(t *testing.T) {
	inf := math.Inf(1)
	for _, tc := range []struct {
		name     string
		capacity float64
		demands  []float64
		want     []float64
	}{
		{"demands over capacity: small one met, rest even", 27, []float64{20, 20, 5}, []float64{11, 11, 5}},
		{"demands under capacity: leftover spread", 30, []float64{5, 5, 5}, []float64{10, 10, 10}},
		{"unmeasured takes the level", 30, []float64{inf, 4}, []float64{26, 4}},
		{"all unmeasured share evenly", 30, []float64{inf, inf, inf}, []float64{10, 10, 10}},
		{"no capacity", 0, []float64{3}, []float64{0}},
		{"negative demand counts as none", 10, []float64{-1, inf}, []float64{0, 10}},
		{"nobody", 10, nil, []float64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fill(tc.capacity, tc.demands)
			if len(got) != len(tc.want) {
				t.Fatalf("fill = %v, want %v", got, tc.want)
			}
			sum := 0.0
			for i := range got {
				sum += got[i]
				if math.Abs(got[i]-tc.want[i]) > 1e-9 {
					t.Fatalf("fill = %v, want %v", got, tc.want)
				}
			}
			if sum > tc.capacity+1e-9 {
				t.Fatalf("shares %v sum to %v, past capacity %v", got, sum, tc.capacity)
			}
		})
	}
}

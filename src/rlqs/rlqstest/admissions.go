package rlqstest

import (
	"sync"
	"time"
)

// Admissions counts allowed requests per window of wall-clock time, across
// any number of fake Envoys (pass Add as their OnAdmit) and other clients.
// The zero value counts per second.
type Admissions struct {
	// Window is the length counted in; 0 means one second.
	Window time.Duration

	mu  sync.Mutex
	per map[int64]int
}

// Add counts one request allowed at at; bucket is ignored.
func (a *Admissions) Add(_ string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.per == nil {
		a.per = map[int64]int{}
	}
	a.per[a.window(at)]++
}

func (a *Admissions) window(at time.Time) int64 {
	w := a.Window
	if w <= 0 {
		w = time.Second
	}
	return at.UnixNano() / int64(w)
}

// Snapshot returns the counts so far, by window index (the instant's Unix
// nanoseconds over Window: Unix seconds for the default).
func (a *Admissions) Snapshot() map[int64]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[int64]int, len(a.per))
	for k, v := range a.per {
		out[k] = v
	}
	return out
}

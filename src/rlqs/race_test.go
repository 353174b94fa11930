//go:build race

package rlqs_test

// raceBuild: the race detector runs this package's tests several times
// slower, beside the other packages' under make check, where the CPU the
// fleet patterns took at every interval starved the integration tests;
// TestFleetPatterns runs only its 5 s fleets there, the others (the same
// code, other clients' timings) in make test.
const raceBuild = true

//go:build race

package rlqs_test

// raceBuild: the race detector runs this package's tests several times
// slower, beside the other packages' under make check; TestFleetPatterns
// runs its fleets other than 5 s from one start each there (see
// patternStartsOf), which still covers their code paths.
const raceBuild = true

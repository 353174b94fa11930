// Package redis is the Redis-backed limiter.Store: clients for a single node,
// Sentinel and Cluster (go-redis), the counter keys' Redis form, and the Lua
// scripts that apply a request's hits atomically in one round trip (or, for
// the default fixed window, plain INCRBYs in a transaction on the same
// counters: plain.go).
//
// Keys are CACHE_KEY_PREFIX + "rl:v3:" + the config's injective key, whose
// {hash tag} puts every limit of one descriptor value in one Cluster slot; a
// fixed window's count of window w is under that key + "|w". The "v3" names
// the state format: bump it whenever that changes, so replicas of two
// versions never misread each other's counters during a rolling upgrade.
//
// redis imports limiter; the service never imports redis (src/stores wires
// it).
package redis

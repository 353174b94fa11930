package redis

import (
	"errors"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// What Redis's error replies mean for the store: every reading of one is
// here, so that what a reply means is decided in one place.

// lastingRefusal reports whether FUNCTION LOAD's error says it will never
// work here: a command Redis does not know (before 7), one the ACL denies,
// or a library it cannot register. Anything else (LOADING, READONLY,
// CLUSTERDOWN, "max number of clients", the network) may pass, and the
// load is tried again.
func lastingRefusal(err error) bool {
	var reply goredis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	if strings.HasPrefix(msg, "NOPERM") {
		return true
	}
	for _, s := range []string{"unknown command", "unknown subcommand", "Error registering functions", "Error compiling"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// fcallRefused reports an FCALL that Redis will never run for this user:
// the ACL denies the command itself (not a key, which the script would
// meet too), or Redis does not know it.
func fcallRefused(err error) bool {
	var reply goredis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := strings.ToLower(reply.Error())
	return strings.HasPrefix(msg, "noperm") && strings.Contains(msg, "'fcall'") || strings.Contains(msg, "unknown command")
}

// functionMissing reports an FCALL that did not run because the library
// is not loaded on that node (a restart without persistence, FUNCTION
// FLUSH, a new Cluster master).
func functionMissing(err error) bool {
	return goredis.HasErrorPrefix(err, "Function not found") // go-redis drops the "ERR "
}

// plainRefused reports an error that says Redis will never run a plain
// call's commands for this user (an ACL without them) or does not know
// them: the function, which the ACL allowed, serves from then on. A
// refused EXEC comes as the transaction's EXECABORT naming the NOPERM, and
// a refused MULTI as the EXEC that followed it ("EXEC without MULTI"; the
// commands between ran on their own, each INCRBY with its PEXPIREAT, and
// the function counts those hits again, as it does the scripted calls
// sent with them, run again alone: an ACL changed under a running service
// rejects a little sooner, never admits more).
func plainRefused(err error) bool {
	var reply goredis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := strings.ToLower(reply.Error())
	return strings.HasPrefix(msg, "noperm") || strings.Contains(msg, "because of: noperm") ||
		strings.Contains(msg, "unknown command") || strings.Contains(msg, "exec without multi")
}

// scriptFlushed reports a call of the script (EVALSHA) that did not run
// because Redis no longer holds the script (a restart, SCRIPT FLUSH, a
// failover): run again as EVAL, it counts once.
func scriptFlushed(err error) bool { return goredis.HasErrorPrefix(err, "NOSCRIPT") }

// txAborted reports a transaction that did not run, or not as one: Redis
// refused a command as it was queued (EXECABORT: an ACL, maxmemory), or
// the MULTI itself (see plainRefused).
func txAborted(err error) bool { return goredis.HasErrorPrefix(err, "EXECABORT") || plainRefused(err) }

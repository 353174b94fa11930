package rlqs

import (
	"fmt"
	"runtime/debug"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// One owner: a single goroutine owns the graph of streams, buckets,
// members, pools and ledgers (state). Every other goroutine (a stream's
// reader and sender, the rounds, a metrics scrape) asks it for work by a
// message and waits for the answer. None holds the state itself; the
// pointers into it that they carry (a bucket due a round, the grants a
// message sent) are read and changed only in messages. A stream that
// closes while a round is at the store is one more message, taken in its
// turn.

// state is what the owner owns.
type state struct {
	o     *Options // the service's: read only once serving
	stats *stats

	streams map[*stream]struct{}
	// flooded holds, by client address, until when its new streams are
	// refused: one of its streams was ended for its report rate.
	flooded map[string]time.Time
	pools   map[string]*pool
	nextID  uint64
	buckets int // across streams
	idBytes int // their ids' bytes (Options.MaxTotalIDBytes)
	// departed is the messages that have left since the last round, whose
	// grants that round hands over (see deliver.go).
	departed []departure
	// lenders is the buckets reported since the last round, whose
	// reports may give back what they did not use (see lending).
	lenders []*bucket
	// atOnce is the buckets due a round at once that the rounds have not
	// taken yet (see report); dueSignal tells Run there are some.
	atOnce    []*bucket
	dueSignal chan struct{} // buffered 1
}

// message is one piece of work for the owner; done carries what panicked
// in it, or nil.
type message struct {
	f    func(*state)
	done chan *panicked
}

// panicked is a panic caught at an edge of the package's goroutines.
type panicked struct {
	value any
	stack []byte
}

// catch runs f and returns what panicked in it, if anything. It is the
// package's one recover: the owner runs each message through it, and each
// goroutine the package starts runs its body through it (guard), so that
// a panic ends the work it was part of, never the process.
func catch(f func()) (p *panicked) {
	defer func() {
		if r := recover(); r != nil {
			p = &panicked{value: r, stack: debug.Stack()}
		}
	}()
	f()
	return nil
}

// own starts the owner of g and returns the way to it. The owner serves
// until stop is closed (Run's end); a message it took is answered first.
func own(g *state, stop <-chan struct{}) chan<- message {
	in := make(chan message)
	go func() {
		for {
			select {
			case m := <-in:
				m.done <- catch(func() { m.f(g) })
			case <-stop:
				return
			}
		}
	}()
	return in
}

// do runs f on the owner and waits for it. A panic in f is counted,
// logged and returned as an error naming what, for the caller to end the
// stream it serves; the owner goes on with the next message. Once the
// service has stopped, do runs nothing and says so.
func (s *Service) do(what string, f func(*state)) error {
	done := make(chan *panicked, 1)
	select {
	case s.owner <- message{f: f, done: done}:
	case <-s.stopped:
		return status.Errorf(codes.Unavailable, "rlqs: the service has stopped (%s)", what)
	}
	if p := <-done; p != nil {
		return s.recovered(p, what)
	}
	return nil
}

// guard runs body, the whole of a goroutine the package starts, and
// returns its error, or what panicked in it as an error naming what.
func (s *Service) guard(what string, body func() error) (err error) {
	if p := catch(func() { err = body() }); p != nil {
		return s.recovered(p, what)
	}
	return err
}

func (p *panicked) String() string { return fmt.Sprint(p.value) }

// Command client asks a rate limit service for a decision, as Envoy would:
//
//	client -addr localhost:8081 -domain example -descriptors generic_key=demo [-descriptors k=v,k2=v2] [-hits 1] [-refund]
//	client -explain [-debug_addr localhost:6070] -domain example -descriptors generic_key=demo
//
// -explain asks the service's debug port how its config decides the
// request (the rule each entry matches and the ones that lost, the limits
// and their keys), counting nothing, and prints the answer.
//
// -dial_string is accepted for -addr, so scripts written for
// envoyproxy/ratelimit's client keep working.
//
// It prints the overall code and one line per descriptor: the limit that
// decided it, or, for one answered OK without a limit, why (unknown
// domain, unlimited, no rule matches: the answer does not say, so the
// client asks the debug port's /explain, briefly). It exits 0 for OK, 2
// for OVER_LIMIT and 1 for an error.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/openrls/ratelimit/src/buildinfo"
	"github.com/openrls/ratelimit/src/cmdline"
	"github.com/openrls/ratelimit/src/config"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// descriptorsFlag collects repeated -descriptors k=v,k2=v2 values.
type descriptorsFlag []*rlv3.RateLimitDescriptor

func (d *descriptorsFlag) String() string { return fmt.Sprint(len(*d), " descriptors") }

func (d *descriptorsFlag) Set(s string) error {
	desc, err := config.ParseDescriptor(s)
	if err != nil {
		return err
	}
	*d = append(*d, desc)
	return nil
}

// explainRemote asks GET /explain on the debug port and prints the answer.
func explainRemote(addr, domain string, descs descriptorsFlag, timeout time.Duration, stdout, stderr io.Writer) int {
	q := url.Values{"domain": {domain}}
	for _, d := range descs {
		q.Add("descriptor", entriesString(d))
	}
	c := &http.Client{Timeout: timeout}
	resp, err := c.Get("http://" + addr + "/explain?" + q.Encode())
	if err != nil {
		fmt.Fprintln(stderr, "client:", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "client: %s: %s", resp.Status, body)
		return 1
	}
	_, _ = stdout.Write(body)
	return 0
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "localhost:8081", "gRPC address of the rate limit service")
	fs.StringVar(addr, "dial_string", "localhost:8081", "the same as -addr, under the reference client's name")
	domain := fs.String("domain", "", "rate limit domain (required)")
	hits := fs.Uint64("hits", 1, "how many hits each descriptor counts (its hits_addend); 0 is a check, which counts nothing")
	refund := fs.Bool("refund", false, "give -hits back instead of counting them (is_negative_hits), as a usage report after the fact does")
	timeout := fs.Duration("timeout", 2*time.Second, "deadline of the call")
	explain := fs.Bool("explain", false, "print how the service's config decides the request, counting nothing (asks the debug port)")
	debugAddr := fs.String("debug_addr", "localhost:6070", "debug port address of the service, for -explain and to say why an answer had no limit")
	var descs descriptorsFlag
	fs.Var(&descs, "descriptors", "one descriptor as key=value[,key=value...]; repeat for several")
	version := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() { usage(fs) }
	if cmdline.HelpAsked(args) {
		fs.SetOutput(stdout)
		fs.Usage()
		return 0
	}
	if err := fs.Parse(args); err != nil {
		return 1
	}
	if *version {
		fmt.Fprintln(stdout, buildinfo.Read())
		return 0
	}
	if *domain == "" || len(descs) == 0 {
		fmt.Fprintln(stderr, "client: -domain and at least one -descriptors are required")
		return 1
	}
	if *explain {
		return explainRemote(*debugAddr, *domain, descs, *timeout, stdout, stderr)
	}
	for _, d := range descs {
		// Each descriptor's own hits_addend, which (unlike the request's,
		// where 0 means 1) can say 0: a check.
		d.HitsAddend, d.IsNegativeHits = wrapperspb.UInt64(*hits), *refund
	}
	resp, err := ask(*addr, &rlsv3.RateLimitRequest{Domain: *domain, Descriptors: descs}, *timeout)
	if err != nil {
		fmt.Fprintln(stderr, "client:", err)
		return 1
	}
	printResponse(stdout, descs, resp, whyNoLimit(*debugAddr, *domain, descs, resp, *timeout))
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		return 2
	}
	return 0
}

// usage prints the client's help on fs's output.
func usage(fs *flag.FlagSet) {
	fmt.Fprint(fs.Output(), `client asks a rate limit service for a decision, as Envoy would.

Usage:
  client [-addr HOST:PORT] -domain DOMAIN -descriptors K=V[,K=V...] [-descriptors ...] [-hits N] [-refund]
  client -explain [-debug_addr HOST:PORT] -domain DOMAIN -descriptors K=V[,K=V...]
  client -version

It exits 0 for OK, 2 for OVER_LIMIT and 1 for an error.

Flags:
`)
	fs.PrintDefaults()
}

// ask sends req to the service at addr, over plaintext gRPC.
func ask(addr string, req *rlsv3.RateLimitRequest, timeout time.Duration) (*rlsv3.RateLimitResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
}

// printResponse prints the overall code, then each descriptor's status
// and the limit that decided it, or, where none did, why (why, by
// descriptor: see whyNoLimit).
func printResponse(w io.Writer, descs []*rlv3.RateLimitDescriptor, resp *rlsv3.RateLimitResponse, why []string) {
	fmt.Fprintln(w, resp.GetOverallCode())
	for i, st := range resp.GetStatuses() {
		fmt.Fprintf(w, "  %s: %s", entriesString(descs[i]), st.GetCode())
		if l := st.GetCurrentLimit(); l != nil {
			fmt.Fprintf(w, ", limit %d/%s, remaining %d, reset in %v", l.GetRequestsPerUnit(),
				strings.ToLower(l.GetUnit().String()), st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration())
		} else if i < len(why) && why[i] != "" {
			fmt.Fprintf(w, " (%s)", why[i])
		}
		fmt.Fprintln(w)
	}
}

// whyNoLimit says, for each descriptor answered OK without a limit, why:
// an unknown domain, no rule, an unlimited rule, or no limit at its
// depth. The answer does not say, so the service's /explain is asked,
// briefly; where it does not answer, every such descriptor says that no
// limit applied and how to learn why.
func whyNoLimit(debugAddr, domain string, descs []*rlv3.RateLimitDescriptor, resp *rlsv3.RateLimitResponse, timeout time.Duration) []string {
	why := make([]string, len(resp.GetStatuses()))
	need := false
	for i, st := range resp.GetStatuses() {
		need = need || st.GetCurrentLimit() == nil && st.GetCode() == rlsv3.RateLimitResponse_OK && i < len(descs)
	}
	if !need {
		return why
	}
	var out, errb strings.Builder
	if explainRemote(debugAddr, domain, descs, min(timeout, time.Second), &out, &errb) != 0 {
		for i := range why {
			why[i] = "no limit applies: an unknown domain, no rule or an unlimited one; -explain says which"
		}
		return why
	}
	return explainReasons(out.String(), len(why))
}

// explainReasons reads config.Explain's text for n descriptors: for each,
// the reason it was answered without a limit, or "" where a limit applies.
func explainReasons(text string, n int) []string {
	why := make([]string, n)
	if strings.Contains(text, "not in the config: every descriptor is answered OK without a limit") {
		for i := range why {
			why[i] = "unknown domain"
		}
		return why
	}
	i := -1
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "descriptors["):
			i++
		case i < 0 || i >= n:
		case strings.HasPrefix(line, "  rule: none"):
			why[i] = "no rule matches"
		case line == "  limit: unlimited":
			why[i] = "unlimited"
		case strings.HasPrefix(line, "  limit: none at this depth"):
			why[i] = "the rule has no limit at this depth"
		}
	}
	return why
}

func entriesString(d *rlv3.RateLimitDescriptor) string {
	parts := make([]string, len(d.GetEntries()))
	for i, e := range d.GetEntries() {
		parts[i] = e.GetKey() + "=" + e.GetValue()
	}
	return strings.Join(parts, ",")
}

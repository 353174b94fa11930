// Command config-check validates descriptor config files before they ship:
//
//	config-check [-merge] [-ignore-dotfiles] [-dump | -summary] PATH...
//	config-check -explain DOMAIN KEY=VALUE[,KEY=VALUE...][;...] PATH...
//
// With -explain it also prints, counting nothing, how the config decides
// the request of that domain and descriptors (';' between descriptors):
// the rule each entry matches and the ones that lost, the limits that
// apply and their counter keys (config.Explain).
//
// Each PATH is a file or a directory. A directory is read exactly as the
// service reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY:
// every file in it a descriptor config, so config-check fails on a
// directory exactly when the service would refuse it. A file named on the
// command line that holds Kubernetes ConfigMaps is checked by their
// *.yaml/*.yml data entries, named FILE#ENTRY with lines counted within
// the entry; one that is plainly something else (an Envoy bootstrap, other
// Kubernetes objects, a Compose file, Prometheus rules) is named as
// skipped, with what it is (config-check examples/*.yaml checks a
// repository's configs among other YAML). Every problem is printed on
// its own line as file:line: path: message, and the exit code is 1 if there
// is any, 2 for bad usage, 0 otherwise. Rules no request can match under
// the service's request bounds (REQUEST_MAX_STRING_BYTES,
// REQUEST_MAX_ENTRIES, REQUEST_MAX_BYTES, read from the environment like
// the service) are reported as warnings, as are entries that are not
// regular files and pairs of wildcards that WILDCARD_PRECEDENCE (read from
// the environment too) decides otherwise than its other value would;
// warnings alone leave the exit code 0.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/openrls/ratelimit/src/buildinfo"
	"github.com/openrls/ratelimit/src/cmdline"
	"github.com/openrls/ratelimit/src/config"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// options are config-check's flags.
type options struct {
	merge, ignoreDot, dump, summary, version bool
	explain                                  string
}

// newFlagSet declares config-check's flags, its usage written to stderr.
func newFlagSet(stderr io.Writer) (*flag.FlagSet, *options) {
	fs := flag.NewFlagSet("config-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.BoolVar(&o.merge, "merge", false, "allow one domain in several files (MERGE_DOMAIN_CONFIG)")
	fs.BoolVar(&o.ignoreDot, "ignore-dotfiles", false, "skip dotfiles in directories (RUNTIME_IGNOREDOTFILES)")
	fs.BoolVar(&o.dump, "dump", false, "print the loaded config, one line per limit")
	fs.BoolVar(&o.summary, "summary", false, "print one line per domain: rules, wildcards, limits")
	fs.StringVar(&o.explain, "explain", "", "DOMAIN: print how the config decides the descriptors given as the first argument")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `config-check validates descriptor config files with the service's own parser.

Usage:
  config-check [-merge] [-ignore-dotfiles] [-dump | -summary] PATH...
  config-check -explain DOMAIN KEY=VALUE[,KEY=VALUE...][;...] PATH...
  config-check -version

Each PATH is a config file, a directory of them (read as the service reads its
config directory) or a Kubernetes ConfigMap. Problems are printed as
file:line: path: message; the exit code is 1 if there is any, 2 for bad usage.
REQUEST_MAX_STRING_BYTES, REQUEST_MAX_ENTRIES, REQUEST_MAX_BYTES and
WILDCARD_PRECEDENCE are read from the environment, as the service reads them.

Flags:
`)
		fs.PrintDefaults()
	}
	return fs, o
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs, o := newFlagSet(stderr)
	if cmdline.HelpAsked(args) {
		fs.SetOutput(stdout)
		fs.Usage()
		return 0
	}
	// Flags may come after the paths too (config-check DIR -summary):
	// parse, take the next argument that is not a flag, parse the rest.
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		rest, args = append(rest, fs.Arg(0)), fs.Args()[1:]
	}
	if o.version {
		fmt.Fprintln(stdout, buildinfo.Read())
		return 0
	}
	args = rest
	var explain *rlsv3.RateLimitRequest
	if o.explain != "" {
		var code int
		if explain, args, code = explainRequest(o.explain, args, stderr); code != 0 {
			return code
		}
	}
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: config-check [-merge] [-ignore-dotfiles] [-dump | -summary | -explain DOMAIN DESCRIPTORS] PATH...")
		return 2
	}
	paths, fromDir, code := gatherPaths(args, o.ignoreDot, stderr)
	if code != 0 {
		return code
	}
	copts, bounds, err := checkOptions(getenv, o.merge)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	cfgs, summary, code := checkPaths(paths, fromDir, copts, bounds, stderr)
	if code != 0 {
		return code
	}
	return report(cfgs, o, explain, summary, stdout, stderr)
}

// report prints what the flags ask of the checked sets, then the OK line.
// Each set is a config of its own (the plain files, each manifest's
// ConfigMaps): all of them are dumped and summarized, as the OK line
// counts them all, and a request is explained by the set that has its
// domain (else the first, which says the domain is unknown).
func report(cfgs []*config.Config, o *options, explain *rlsv3.RateLimitRequest, summary string, stdout, stderr io.Writer) int {
	for _, cfg := range cfgs {
		if o.dump {
			_ = cfg.WriteDump(stdout)
		}
		if o.summary {
			fmt.Fprint(stdout, cfg.Summary())
		}
	}
	if explain != nil {
		cfg := cfgs[0]
		for _, c := range cfgs {
			if c.Domain(explain.Domain) != nil {
				cfg = c
				break
			}
		}
		if err := cfg.Explain(stdout, time.Now(), explain.Domain, explain.Descriptors); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	fmt.Fprintln(stdout, summary)
	return 0
}

// explainRequest takes -explain's descriptors out of args: they come
// first, or after the paths when the flags do (config-check FILE -explain
// DOMAIN 'k=v'): the first argument that is no file and holds a '='. code
// is the exit code when they are missing or malformed.
func explainRequest(domain string, args []string, stderr io.Writer) (req *rlsv3.RateLimitRequest, paths []string, code int) {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: config-check -explain DOMAIN KEY=VALUE[,KEY=VALUE...][;...] PATH...")
		return nil, nil, 2
	}
	at := 0
	for i, a := range args {
		if _, err := os.Stat(a); err != nil && strings.Contains(a, "=") {
			at = i
			break
		}
	}
	req, err := config.ParseRequest(domain, strings.Split(args[at], ";"))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, nil, 2
	}
	return req, append(args[:at:at], args[at+1:]...), 0
}

// gatherPaths lists the config files args name; a directory's files are
// listed as the service lists its config directory (RUNTIME_ROOT...):
// every file whatever its name, its skipped entries named on stderr, and
// marked in fromDir, since they are then checked as the service loads
// them (see parseAll). code is the exit code when it fails.
func gatherPaths(args []string, ignoreDot bool, stderr io.Writer) (paths []string, fromDir map[string]bool, code int) {
	fromDir = map[string]bool{}
	for _, p := range args {
		fi, err := os.Stat(p)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return nil, nil, 1
		}
		if !fi.IsDir() {
			paths = append(paths, p)
			continue
		}
		found, skipped, err := config.FindFiles(p, ignoreDot)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return nil, nil, 1
		}
		for _, path := range slices.Sorted(maps.Keys(skipped)) {
			fmt.Fprintf(stderr, "warning: %s: %v; skipped, as the service skips it\n", path, skipped[path])
		}
		for _, path := range found {
			paths = append(paths, path)
			fromDir[path] = true
		}
	}
	if len(paths) == 0 {
		fmt.Fprintln(stderr, "no config files found")
		return nil, nil, 1
	}
	return paths, fromDir, 0
}

// checkOptions reads the settings config-check shares with the service
// from the environment.
func checkOptions(getenv func(string) string, merge bool) (config.Options, config.RequestBounds, error) {
	bounds, err := requestBounds(getenv)
	if err != nil {
		return config.Options{}, bounds, err
	}
	wildcards := config.WildcardFirst
	if v := getenv("WILDCARD_PRECEDENCE"); v != "" {
		if wildcards, err = config.ParseWildcardPrecedence(v); err != nil {
			return config.Options{}, bounds, fmt.Errorf("WILDCARD_PRECEDENCE: %w", err)
		}
	}
	return config.Options{MergeDomains: merge, MaxDepth: bounds.MaxEntries, Wildcards: wildcards}, bounds, nil
}

// checkPaths parses and checks the files at paths (those of fromDir as
// the service loads a directory), printing every problem on stderr. It
// returns each set's config (the plain files, then each manifest's
// ConfigMaps) and the closing "OK" line, or the exit code.
func checkPaths(paths []string, fromDir map[string]bool, opts config.Options, bounds config.RequestBounds, stderr io.Writer) (cfgs []*config.Config, summary string, code int) {
	sets, skipped, err := parseAll(paths, fromDir, stderr)
	for _, sk := range skipped {
		fmt.Fprintln(stderr, "skipped: "+sk)
	}
	if err != nil {
		for _, line := range flatten(err) {
			fmt.Fprintln(stderr, line)
		}
		return nil, "", 1
	}
	if len(sets) == 0 {
		fmt.Fprintln(stderr, "no descriptor config among the files")
		return nil, "", 1
	}
	var domains []string
	nfiles, failed := 0, false
	for _, set := range sets {
		c, ok := checkSet(set, opts, bounds, stderr)
		failed = failed || !ok
		if c == nil {
			continue
		}
		cfgs = append(cfgs, c)
		for _, d := range c.Domains() {
			if !slices.Contains(domains, d) {
				domains = append(domains, d)
			}
		}
		nfiles += len(set)
	}
	if failed {
		return nil, "", 1
	}
	slices.Sort(domains)
	files := "files"
	if nfiles == 1 {
		files = "file"
	}
	return cfgs, fmt.Sprintf("OK: %d %s, domains %s", nfiles, files, strings.Join(domains, ", ")), 0
}

// requestBounds are the service's request bounds, from the same variables
// the service reads, so that a check in the service's environment warns
// about exactly the rules it could never match.
func requestBounds(getenv func(string) string) (config.RequestBounds, error) {
	b := config.DefaultRequestBounds
	for _, v := range []struct {
		name string
		dst  *int
	}{{"REQUEST_MAX_STRING_BYTES", &b.MaxStringBytes}, {"REQUEST_MAX_ENTRIES", &b.MaxEntries}, {"REQUEST_MAX_BYTES", &b.MaxRequestBytes}} {
		if s := getenv(v.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return b, fmt.Errorf("%s: invalid value %q: want a whole number of at least 1", v.name, s)
			}
			*v.dst = n
		}
	}
	return b, nil
}

// parseAll parses every path, reporting every file's problems together,
// into sets of files that are checked apart: the descriptor config files
// (one set, as the service loads one directory), then each Kubernetes
// manifest's ConfigMaps (a set each: each is mounted as a directory of its
// own), their *.yaml/*.yml entries named FILE#ENTRY. A file named on the
// command line that is plainly not a descriptor config (config.Classify) is
// passed over, named in skipped with what it is. A file of a directory
// (fromDir) is read as the service reads its config directory: every file
// a descriptor config, its first YAML document only (a note of what is
// not read goes to stderr, as the service logs it), so that config-check
// fails on a directory exactly when the service would; the error of one
// that is plainly something else says what it is.
func parseAll(paths []string, fromDir map[string]bool, stderr io.Writer) (sets [][]*config.File, skipped []string, err error) {
	var errs []error
	var plain []*config.File
	total, inDir := 0, len(fromDir) // a directory's bytes, bounded as the service bounds them (config.MaxConfigBytes)
	read := 0
	for _, p := range paths {
		if fromDir[p] {
			read++
		}
		data, err := config.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if fromDir[p] {
			if total += len(data); total > config.MaxConfigBytes {
				errs = append(errs, config.TooLarge(p, read, inDir, total))
				break
			}
		}
		what, cms := config.Classify(data)
		if what == "" || fromDir[p] {
			f, err := config.Parse(p, data)
			switch {
			case err != nil && what != "":
				errs = append(errs, err, config.NotAConfig(p, what))
			case err != nil:
				errs = append(errs, err)
			default:
				if f.Ignored != "" {
					fmt.Fprintf(stderr, "warning: %s: %s\n", p, f.Ignored)
				}
				plain = append(plain, f)
			}
			continue
		}
		if len(cms) == 0 {
			skipped = append(skipped, p+": "+what+", not a descriptor config")
			continue
		}
		var set []*config.File
		for _, name := range slices.Sorted(maps.Keys(cms)) {
			f, err := config.Parse(p+"#"+name, []byte(cms[name]))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			set = append(set, f)
		}
		sets = append(sets, set)
	}
	if len(plain) > 0 {
		sets = append([][]*config.File{plain}, sets...)
	}
	return sets, skipped, errors.Join(errs...)
}

// checkSet builds one set of files as the service would load them,
// printing its errors, or its warnings (unreachable rules, replaces that
// name nothing, wildcards the two precedences decide differently). ok is
// false on errors.
func checkSet(files []*config.File, opts config.Options, bounds config.RequestBounds, stderr io.Writer) (cfg *config.Config, ok bool) {
	cfg, err := config.Build(files, opts)
	if err != nil {
		for _, line := range flatten(err) {
			fmt.Fprintln(stderr, line)
		}
		return nil, false
	}
	warnings := append(config.Unreachable(files, bounds), config.UnknownReplaces(files)...)
	for _, w := range append(warnings, config.Overlaps(files, opts.Wildcards)...) {
		fmt.Fprintln(stderr, "warning: "+w.Error())
	}
	return cfg, true
}

// flatten lists the leaves of a joined error.
func flatten(err error) []string {
	var j interface{ Unwrap() []error }
	if errors.As(err, &j) {
		var out []string
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []string{err.Error()}
}

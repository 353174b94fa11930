// Package buildinfo says which build of the service runs: the module
// version, the VCS revision it was built from, and the Go version, as the
// Go toolchain stamps them into every binary.
package buildinfo

import (
	"fmt"
	"runtime/debug"
)

// Info is what a binary knows of its build. Fields it cannot know are
// "unknown": a build outside a git checkout (a container build without
// .git) has no revision; one of the module's own tree has version "devel".
type Info struct {
	Version, Revision, GoVersion string
	// Modified is set when the working tree had uncommitted changes.
	Modified bool
}

// Read returns the running binary's build information.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "unknown", Revision: "unknown", GoVersion: "unknown"}
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: bi.Main.Version, Revision: "unknown", GoVersion: bi.GoVersion}
	if in.Version == "" || in.Version == "(devel)" {
		in.Version = "devel"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	if in.GoVersion == "" {
		in.GoVersion = "unknown"
	}
	return in
}

// String is the one line -version prints, e.g.
// "ratelimit devel (revision 1a2b3c4d, modified) go1.26.8".
func (in Info) String() string {
	rev := in.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if in.Modified {
		rev += ", modified"
	}
	return fmt.Sprintf("ratelimit %s (revision %s) %s", in.Version, rev, in.GoVersion)
}

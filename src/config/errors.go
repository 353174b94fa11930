package config

import (
	"fmt"
	"strings"
)

// Error is one problem in a config file, positioned for a human: it renders as
// "file.yaml:14: descriptors[2].rate_limit.unit: unknown unit \"minutes\"".
type Error struct {
	File string
	Line int    // 1-based; 0 when the problem has no single line
	Path string // e.g. descriptors[2].rate_limit.unit; empty for the whole file
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

func sprintf(format string, args ...any) string {
	if len(args) == 0 {
		return format
	}
	return fmt.Sprintf(format, args...)
}

package main

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"io"
	"slices"
	"strings"
	"testing"
)

// field encodes one length-delimited field.
func field(num uint64, body string) []byte {
	b := binary.AppendUvarint(nil, num<<3|2)
	b = binary.AppendUvarint(b, uint64(len(body)))
	return append(b, body...)
}

func varintField(num, v uint64) []byte {
	return binary.AppendUvarint(binary.AppendUvarint(nil, num<<3), v)
}

func TestScrub(t *testing.T) {
	tests := []struct {
		name     string
		in, want [][]byte
	}{
		{
			name: "absolute paths lose their directories",
			in:   [][]byte{field(6, ""), field(6, "/tmp/build-123/server"), field(6, "/home/x/src/pkg/file.go")},
			want: [][]byte{field(6, ""), field(6, "server"), field(6, "file.go")},
		},
		{
			name: "names, relative paths and other fields are kept",
			in: [][]byte{field(3, "/not/a/string/table"), varintField(9, 1<<40), field(6, "runtime.mallocgc"),
				field(6, "google.golang.org/grpc@v1.85.0/server.go")},
			want: [][]byte{field(3, "/not/a/string/table"), varintField(9, 1<<40), field(6, "runtime.mallocgc"),
				field(6, "google.golang.org/grpc@v1.85.0/server.go")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := scrub(slices.Concat(tt.in...))
			if err != nil {
				t.Fatal(err)
			}
			if want := slices.Concat(tt.want...); !bytes.Equal(got, want) {
				t.Errorf("scrub = %q, want %q", got, want)
			}
		})
	}
}

func TestScrubRejectsMalformed(t *testing.T) {
	tests := map[string][]byte{
		"truncated length": {6<<3 | 2, 10, 'a'},
		"bad tag":          {0x80},
		"group wire type":  {6<<3 | 3},
		"truncated fixed":  {9<<3 | 1, 1, 2},
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := scrub(in); err == nil {
				t.Errorf("scrub(%v) = nil error", in)
			}
		})
	}
}

func TestRunRoundTripsGzip(t *testing.T) {
	var in bytes.Buffer
	zw := gzip.NewWriter(&in)
	_, _ = zw.Write(slices.Concat(field(6, "/a/b/server"), field(6, "main.main")))
	_ = zw.Close()
	var out bytes.Buffer
	if err := run(&in, &out); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(&out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(got), "/a/b") || !strings.Contains(string(got), "server") {
		t.Errorf("output %q still names the path or lost the name", got)
	}
}

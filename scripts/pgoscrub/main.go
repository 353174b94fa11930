// Command pgoscrub rewrites a pprof CPU profile so that it names no path of
// the machine it was taken on: every absolute path in its string table (the
// binary's location in a mapping, source files of a build without -trimpath)
// becomes its last element. Profile-guided optimisation matches functions by
// name and line offset, so it reads the scrubbed profile as the original.
//
//	go run ./scripts/pgoscrub < in.pgo > out.pgo
//
// The profile is a gzipped protocol buffer (github.com/google/pprof's
// profile.proto) whose string table is top-level field 6; every other field
// is copied byte for byte, so this needs no protobuf library.
package main

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pgoscrub:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	raw, err := io.ReadAll(in)
	if err != nil {
		return fmt.Errorf("read profile: %w", err)
	}
	if zr, err := gzip.NewReader(bytes.NewReader(raw)); err == nil {
		if raw, err = io.ReadAll(zr); err != nil {
			return fmt.Errorf("gunzip profile: %w", err)
		}
	}
	scrubbed, err := scrub(raw)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(out)
	if _, err := zw.Write(scrubbed); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	return zw.Close()
}

// stringTable is profile.proto's Profile.string_table field number.
const stringTable = 6

// scrub rewrites the string table entries of an uncompressed profile.
func scrub(msg []byte) ([]byte, error) {
	var out []byte
	for off := 0; off < len(msg); {
		start := off
		tag, n := binary.Uvarint(msg[off:])
		if n <= 0 {
			return nil, fmt.Errorf("byte %d: bad field tag", off)
		}
		off += n
		field, wire := tag>>3, tag&7
		switch wire {
		case 0: // varint
			_, n = binary.Uvarint(msg[off:])
			if n <= 0 {
				return nil, fmt.Errorf("byte %d: bad varint in field %d", off, field)
			}
			off += n
		case 1: // 64-bit
			off += 8
		case 5: // 32-bit
			off += 4
		case 2: // length-delimited
			l, n := binary.Uvarint(msg[off:])
			if n <= 0 || l > uint64(len(msg)-off-n) {
				return nil, fmt.Errorf("byte %d: bad length in field %d", off, field)
			}
			off += n
			body := msg[off : off+int(l)]
			off += int(l)
			if field == stringTable {
				s := scrubString(string(body))
				out = binary.AppendUvarint(out, tag)
				out = binary.AppendUvarint(out, uint64(len(s)))
				out = append(out, s...)
				continue
			}
		default:
			return nil, fmt.Errorf("byte %d: unsupported wire type %d in field %d", start, wire, field)
		}
		if off > len(msg) {
			return nil, errors.New("truncated profile")
		}
		out = append(out, msg[start:off]...)
	}
	return out, nil
}

// scrubString keeps the last element of an absolute path; anything else,
// function names included, is left as it is.
func scrubString(s string) string {
	if !strings.HasPrefix(s, "/") {
		return s
	}
	return path.Base(s)
}

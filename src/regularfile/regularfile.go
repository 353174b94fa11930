// Package regularfile reads the files an operator names (a descriptor
// config, a Redis credentials file, a statsd_exporter mapping) without
// ever blocking or reading without end: a FIFO with no writer, a device
// such as /dev/zero, a socket or a directory is refused, and a regular
// file past the caller's bound is refused instead of read.
package regularfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// ErrNotRegular says that a path is not a regular file (or a link to one).
var ErrNotRegular = errors.New("not a regular file")

// TooLargeError says that a file holds more than the bound its reader set.
type TooLargeError struct {
	Path  string
	Size  int64 // what was seen: the size stat gave, or what was read
	Max   int64
	Grown bool // the file grew past Max while being read
}

func (e *TooLargeError) Error() string {
	if e.Grown {
		return fmt.Sprintf("%s: grew past %d bytes while being read", e.Path, e.Max)
	}
	return fmt.Sprintf("%s: %d bytes, over %d", e.Path, e.Size, e.Max)
}

// Read reads path whole, if it is a regular file of at most max bytes.
// It opens without waiting for a FIFO's writer, then checks what it
// opened, so neither the open nor the read can block or run unbounded.
func Read(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, Kind(fi.Mode()))
	}
	if fi.Size() > max {
		return nil, &TooLargeError{Path: path, Size: fi.Size(), Max: max}
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, &TooLargeError{Path: path, Size: int64(len(data)), Max: max, Grown: true}
	}
	return data, nil
}

// Kind names what a file that is not regular is.
func Kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	}
	return "mode " + m.String()
}

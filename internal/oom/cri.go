package oom

import (
	"bytes"
	"time"
)

// criLine is one line of the CRI container log format that containerd and
// CRI-O write under /var/log/pods:
//
//	2026-11-23T09:00:00.123456789Z stderr F torch.OutOfMemoryError: CUDA out of memory.
//
// The runtime splits long output into several lines tagged P (partial) and
// ends it with one tagged F (full); the tag may carry more fields after a
// colon, which are ignored.
type criLine struct {
	ts      time.Time
	stream  int // streamStdout or streamStderr
	partial bool
	text    []byte
}

const (
	streamStdout = iota
	streamStderr
)

// parseCRI splits a line (without its newline) in the CRI format. ok is false
// for anything else, which the caller then treats as a plain text line.
func parseCRI(line []byte) (l criLine, ok bool) {
	sp := bytes.IndexByte(line, ' ')
	// RFC 3339 with a zone is at least 20 bytes ("2006-01-02T15:04:05Z");
	// checking its shape first keeps plain lines from paying for time.Parse.
	if sp < 20 || sp > 40 || line[4] != '-' || line[10] != 'T' {
		return criLine{}, false
	}
	ts, err := time.Parse(time.RFC3339Nano, string(line[:sp]))
	if err != nil {
		return criLine{}, false
	}
	rest := line[sp+1:]
	switch {
	case bytes.HasPrefix(rest, []byte("stdout ")):
		l.stream = streamStdout
	case bytes.HasPrefix(rest, []byte("stderr ")):
		l.stream = streamStderr
	default:
		return criLine{}, false
	}
	rest = rest[len("stdout "):]
	tag, text, _ := bytes.Cut(rest, []byte(" "))
	kind, _, _ := bytes.Cut(tag, []byte(":"))
	switch string(kind) {
	case "P":
		l.partial = true
	case "F":
	default:
		return criLine{}, false
	}
	l.ts = ts
	l.text = text
	return l, true
}

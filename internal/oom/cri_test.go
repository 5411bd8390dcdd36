package oom

import (
	"testing"
	"time"
)

func TestParseCRI(t *testing.T) {
	ts := time.Date(2026, 11, 23, 9, 0, 0, 123456789, time.UTC)
	for _, tc := range []struct {
		name    string
		line    string
		ok      bool
		stream  int
		partial bool
		text    string
	}{
		{"full stderr", "2026-11-23T09:00:00.123456789Z stderr F RuntimeError: CUDA error: out of memory", true, streamStderr, false, "RuntimeError: CUDA error: out of memory"},
		{"partial stdout", "2026-11-23T09:00:00.123456789Z stdout P torch.OutOfMemoryError: CUDA", true, streamStdout, true, "torch.OutOfMemoryError: CUDA"},
		{"zone offset", "2026-11-23T10:00:00.123456789+01:00 stdout F x", true, streamStdout, false, "x"},
		{"tag with more fields", "2026-11-23T09:00:00.123456789Z stdout F:x y", true, streamStdout, false, "y"},
		{"empty text", "2026-11-23T09:00:00.123456789Z stdout F ", true, streamStdout, false, ""},
		{"no text, no space", "2026-11-23T09:00:00.123456789Z stdout F", true, streamStdout, false, ""},
		{"text keeps spaces", "2026-11-23T09:00:00.123456789Z stdout F   a  b ", true, streamStdout, false, "  a  b "},
		{"plain line", "RuntimeError: CUDA error: out of memory", false, 0, false, ""},
		{"bad stream", "2026-11-23T09:00:00.123456789Z stdin F x", false, 0, false, ""},
		{"bad tag", "2026-11-23T09:00:00.123456789Z stdout X x", false, 0, false, ""},
		{"bad time", "2026-13-23T09:00:00.123456789Z stdout F x", false, 0, false, ""},
		{"python log time", "2026-11-23 09:00:00,123 INFO step 3", false, 0, false, ""},
		{"empty", "", false, 0, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, ok := parseCRI([]byte(tc.line))
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if !l.ts.Equal(ts) || l.stream != tc.stream || l.partial != tc.partial || string(l.text) != tc.text {
				t.Errorf("got ts=%v stream=%d partial=%v text=%q, want ts=%v stream=%d partial=%v text=%q",
					l.ts, l.stream, l.partial, l.text, ts, tc.stream, tc.partial, tc.text)
			}
		})
	}
}

func FuzzParseCRI(f *testing.F) {
	f.Add([]byte("2026-11-23T09:00:00.123456789Z stderr F RuntimeError: CUDA error: out of memory"))
	f.Add([]byte("2026-11-23T09:00:00Z stdout P x"))
	f.Add([]byte("plain"))
	f.Fuzz(func(t *testing.T, line []byte) {
		if l, ok := parseCRI(line); ok && len(l.text) > len(line) {
			t.Errorf("text %q longer than line %q", l.text, line)
		}
	})
}

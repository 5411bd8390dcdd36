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

// Where a read stops (MaxReadBytes, a write not finished) must not change
// what is found: data fed in two pieces gives the events it gives whole.
func FuzzFeedSplit(f *testing.F) {
	f.Add([]byte(cri(0, "stderr", "P", "RuntimeError: CUDA out of")+cri(0, "stderr", "F", " memory. Tried")+"CUDA error: out of memory\n"), 37)
	f.Add([]byte("torch.OutOfMemoryError\r\nx\n"+cri(time.Minute, "stdout", "F", "cudaErrorMemoryAllocation")), 5)
	d, err := NewDetector(Config{})
	if err != nil {
		f.Fatal(err)
	}
	run := func(pieces ...[]byte) []Event {
		sc := &scan{cs: &containerState{instances: map[int]*instanceState{}}, now: t0}
		st, tf := &stream{}, &tailFile{}
		for _, p := range pieces {
			d.feed(sc, st, tf, p)
		}
		return sc.events
	}
	f.Fuzz(func(t *testing.T, data []byte, cut int) {
		if cut < 0 || cut > len(data) {
			return
		}
		whole, split := run(data), run(data[:cut], data[cut:])
		if len(whole) != len(split) {
			t.Fatalf("whole: %+v\nsplit at %d: %+v", whole, cut, split)
		}
		for i := range whole {
			if whole[i] != split[i] {
				t.Errorf("event %d whole %+v, split at %d %+v", i, whole[i], cut, split[i])
			}
		}
	})
}

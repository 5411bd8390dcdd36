package oom

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// t0 is the wall clock when the tests' detectors start; log lines are
// stamped after it.
var t0 = time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)

var trainer = Container{Namespace: "ml", Pod: "trainer-0", PodUID: "6f1c9a3e-5b7d-4e2a-9c1f-0a8b7c6d5e4f", Container: "pytorch"}

// world is a kubelet pod log directory under t.TempDir() and a clock.
type world struct {
	t    testing.TB
	root string
	now  time.Time
}

func newWorld(t *testing.T) *world {
	return &world{t: t, root: t.TempDir(), now: t0}
}

// started returns a world, the path of trainer's 0.log, not yet created, and
// a detector that has done its first Scan.
func started(t *testing.T, cfg Config) (*world, string, *Detector) {
	w := newWorld(t)
	p := w.logPath(trainer, 0)
	d := w.detector(cfg)
	w.scan(d, []Container{trainer})
	return w, p, d
}

func (w *world) detector(cfg Config) *Detector {
	w.t.Helper()
	cfg.PodLogsDir = w.root
	cfg.Now = func() time.Time { return w.now }
	d, err := NewDetector(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { d.Close() })
	return d
}

// logPath returns <root>/<ns>_<pod>_<uid>/<container>/<n>.log, creating its
// directory.
func (w *world) logPath(c Container, n int) string {
	w.t.Helper()
	dir := containerDir(w.root, c)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		w.t.Fatal(err)
	}
	return filepath.Join(dir, fmt.Sprintf("%d.log", n))
}

func (w *world) write(path, s string) {
	w.t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		w.t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		w.t.Fatal(err)
	}
}

// cri formats one CRI log line, at offset after t0.
func cri(after time.Duration, stream, tag, text string) string {
	return fmt.Sprintf("%s %s %s %s\n", t0.Add(after).Format(time.RFC3339Nano), stream, tag, text)
}

func (w *world) scan(d *Detector, cs []Container, terms ...Termination) []Event {
	w.t.Helper()
	evs, err := d.Scan(cs, terms)
	if err != nil {
		w.t.Fatalf("Scan: %v", err)
	}
	return evs
}

// noise is log output that matches nothing.
func noise(after time.Duration, n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(cri(after, "stdout", "F", fmt.Sprintf("step %d loss 0.%04d lr 3e-4 gpu_mem 11.2G", i, i)))
	}
	return b.String()
}

const (
	torchOOM   = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 47.53 GiB of which 1.06 GiB is free."
	runtimeOOM = "RuntimeError: CUDA error: out of memory"
)

func wantEvents(t *testing.T, got []Event, want ...Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d events %+v, want %d %+v", len(got), got, len(want), want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Container != w.Container || g.Instance != w.Instance || g.Source != w.Source ||
			g.Message != w.Message || !g.Time.Equal(w.Time) {
			t.Errorf("event %d = %+v, want %+v", i, g, w)
		}
	}
}

func logEv(c Container, n int, after time.Duration, msg string) Event {
	return Event{Container: c, Instance: n, Source: SourceLog, Message: msg, Time: t0.Add(after)}
}

func TestEveryPatternInCRILog(t *testing.T) {
	for _, tc := range oomLines {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			p := w.logPath(trainer, 0)
			w.write(p, noise(-time.Minute, 3))
			d := w.detector(Config{})
			wantEvents(t, w.scan(d, []Container{trainer}))
			w.write(p, noise(time.Second, 2)+cri(2*time.Second, "stderr", "F", tc.line)+noise(3*time.Second, 2))
			evs := w.scan(d, []Container{trainer})
			// The message is the line itself, or, past maxMessageBytes,
			// a cut of it as long as UTF-8 allows that keeps the match.
			want := strings.TrimSpace(tc.line)
			if len(want) > maxMessageBytes && len(evs) == 1 {
				m := evs[0].Message
				if !strings.Contains(want, m) || len(m) > maxMessageBytes || len(m) < maxMessageBytes-utf8.UTFMax || !d.matcher.re.MatchString(m) {
					t.Errorf("Message %q (%d bytes) is not a cut of the line to %d bytes that keeps the match", m, len(m), maxMessageBytes)
				}
				want = m
			}
			wantEvents(t, evs, logEv(trainer, 0, 2*time.Second, want))
		})
	}
	t.Run("ordinary lines", func(t *testing.T) {
		w, p, d := started(t, Config{})
		for i, line := range ordinaryLines {
			w.write(p, cri(time.Duration(i)*time.Minute, "stderr", "F", line))
		}
		wantEvents(t, w.scan(d, []Container{trainer}))
	})
}

func TestPartialLines(t *testing.T) {
	// PyTorch 1.x's message split inside "CUDA out of memory": neither part
	// matches alone.
	msg := oomLines[1].line
	cut := strings.Index(msg, "out of") + len("out of")
	head, tail := msg[:cut], msg[cut:]
	if m := mustMatcher(t); m.match([]byte(head)) || m.match([]byte(tail)) {
		t.Fatalf("split %q | %q leaves a matching part", head, tail)
	}
	for _, tc := range []struct {
		name   string
		writes []string // one Scan after each
		want   []int    // events found by each Scan
		at     time.Duration
	}{
		{
			name:   "P then F",
			writes: []string{cri(time.Second, "stderr", "P", head) + cri(time.Second, "stderr", "F", tail)},
			want:   []int{1},
			at:     time.Second,
		},
		{
			name: "three parts, output interleaved from stdout",
			writes: []string{cri(time.Second, "stderr", "P", head[:10]) +
				cri(time.Second, "stdout", "F", "epoch 3") +
				cri(time.Second, "stderr", "P", head[10:]) +
				cri(2*time.Second, "stdout", "P", "loss ") +
				cri(2*time.Second, "stderr", "F", tail) +
				cri(2*time.Second, "stdout", "F", "0.25")},
			want: []int{1},
			at:   time.Second,
		},
		{
			name:   "F arrives at the next Scan",
			writes: []string{cri(time.Second, "stderr", "P", head), cri(time.Second, "stderr", "F", tail)},
			want:   []int{0, 1},
			at:     time.Second,
		},
		{
			// containerd tags a process's last output P when it ends
			// without a newline, and no F line follows.
			name:   "a last line without its end",
			writes: []string{cri(time.Second, "stderr", "P", head+tail), ""},
			want:   []int{0, 1},
			at:     time.Second,
		},
		{
			name:   "its end comes after a Scan matched its start",
			writes: []string{cri(time.Second, "stderr", "P", head+tail), "", cri(time.Second, "stderr", "F", " (PID 42)")},
			want:   []int{0, 1, 0},
			at:     time.Second,
		},
		{
			// Cut at containerd's line length: the rest of the line is
			// still to come, and the line is matched whole.
			name:   "a line cut at the runtime's length waits for its end",
			writes: []string{cri(time.Second, "stderr", "P", head+tail+strings.Repeat(" ", 16<<10-len(head+tail))), "", cri(time.Second, "stderr", "F", "(PID 42)")},
			want:   []int{0, 0, 1},
			at:     time.Second,
		},
		{
			name:   "a start that does not match waits for its end",
			writes: []string{cri(time.Second, "stderr", "P", head), "", "", cri(time.Second, "stderr", "F", tail)},
			want:   []int{0, 0, 0, 1},
			at:     time.Second,
		},
		{
			name: "each part matches: still one event",
			writes: []string{cri(time.Second, "stderr", "P", runtimeOOM+" ") +
				cri(time.Second, "stderr", "F", torchOOM)},
			want: []int{1},
			at:   time.Second,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, p, d := started(t, Config{})
			var all []Event
			for i, s := range tc.writes {
				w.write(p, s)
				evs := w.scan(d, []Container{trainer})
				if len(evs) != tc.want[i] {
					t.Fatalf("Scan %d: %d events %+v, want %d", i+1, len(evs), evs, tc.want[i])
				}
				all = append(all, evs...)
			}
			if all[0].Instance != 0 || !all[0].Time.Equal(t0.Add(tc.at)) || !strings.Contains(all[0].Message, "CUDA out of memory") {
				t.Errorf("event %+v: want instance 0 at %v naming the joined message", all[0], t0.Add(tc.at))
			}
		})
	}
}

func mustMatcher(t *testing.T) *matcher {
	m, err := newMatcher(DefaultPatterns)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestAppendedOOMCountsOnce(t *testing.T) {
	w := newWorld(t)
	p := w.logPath(trainer, 0)
	w.write(p, noise(-time.Hour, 10))
	d := w.detector(Config{})
	wantEvents(t, w.scan(d, []Container{trainer}))
	w.write(p, noise(time.Second, 5)+cri(2*time.Second, "stderr", "F", torchOOM))
	wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, 2*time.Second, torchOOM))
	for range 3 {
		wantEvents(t, w.scan(d, []Container{trainer}))
	}
	w.write(p, noise(3*time.Second, 5))
	wantEvents(t, w.scan(d, []Container{trainer}))
}

// A traceback's several matching lines are one event; a matching line at
// least CollapseWindow later is another; another instance is separate.
func TestCollapseWindow(t *testing.T) {
	w := newWorld(t)
	p0, p1 := w.logPath(trainer, 0), w.logPath(trainer, 1)
	d := w.detector(Config{})
	w.scan(d, []Container{trainer})
	w.write(p0, cri(10*time.Second, "stderr", "F", "Traceback (most recent call last):")+
		cri(10*time.Second, "stderr", "F", torchOOM)+
		cri(10*time.Second, "stderr", "F", "During handling of the above exception, another exception occurred:")+
		cri(11*time.Second, "stderr", "F", runtimeOOM)+
		cri(14900*time.Millisecond, "stderr", "F", runtimeOOM))
	w.write(p1, cri(12*time.Second, "stderr", "F", torchOOM))
	wantEvents(t, w.scan(d, []Container{trainer}),
		logEv(trainer, 0, 10*time.Second, torchOOM),
		logEv(trainer, 1, 12*time.Second, torchOOM))
	// 5 s after the counted event: a new one, even though the last line
	// counted into the first was only 0.1 s before.
	w.write(p0, cri(15*time.Second, "stderr", "F", runtimeOOM))
	wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, 15*time.Second, runtimeOOM))
	// The window also holds across Scans.
	w.write(p0, cri(16*time.Second, "stderr", "F", torchOOM))
	wantEvents(t, w.scan(d, []Container{trainer}))

	t.Run("configured window", func(t *testing.T) {
		w, p, d := started(t, Config{CollapseWindow: time.Minute})
		w.write(p, cri(0, "stderr", "F", torchOOM)+cri(59*time.Second, "stderr", "F", torchOOM)+cri(60*time.Second, "stderr", "F", torchOOM))
		wantEvents(t, w.scan(d, []Container{trainer}),
			logEv(trainer, 0, 0, torchOOM), logEv(trainer, 0, time.Minute, torchOOM))
	})
}

// Plain lines have no log time: those read by one Scan are one event.
func TestPlainLines(t *testing.T) {
	w, p, d := started(t, Config{})
	w.write(p, "Traceback (most recent call last):\n"+torchOOM+"\r\n"+runtimeOOM+"\n")
	w.now = t0.Add(time.Minute)
	wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, time.Minute, torchOOM))
	w.write(p, runtimeOOM+"\n")
	w.now = t0.Add(2 * time.Minute)
	wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, 2*time.Minute, runtimeOOM))
}

func TestRotation(t *testing.T) {
	t.Run("old and new file both count", func(t *testing.T) {
		w := newWorld(t)
		p := w.logPath(trainer, 0)
		w.write(p, noise(-time.Hour, 20))
		d := w.detector(Config{})
		w.scan(d, []Container{trainer})
		// Written just before the kubelet rotates, not yet scanned.
		w.write(p, noise(time.Second, 3)+cri(2*time.Second, "stderr", "F", torchOOM))
		if err := os.Rename(p, p+".20261123-090000"); err != nil {
			t.Fatal(err)
		}
		w.write(p, noise(20*time.Second, 3)+cri(21*time.Second, "stderr", "F", runtimeOOM))
		wantEvents(t, w.scan(d, []Container{trainer}),
			logEv(trainer, 0, 2*time.Second, torchOOM),
			logEv(trainer, 0, 21*time.Second, runtimeOOM))
		wantEvents(t, w.scan(d, []Container{trainer}))
		w.write(p, cri(40*time.Second, "stderr", "F", runtimeOOM))
		wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, 40*time.Second, runtimeOOM))
	})

	t.Run("rotated file larger than MaxReadBytes is finished first", func(t *testing.T) {
		w := newWorld(t)
		p := w.logPath(trainer, 0)
		w.write(p, "")
		d := w.detector(Config{MaxReadBytes: 1000})
		w.scan(d, []Container{trainer})
		w.write(p, noise(time.Second, 40)+cri(2*time.Second, "stderr", "F", torchOOM))
		if err := os.Rename(p, p+".20261123-090000"); err != nil {
			t.Fatal(err)
		}
		// A partial line ends the old file and its F line begins the new one.
		w.write(p+".20261123-090000", cri(30*time.Second, "stderr", "P", "RuntimeError: CUDA err"))
		w.write(p, cri(30*time.Second, "stderr", "F", "or: out of memory")+noise(31*time.Second, 40))
		var all []Event
		for range 20 {
			all = append(all, w.scan(d, []Container{trainer})...)
		}
		wantEvents(t, all,
			logEv(trainer, 0, 2*time.Second, torchOOM),
			logEv(trainer, 0, 30*time.Second, runtimeOOM))
	})

	t.Run("rotated file compressed before it was finished", func(t *testing.T) {
		w, p, d := started(t, Config{})
		w.write(p, cri(time.Second, "stderr", "F", torchOOM))
		if err := os.Rename(p, p+".20261123-090000.gz"); err != nil {
			t.Fatal(err)
		}
		w.write(p, cri(20*time.Second, "stderr", "F", runtimeOOM))
		wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, 20*time.Second, runtimeOOM))
	})

	t.Run("path missing between rename and reopen", func(t *testing.T) {
		w := newWorld(t)
		p := w.logPath(trainer, 0)
		w.write(p, "")
		d := w.detector(Config{})
		w.scan(d, []Container{trainer})
		w.write(p, cri(time.Second, "stderr", "F", torchOOM))
		if err := os.Rename(p, p+".20261123-090000"); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, time.Second, torchOOM))
		w.write(p, cri(20*time.Second, "stderr", "F", runtimeOOM))
		wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, 20*time.Second, runtimeOOM))
	})

	// The kubelet renames a rotated log back to N.log when the runtime
	// fails to reopen it (rotateLatestLog in its container_log_manager.go):
	// the same file comes back, and is read on from where it was read to,
	// not again from the start. A Scan may find the rotated file, or, in
	// the same race seen the other way, N.log gone and the rotated file
	// back at N.log before it is looked for (here, a name no rotation
	// gives): then what the file got meanwhile is read once it is back.
	for _, tc := range []struct {
		name, away      string
		whileAway, back []Event
	}{
		{"renamed back after a failed reopen", "0.log.20261123-090000",
			[]Event{logEv(trainer, 0, 4*time.Minute, torchOOM)}, nil},
		{"back at N.log before the rotated file was found", "away",
			nil, []Event{logEv(trainer, 0, 4*time.Minute, torchOOM)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, p, d := started(t, Config{})
			w.write(p, cri(time.Second, "stderr", "F", torchOOM))
			wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, time.Second, torchOOM))
			w.write(p, cri(2*time.Minute, "stderr", "F", runtimeOOM))
			wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, 2*time.Minute, runtimeOOM))
			w.write(p, cri(4*time.Minute, "stderr", "F", torchOOM))
			away := filepath.Join(filepath.Dir(p), tc.away)
			if err := os.Rename(p, away); err != nil {
				t.Fatal(err)
			}
			wantEvents(t, w.scan(d, []Container{trainer}), tc.whileAway...)
			if err := os.Rename(away, p); err != nil {
				t.Fatal(err)
			}
			wantEvents(t, w.scan(d, []Container{trainer}), tc.back...)
			w.write(p, cri(5*time.Minute, "stderr", "F", runtimeOOM))
			wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, 5*time.Minute, runtimeOOM))
		})
	}

	t.Run("rotated since the first Scan, before the container was named", func(t *testing.T) {
		w := newWorld(t)
		p := w.logPath(trainer, 0)
		w.write(p, cri(-time.Hour, "stderr", "F", torchOOM))
		d := w.detector(Config{})
		w.scan(d, nil)
		w.write(p, cri(time.Second, "stderr", "F", runtimeOOM))
		if err := os.Rename(p, p+".20261123-090000"); err != nil {
			t.Fatal(err)
		}
		w.write(p, cri(20*time.Second, "stderr", "F", torchOOM))
		wantEvents(t, w.scan(d, []Container{trainer}),
			logEv(trainer, 0, time.Second, runtimeOOM),
			logEv(trainer, 0, 20*time.Second, torchOOM))
	})
}

func TestTruncation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after string // what the file holds after truncation
	}{
		{"to empty, then written", cri(time.Minute, "stderr", "F", torchOOM)},
		{"shorter than the offset", cri(time.Minute, "stderr", "F", runtimeOOM)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, p, d := started(t, Config{})
			w.write(p, noise(time.Second, 50)+cri(2*time.Second, "stderr", "F", runtimeOOM)+noise(3*time.Second, 10))
			wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, 2*time.Second, runtimeOOM))
			if err := os.Truncate(p, 0); err != nil {
				t.Fatal(err)
			}
			w.write(p, tc.after)
			evs := w.scan(d, []Container{trainer})
			if len(evs) != 1 || !evs[0].Time.Equal(t0.Add(time.Minute)) {
				t.Fatalf("after truncation got %+v, want the one OOM of the new content", evs)
			}
			wantEvents(t, w.scan(d, []Container{trainer}))
		})
	}
}

func TestMaxReadBytes(t *testing.T) {
	w := newWorld(t)
	p := w.logPath(trainer, 0)
	const limit = 4096
	d := w.detector(Config{MaxReadBytes: limit})
	w.scan(d, []Container{trainer})
	var b strings.Builder
	const ooms = 25
	for i := range ooms {
		at := time.Duration(i) * 10 * time.Second
		b.WriteString(noise(at, 17))
		// Split as partials too, so that some P/F pairs straddle two Scans.
		b.WriteString(cri(at+time.Second, "stderr", "P", torchOOM[:40]))
		b.WriteString(cri(at+time.Second, "stderr", "F", torchOOM[40:]))
	}
	w.write(p, b.String())
	size := int64(b.Len())
	minScans := int((size + limit - 1) / limit)
	var all []Event
	scans := 0
	for ; scans < 10*minScans; scans++ {
		evs := w.scan(d, []Container{trainer})
		if scans == 0 && len(evs) >= ooms {
			t.Fatalf("the first Scan found all %d events: it read more than %d bytes", len(evs), limit)
		}
		all = append(all, evs...)
		if d.containers[trainer].streams[0].cur.off == size {
			scans++
			break
		}
	}
	if scans != minScans {
		t.Errorf("read %d bytes in %d Scans, want %d at %d bytes each", size, scans, minScans, limit)
	}
	if len(all) != ooms {
		t.Fatalf("got %d events, want %d", len(all), ooms)
	}
	for i, ev := range all {
		if want := t0.Add(time.Duration(i)*10*time.Second + time.Second); !ev.Time.Equal(want) || ev.Message != torchOOM {
			t.Errorf("event %d = %+v, want the OOM at %v", i, ev, want)
		}
	}
	wantEvents(t, w.scan(d, []Container{trainer}))
}

func TestIncompleteLine(t *testing.T) {
	line := cri(time.Second, "stderr", "F", torchOOM)
	w, p, d := started(t, Config{})
	w.write(p, line[:60])
	wantEvents(t, w.scan(d, []Container{trainer}))
	w.write(p, line[60:100])
	wantEvents(t, w.scan(d, []Container{trainer}))
	w.write(p, line[100:])
	wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, time.Second, torchOOM))
	wantEvents(t, w.scan(d, []Container{trainer}))

	t.Run("a line longer than the limit is matched on its start", func(t *testing.T) {
		w, p, d := started(t, Config{MaxReadBytes: 1000})
		w.write(p, runtimeOOM+" "+strings.Repeat("x", 3*maxLineBytes)+"\n")
		var all []Event
		kept := 0
		for range 5 * maxLineBytes / 1000 {
			all = append(all, w.scan(d, []Container{trainer})...)
			kept = max(kept, len(d.containers[trainer].streams[0].cur.carry))
		}
		if len(all) != 1 || all[0].Message != runtimeOOM+" "+strings.Repeat("x", maxMessageBytes-len(runtimeOOM)-1) {
			t.Fatalf("got %+v, want one event with the line's first %d bytes", all, maxMessageBytes)
		}
		if kept != maxLineBytes {
			t.Errorf("kept at most %d bytes of one line, want %d", kept, maxLineBytes)
		}
	})
}

func TestStartup(t *testing.T) {
	other := Container{Namespace: "ml", Pod: "notebook", PodUID: "0b1c2d3e-4f5a-6b7c-8d9e-0f1a2b3c4d5e", Container: "jupyter"}
	w := newWorld(t)
	p := w.logPath(trainer, 0)
	po := w.logPath(other, 2)
	w.write(p, cri(-time.Hour, "stderr", "F", torchOOM))
	w.write(po, cri(-time.Hour, "stderr", "F", torchOOM))
	d := w.detector(Config{})
	// The exporter's pod list may still be empty at the first Scan.
	wantEvents(t, w.scan(d, nil))
	wantEvents(t, w.scan(d, []Container{trainer}))
	w.write(po, cri(time.Second, "stderr", "F", runtimeOOM))
	wantEvents(t, w.scan(d, []Container{trainer, other}), logEv(other, 2, time.Second, runtimeOOM))
	// The container restarted: 1.log is new and read from its start.
	p1 := w.logPath(trainer, 1)
	w.write(p1, cri(10*time.Second, "stderr", "F", runtimeOOM))
	wantEvents(t, w.scan(d, []Container{trainer, other}), logEv(trainer, 1, 10*time.Second, runtimeOOM))

	t.Run("a detector started again does not count history", func(t *testing.T) {
		d2 := w.detector(Config{})
		wantEvents(t, w.scan(d2, []Container{trainer, other}))
	})
}

func TestTerminations(t *testing.T) {
	fallback := "Traceback (most recent call last):\n  File \"/app/train.py\", line 88, in <module>\n    loss.backward()\n" + torchOOM + "\n"
	term := func(n int, reason, msg string, finished time.Duration) Termination {
		return Termination{Container: trainer, Instance: n, Reason: reason, Message: msg, ExitCode: 1, FinishedAt: t0.Add(finished)}
	}
	termEv := func(n int, msg string, finished time.Duration) Event {
		return Event{Container: trainer, Instance: n, Source: SourceTermination, Message: msg, Time: t0.Add(finished)}
	}

	t.Run("counted once per instance", func(t *testing.T) {
		w := newWorld(t)
		// No PodLogsDir: terminations only.
		d, err := NewDetector(Config{Now: func() time.Time { return w.now }})
		if err != nil {
			t.Fatal(err)
		}
		tm := term(3, "Error", fallback, time.Minute)
		wantEvents(t, w.scan(d, nil, tm), termEv(3, torchOOM, time.Minute))
		wantEvents(t, w.scan(d, nil, tm))
		wantEvents(t, w.scan(d, nil, tm, term(4, "Error", runtimeOOM, 2*time.Minute)), termEv(4, runtimeOOM, 2*time.Minute))
	})

	t.Run("not counted", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			term Termination
		}{
			{"finished before the detector started", term(0, "Error", fallback, -time.Second)},
			{"host OOM kill", term(0, "OOMKilled", "", time.Minute)},
			{"other error", term(0, "Error", "ValueError: bad batch\n", time.Minute)},
			{"completed", term(0, "Completed", "", time.Minute)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				w := newWorld(t)
				d := w.detector(Config{})
				wantEvents(t, w.scan(d, nil, tc.term))
			})
		}
	})

	t.Run("a Reason that matches", func(t *testing.T) {
		w := newWorld(t)
		d := w.detector(Config{})
		wantEvents(t, w.scan(d, nil, term(0, "CUDA_ERROR_OUT_OF_MEMORY", "", time.Minute)),
			termEv(0, "CUDA_ERROR_OUT_OF_MEMORY", time.Minute))
	})

	t.Run("log first, then termination", func(t *testing.T) {
		w, p, d := started(t, Config{})
		w.write(p, cri(time.Second, "stderr", "F", torchOOM))
		wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, time.Second, torchOOM))
		// The container restarted; its last state carries the same OOM.
		w.write(w.logPath(trainer, 1), noise(time.Minute, 2))
		wantEvents(t, w.scan(d, []Container{trainer}, term(0, "Error", fallback, 2*time.Second)))
	})

	t.Run("termination first, then log", func(t *testing.T) {
		w, p, d := started(t, Config{})
		wantEvents(t, w.scan(d, []Container{trainer}, term(0, "Error", fallback, 2*time.Second)),
			termEv(0, torchOOM, 2*time.Second))
		// The log lines reach the file (or the detector) late.
		w.write(p, cri(time.Second, "stderr", "F", torchOOM)+cri(time.Minute, "stderr", "F", runtimeOOM))
		wantEvents(t, w.scan(d, []Container{trainer}))
		// Another instance is another event.
		w.write(w.logPath(trainer, 1), cri(2*time.Minute, "stderr", "F", runtimeOOM))
		wantEvents(t, w.scan(d, []Container{trainer}, term(0, "Error", fallback, 2*time.Second)),
			logEv(trainer, 1, 2*time.Minute, runtimeOOM))
	})

	t.Run("same Scan: the log is read first", func(t *testing.T) {
		w, p, d := started(t, Config{})
		w.write(p, cri(time.Second, "stderr", "F", torchOOM))
		wantEvents(t, w.scan(d, []Container{trainer}, term(0, "Error", fallback, 2*time.Second)),
			logEv(trainer, 0, time.Second, torchOOM))
	})
}

func TestErrors(t *testing.T) {
	t.Run("pod log directory missing", func(t *testing.T) {
		w := newWorld(t)
		missing := filepath.Join(w.root, "nope")
		d, err := NewDetector(Config{PodLogsDir: missing, Now: func() time.Time { return w.now }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		tm := Termination{Container: trainer, Reason: "Error", Message: runtimeOOM, FinishedAt: t0.Add(time.Second)}
		evs, err := d.Scan([]Container{trainer}, []Termination{tm})
		if !errors.Is(err, ErrPodLogsDir) || !strings.Contains(err.Error(), missing) {
			t.Errorf("Scan error = %v, want ErrPodLogsDir naming %s", err, missing)
		}
		// Terminations do not depend on the log directory.
		wantEvents(t, evs, Event{Container: trainer, Source: SourceTermination, Message: runtimeOOM, Time: t0.Add(time.Second)})
	})

	t.Run("pod log directory back after an outage", func(t *testing.T) {
		w, p, d := started(t, Config{ForgetAfter: time.Minute})
		w.write(p, cri(time.Second, "stderr", "F", torchOOM))
		wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, time.Second, torchOOM))
		away := w.root + ".away"
		if err := os.Rename(w.root, away); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			w.now = w.now.Add(time.Minute)
			if _, err := d.Scan([]Container{trainer}, nil); !errors.Is(err, ErrPodLogsDir) {
				t.Fatalf("Scan error = %v, want ErrPodLogsDir", err)
			}
		}
		if err := os.Rename(away, w.root); err != nil {
			t.Fatal(err)
		}
		w.write(p, cri(3*time.Minute, "stderr", "F", runtimeOOM))
		wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, 3*time.Minute, runtimeOOM))
	})

	t.Run("pod log directory is a file", func(t *testing.T) {
		w := newWorld(t)
		file := filepath.Join(w.root, "file")
		w.write(file, "x")
		d, err := NewDetector(Config{PodLogsDir: file})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		if _, err := d.Scan(nil, nil); !errors.Is(err, ErrPodLogsDir) || !strings.Contains(err.Error(), file) {
			t.Errorf("Scan error = %v, want ErrPodLogsDir naming %s", err, file)
		}
	})

	t.Run("unreadable file is skipped", func(t *testing.T) {
		w := newWorld(t)
		broken := Container{Namespace: "ml", Pod: "broken", PodUID: "u-1", Container: "c"}
		// A directory where a log file belongs cannot be read, even by root.
		if err := os.MkdirAll(w.logPath(broken, 0), 0o755); err != nil {
			t.Fatal(err)
		}
		p := w.logPath(trainer, 0)
		var logged strings.Builder
		d := w.detector(Config{Logger: newTextLogger(&logged)})
		w.scan(d, []Container{broken, trainer})
		w.write(p, cri(time.Second, "stderr", "F", torchOOM))
		wantEvents(t, w.scan(d, []Container{broken, trainer}), logEv(trainer, 0, time.Second, torchOOM))
		w.scan(d, []Container{broken, trainer})
		if n := strings.Count(logged.String(), "reading log file"); n != 1 {
			t.Errorf("the unreadable file was logged %d times, want once:\n%s", n, logged.String())
		}
	})

	t.Run("bad config", func(t *testing.T) {
		for _, cfg := range []Config{{MaxReadBytes: -1}, {CollapseWindow: -time.Second}, {ForgetAfter: -time.Second}} {
			if _, err := NewDetector(cfg); err == nil {
				t.Errorf("NewDetector(%+v) accepted it", cfg)
			}
		}
	})
}

func TestStateIsBounded(t *testing.T) {
	w := newWorld(t)
	d := w.detector(Config{ForgetAfter: time.Minute})
	gone := Container{Namespace: "ml", Pod: "done", PodUID: "u-2", Container: "c"}
	pg := w.logPath(gone, 0)
	w.scan(d, []Container{trainer, gone})
	w.write(pg, cri(time.Second, "stderr", "F", torchOOM))
	wantEvents(t, w.scan(d, []Container{trainer, gone}), logEv(gone, 0, time.Second, torchOOM))

	// The pod's log directory is removed: its files are forgotten at once,
	// its de-duplication state only once it is no longer named.
	if err := os.RemoveAll(filepath.Dir(filepath.Dir(pg))); err != nil {
		t.Fatal(err)
	}
	w.scan(d, []Container{trainer, gone})
	if cs := d.containers[gone]; cs == nil || len(cs.streams) != 0 || !cs.instances[0].logCounted {
		t.Fatalf("after the directory went: state %+v, want no files and instance 0 remembered", cs)
	}
	w.now = w.now.Add(time.Minute)
	w.scan(d, []Container{trainer})
	if d.containers[gone] == nil {
		t.Fatal("forgotten before ForgetAfter passed")
	}
	w.now = w.now.Add(time.Second)
	w.scan(d, []Container{trainer})
	if d.containers[gone] != nil || d.containers[trainer] == nil {
		t.Fatalf("containers after ForgetAfter: %v, want only %v", d.containers, trainer)
	}

	// A container restarting again and again keeps a few instances only.
	for n := range 50 {
		w.scan(d, []Container{trainer}, Termination{Container: trainer, Instance: n, Reason: "Error", FinishedAt: w.now})
	}
	if n := len(d.containers[trainer].instances); n > keptInstances+1 {
		t.Errorf("kept %d instances, want at most %d", n, keptInstances+1)
	}

	// Files that left N.log, remembered in case they come back: a few.
	for n := range 10 {
		p := w.logPath(trainer, n)
		w.write(p, noise(time.Second, 1))
		w.scan(d, []Container{trainer})
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		w.scan(d, []Container{trainer})
	}
	if n := len(d.containers[trainer].left); n == 0 || n > keptInstances {
		t.Errorf("remembered %d files that left N.log, want 1 to %d", n, keptInstances)
	}
}

func newTextLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, nil))
}

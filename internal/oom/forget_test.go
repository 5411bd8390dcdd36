package oom

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// idle is how long the tests' containers go unnamed: an idle GPU pod drops
// out of the exporter's list for longer than ForgetAfter.
const idle = DefaultForgetAfter + 15*time.Minute

// forget lets idle pass with only still named, and checks that the others
// were really forgotten.
func (w *world) forget(d *Detector, gone []Container, still ...Container) {
	w.t.Helper()
	w.now = w.now.Add(idle)
	if _, err := d.Scan(still, nil); err != nil {
		w.t.Logf("Scan forgetting %v: %v", gone, err)
	}
	for _, c := range gone {
		if d.containers[c] != nil {
			w.t.Fatalf("%v still remembered after %v unnamed", c, idle)
		}
	}
}

func TestForgottenContainerNamedAgain(t *testing.T) {
	named := []Container{trainer}
	// Two events, so that reading the file again from the start would count
	// the first again: it is outside the collapse window of the last.
	history := noise(0, 3) + cri(time.Second, "stderr", "F", torchOOM) + noise(2*time.Second, 3) + cri(10*time.Second, "stderr", "F", runtimeOOM)
	counted := []Event{logEv(trainer, 0, time.Second, torchOOM), logEv(trainer, 0, 10*time.Second, runtimeOOM)}
	line := cri(time.Minute, "stderr", "F", torchOOM)
	for _, tc := range []struct {
		name string
		// before runs while trainer is named, after the first OOM counted;
		// during, while it is forgotten.
		before, during func(w *world, p string)
		want           []Event
	}{
		{
			name: "nothing new",
		},
		{
			name: "OOM appended while forgotten",
			during: func(w *world, p string) {
				w.write(p, noise(20*time.Minute, 5)+cri(21*time.Minute, "stderr", "F", runtimeOOM))
			},
			want: []Event{logEv(trainer, 0, 21*time.Minute, runtimeOOM)},
		},
		{
			name: "the collapse window holds across the gap",
			// Read after the gap: the same traceback as the counted event.
			during: func(w *world, p string) { w.write(p, cri(12*time.Second, "stderr", "F", torchOOM)) },
		},
		{
			name:   "line half written when forgotten",
			before: func(w *world, p string) { w.write(p, line[:60]) },
			during: func(w *world, p string) { w.write(p, line[60:]) },
			want:   []Event{logEv(trainer, 0, time.Minute, torchOOM)},
		},
		{
			name:   "CRI partial line waiting for its end when forgotten",
			before: func(w *world, p string) { w.write(p, cri(time.Minute, "stderr", "P", torchOOM[:40])) },
			during: func(w *world, p string) { w.write(p, cri(time.Minute, "stderr", "F", torchOOM[40:])) },
			want:   []Event{logEv(trainer, 0, time.Minute, torchOOM)},
		},
		{
			name: "truncated while forgotten: read from the start",
			during: func(w *world, p string) {
				if err := os.Truncate(p, 0); err != nil {
					w.t.Fatal(err)
				}
				w.write(p, cri(22*time.Minute, "stderr", "F", runtimeOOM))
			},
			want: []Event{logEv(trainer, 0, 22*time.Minute, runtimeOOM)},
		},
		{
			name: "rotated while forgotten: the rest of the old file, then the new one",
			during: func(w *world, p string) {
				w.write(p, cri(20*time.Minute, "stderr", "F", runtimeOOM))
				if err := os.Rename(p, p+".20261123-092000"); err != nil {
					w.t.Fatal(err)
				}
				w.write(p, noise(21*time.Minute, 3)+cri(22*time.Minute, "stderr", "F", torchOOM))
			},
			want: []Event{logEv(trainer, 0, 20*time.Minute, runtimeOOM), logEv(trainer, 0, 22*time.Minute, torchOOM)},
		},
		{
			name: "log directory unreadable when forgotten",
			before: func(w *world, p string) {
				if err := os.Rename(w.root, w.root+".away"); err != nil {
					w.t.Fatal(err)
				}
			},
			during: func(w *world, p string) {
				if err := os.Rename(w.root+".away", w.root); err != nil {
					w.t.Fatal(err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, p, d := started(t, Config{})
			w.write(p, history)
			wantEvents(t, w.scan(d, named), counted...)
			if tc.before != nil {
				tc.before(w, p)
				if _, err := d.Scan(named, nil); err != nil {
					t.Logf("Scan before forgetting: %v", err)
				}
			}
			w.forget(d, named)
			if tc.during != nil {
				tc.during(w, p)
			}
			wantEvents(t, w.scan(d, named), tc.want...)
			wantEvents(t, w.scan(d, named))
		})
	}
}

func TestForgottenTerminations(t *testing.T) {
	fallback := "Traceback (most recent call last):\n" + torchOOM + "\n"
	term := Termination{Container: trainer, Instance: 0, Reason: "Error", Message: fallback, ExitCode: 1, FinishedAt: t0.Add(2 * time.Second)}
	termEv := Event{Container: trainer, Source: SourceTermination, Message: torchOOM, Time: term.FinishedAt}

	t.Run("counted termination reported again", func(t *testing.T) {
		for _, logs := range []bool{true, false} {
			t.Run(fmt.Sprintf("PodLogsDir set %v", logs), func(t *testing.T) {
				w := newWorld(t)
				cfg := Config{Now: func() time.Time { return w.now }}
				if logs {
					cfg.PodLogsDir = w.root
				}
				d, err := NewDetector(cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { d.Close() })
				wantEvents(t, w.scan(d, nil, term), termEv)
				w.forget(d, []Container{trainer})
				wantEvents(t, w.scan(d, []Container{trainer}, term))
				// The instance's log lines come late: still the same event.
				if logs {
					w.write(w.logPath(trainer, 0), cri(time.Second, "stderr", "F", torchOOM))
					wantEvents(t, w.scan(d, []Container{trainer}, term))
				}
			})
		}
	})

	t.Run("counted from the log, then its termination", func(t *testing.T) {
		w, p, d := started(t, Config{})
		w.write(p, cri(time.Second, "stderr", "F", torchOOM))
		wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, time.Second, torchOOM))
		w.forget(d, []Container{trainer})
		wantEvents(t, w.scan(d, []Container{trainer}, term))
		// Another instance is another event.
		next := term
		next.Instance, next.FinishedAt = 1, w.now
		wantEvents(t, w.scan(d, []Container{trainer}, term, next),
			Event{Container: trainer, Instance: 1, Source: SourceTermination, Message: torchOOM, Time: w.now})
	})
}

// A grave keeps only the start of a line that was being written.
func TestForgottenLongLine(t *testing.T) {
	w, p, d := started(t, Config{})
	line := strings.TrimSuffix(cri(time.Second, "stderr", "F", runtimeOOM+" "+strings.Repeat("x", 4000)), "\n")
	w.write(p, line)
	wantEvents(t, w.scan(d, []Container{trainer}))
	w.forget(d, []Container{trainer})
	g := d.graves.byContainer[trainer].Value.(*grave)
	if n := len(g.streams[0].cur.carry); n != maxForgottenLineBytes {
		t.Errorf("grave keeps %d bytes of the line, want %d", n, maxForgottenLineBytes)
	}
	w.write(p, strings.Repeat("y", 100)+"\n")
	prefix := t0.Add(time.Second).Format(time.RFC3339Nano) + " stderr F "
	wantEvents(t, w.scan(d, []Container{trainer}),
		logEv(trainer, 0, time.Second, strings.TrimPrefix(line[:maxForgottenLineBytes], prefix)))
}

// A pod deleted before its containers are forgotten leaves no files behind.
func TestForgottenPodDeleted(t *testing.T) {
	w, p, d := started(t, Config{})
	w.write(p, cri(time.Second, "stderr", "F", torchOOM))
	wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, time.Second, torchOOM))
	if err := os.RemoveAll(filepath.Dir(filepath.Dir(p))); err != nil {
		t.Fatal(err)
	}
	w.forget(d, []Container{trainer})
	if d.graves.files != 0 || d.graves.instances != 1 {
		t.Errorf("graves hold %d files and %d instances, want 0 and the one counted", d.graves.files, d.graves.instances)
	}
}

// A container directory that cannot be listed for a while keeps its files:
// they are not read again from the start.
func TestContainerDirUnlistable(t *testing.T) {
	w, p, d := started(t, Config{})
	w.write(p, cri(time.Second, "stderr", "F", torchOOM)+cri(time.Minute, "stderr", "F", runtimeOOM))
	wantEvents(t, w.scan(d, []Container{trainer}),
		logEv(trainer, 0, time.Second, torchOOM), logEv(trainer, 0, time.Minute, runtimeOOM))
	dir := filepath.Dir(p)
	if err := os.Rename(dir, dir+".away"); err != nil {
		t.Fatal(err)
	}
	w.write(dir, "not a directory")
	wantEvents(t, w.scan(d, []Container{trainer}))
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir+".away", dir); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, w.scan(d, []Container{trainer}))
}

// Past a bound, the container forgotten longest ago loses its grave: named
// again, it counts its old events again, as a container never seen would.
func TestGravesAreBounded(t *testing.T) {
	ctrs := make([]Container, 4)
	for i := range ctrs {
		ctrs[i] = Container{Namespace: "ml", Pod: fmt.Sprintf("job-%d", i), PodUID: fmt.Sprintf("uid-%d", i), Container: "main"}
	}
	// forgetInTurn forgets ctrs[0], ctrs[1], ctrs[2] in that order, each in
	// its own Scan, while ctrs[3] stays named.
	forgetInTurn := func(w *world, d *Detector, terms []Termination) {
		from := func(i int) []Termination {
			if terms == nil {
				return nil
			}
			return terms[i:]
		}
		// All were named at start; ctrs[i] is named last at start + i min.
		start := w.now
		for i := range 3 {
			w.now = start.Add(time.Duration(i+1) * time.Minute)
			w.scan(d, ctrs[i+1:], from(i+1)...)
		}
		for i := range 3 {
			w.now = start.Add(DefaultForgetAfter + time.Duration(i)*time.Minute + 30*time.Second)
			w.scan(d, ctrs[3:], from(3)...)
			if d.containers[ctrs[i]] != nil || d.containers[ctrs[i+1]] == nil {
				w.t.Fatalf("at %v: want %v forgotten, %v not yet", w.now.Sub(start), ctrs[i], ctrs[i+1])
			}
		}
	}

	t.Run("files", func(t *testing.T) {
		w := newWorld(t)
		d := w.detector(Config{})
		d.graves.maxFiles = 2
		w.scan(d, nil)
		var want []Event
		for i, c := range ctrs {
			w.write(w.logPath(c, 0), cri(time.Duration(i)*time.Second, "stderr", "F", torchOOM))
			want = append(want, logEv(c, 0, time.Duration(i)*time.Second, torchOOM))
		}
		wantEvents(t, w.scan(d, ctrs), want...)
		forgetInTurn(w, d, nil)
		if d.graves.files != 2 || d.graves.byContainer[ctrs[0]] != nil {
			t.Fatalf("graves hold %d files (want 2), of %v", d.graves.files, d.graves.byContainer)
		}
		wantEvents(t, w.scan(d, ctrs), want[0])
	})

	t.Run("instances", func(t *testing.T) {
		w := newWorld(t)
		d := w.detector(Config{})
		d.graves.maxInstances = 2
		terms := make([]Termination, len(ctrs))
		var want []Event
		for i, c := range ctrs {
			terms[i] = Termination{Container: c, Reason: "Error", Message: runtimeOOM, FinishedAt: t0.Add(time.Duration(i) * time.Second)}
			want = append(want, Event{Container: c, Source: SourceTermination, Message: runtimeOOM, Time: terms[i].FinishedAt})
		}
		wantEvents(t, w.scan(d, ctrs, terms...), want...)
		forgetInTurn(w, d, terms)
		if d.graves.instances != 2 || d.graves.byContainer[ctrs[0]] != nil {
			t.Fatalf("graves hold %d instances (want 2), of %v", d.graves.instances, d.graves.byContainer)
		}
		wantEvents(t, w.scan(d, ctrs, terms...), want[0])
	})

	// Terminations only, to not create thousands of files; the file bound is
	// the same code with another count.
	t.Run("default bounds", func(t *testing.T) {
		w := newWorld(t)
		d, err := NewDetector(Config{Now: func() time.Time { return w.now }})
		if err != nil {
			t.Fatal(err)
		}
		n := maxForgottenInstances + 1
		ctrs := make([]Container, n)
		terms := make([]Termination, n)
		for i := range ctrs {
			ctrs[i] = Container{Namespace: "ml", Pod: fmt.Sprintf("job-%d", i), PodUID: fmt.Sprintf("uid-%d", i), Container: "main"}
			terms[i] = Termination{Container: ctrs[i], Reason: "Error", Message: runtimeOOM, FinishedAt: t0}
		}
		if evs := w.scan(d, nil, terms...); len(evs) != n {
			t.Fatalf("%d events, want one per container, %d", len(evs), n)
		}
		w.forget(d, ctrs)
		if d.graves.instances != maxForgottenInstances {
			t.Errorf("graves hold %d instances, want %d", d.graves.instances, maxForgottenInstances)
		}
		// Forgotten all in one Scan, in no set order: the one evicted counts
		// again, whichever it is.
		if evs := w.scan(d, nil, terms...); len(evs) != 1 {
			t.Errorf("named again: %d events, want the one of the grave evicted", len(evs))
		}
	})
}

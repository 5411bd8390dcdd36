//go:build linux

package oom

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWatchedDirectories: a watched container whose directory did not
// change is not read; every kind of change is, and so is every container
// at a full pass.
func TestWatchedDirectories(t *testing.T) {
	w := newWorld(t)
	p := w.logPath(trainer, 0)
	w.write(p, noise(0, 3))
	d := w.detector(Config{})
	named := []Container{trainer}
	wantEvents(t, w.scan(d, named)) // baseline, and the first reading
	cs := d.containers[trainer]
	if cs.wd == 0 {
		t.Fatal("directory not watched")
	}
	reads := cs.reads
	// want checks that one Scan reads the directory (or not) and finds
	// the events.
	want := func(step string, read bool, events ...Event) {
		t.Helper()
		wantEvents(t, w.scan(d, named), events...)
		if got := cs.reads > reads; got != read {
			t.Fatalf("%s: read %v, want %v", step, got, read)
		}
		reads = cs.reads
		// Nothing new after: read once more at most, then left alone.
		w.scan(d, named)
		reads = cs.reads
		w.scan(d, named)
		if cs.reads != reads {
			t.Fatalf("%s: read again with nothing new", step)
		}
	}
	want("nothing new", false)

	w.write(p, cri(time.Second, "stderr", "F", torchOOM))
	want("appended", true, logEv(trainer, 0, time.Second, torchOOM))

	if err := os.Rename(p, p+".20261123-090000"); err != nil {
		t.Fatal(err)
	}
	w.write(p, cri(time.Minute, "stderr", "F", runtimeOOM))
	want("rotated", true, logEv(trainer, 0, time.Minute, runtimeOOM))

	w.write(w.logPath(trainer, 1), cri(2*time.Minute, "stderr", "F", torchOOM))
	want("restarted", true, logEv(trainer, 1, 2*time.Minute, torchOOM))

	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	want("permissions changed", true)

	w.now = w.now.Add(fullPassInterval)
	want("full pass", true)

	if err := os.RemoveAll(filepath.Dir(p)); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, w.scan(d, named))
	for range 2 {
		reads = cs.reads
		w.scan(d, named)
		if cs.reads == reads {
			t.Fatal("a removed directory is not read at every Scan")
		}
	}
}

// TestWithoutInotify: where inotify is not to be had, every container is
// read at every Scan and events are found as with it.
func TestWithoutInotify(t *testing.T) {
	w := newWorld(t)
	p := w.logPath(trainer, 0)
	w.write(p, noise(0, 3))
	d := w.detector(Config{})
	d.noWatcher = true
	named := []Container{trainer}
	w.scan(d, named)
	cs := d.containers[trainer]
	for i := range 3 {
		reads := cs.reads
		wantEvents(t, w.scan(d, named))
		if cs.reads == reads || cs.wd != 0 {
			t.Fatalf("Scan %d: read %v, watch %d", i, cs.reads > reads, cs.wd)
		}
	}
	w.write(p, cri(time.Second, "stderr", "F", torchOOM))
	wantEvents(t, w.scan(d, named), logEv(trainer, 0, time.Second, torchOOM))
}

// TestDetectorClose: Close releases the inotify instance and a later Scan
// starts another, reading everything once.
func TestDetectorClose(t *testing.T) {
	w := newWorld(t)
	p := w.logPath(trainer, 0)
	d := w.detector(Config{})
	named := []Container{trainer}
	w.scan(d, named)
	if d.watcher == nil {
		t.Fatal("no watcher")
	}
	if err := d.Close(); err != nil || d.watcher != nil || d.containers[trainer].wd != 0 {
		t.Fatalf("Close: %v, watcher %v", err, d.watcher)
	}
	w.write(p, cri(time.Second, "stderr", "F", torchOOM))
	wantEvents(t, w.scan(d, named), logEv(trainer, 0, time.Second, torchOOM))
	if d.watcher == nil || d.containers[trainer].wd == 0 {
		t.Fatal("not watched again after Close")
	}
}

package oom

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestListing: a container log directory is listed again whenever it
// changed, and while it last changed too recently for its modification
// time to show a change made in the same clock step.
func TestListing(t *testing.T) {
	dir := t.TempDir()
	touch := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// setMtime stands in for a change made in the same clock step as the
	// one before: the directory's time does not move.
	setMtime := func(m time.Time) {
		t.Helper()
		if err := os.Chtimes(dir, m, m); err != nil {
			t.Fatal(err)
		}
	}
	var l listing
	list := func() []string {
		t.Helper()
		names, err := l.names(dir)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		return names
	}
	want := func(got []string, want ...string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("names %q, want %q", got, want)
		}
	}

	touch("0.log")
	recent := time.Now()
	setMtime(recent)
	want(list(), "0.log")
	touch("1.log")
	setMtime(recent)
	want(list(), "0.log", "1.log") // too recent to trust: listed again

	old := time.Now().Add(-time.Hour)
	setMtime(old)
	want(list(), "0.log", "1.log")
	touch("2.log")
	setMtime(old)
	want(list(), "0.log", "1.log") // unchanged as far as stat shows: not listed
	touch("3.log")                 // a real change moves the time
	want(list(), "0.log", "1.log", "2.log", "3.log")

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := l.names(dir); !os.IsNotExist(err) {
		t.Fatalf("removed directory: %v", err)
	}
	if l.list != nil {
		t.Fatalf("listing of a removed directory kept: %q", l.list)
	}
}

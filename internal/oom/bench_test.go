package oom

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkScanIdle is the exporter's common case: one Scan per scrape over
// a full node (110 pods, the kubelet's default limit) where nothing new was
// logged.
func BenchmarkScanIdle(b *testing.B) {
	w := &world{t: b, root: b.TempDir(), now: t0}
	containers := make([]Container, 110)
	for i := range containers {
		c := Container{Namespace: "ml", Pod: fmt.Sprintf("job-%d", i), PodUID: fmt.Sprintf("uid-%d", i), Container: "main"}
		containers[i] = c
		w.write(w.logPath(c, 0), noise(-time.Hour, 100))
		w.write(w.logPath(c, 1), noise(-time.Minute, 100))
	}
	d, err := NewDetector(Config{PodLogsDir: w.root, Now: func() time.Time { return w.now }})
	if err != nil {
		b.Fatal(err)
	}
	terms := []Termination{{Container: containers[0], Instance: 0, Reason: "Error", Message: "exit 1", FinishedAt: t0}}
	if _, err := d.Scan(containers, terms); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		evs, err := d.Scan(containers, terms)
		if err != nil || len(evs) != 0 {
			b.Fatalf("Scan = %v, %v; want nothing new", evs, err)
		}
	}
}

// BenchmarkReadNoise measures reading new log data that matches nothing,
// MaxReadBytes (1 MiB) of it per Scan.
func BenchmarkReadNoise(b *testing.B) {
	for _, tc := range []struct {
		name     string
		patterns []string
	}{
		{"default patterns", nil},
		// A case-insensitive pattern has no literal, so every line runs the
		// regexp: what the prefilter saves.
		{"without prefilter", append([]string{`(?i)xyzzy`}, DefaultPatterns...)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			d, err := NewDetector(Config{Patterns: tc.patterns})
			if err != nil {
				b.Fatal(err)
			}
			data := []byte(noise(0, 1<<20/80))
			st := &stream{}
			sc := &scan{cs: &containerState{instances: map[int]*instanceState{}}}
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				d.feed(sc, st, &tailFile{}, data)
			}
			if len(sc.events) != 0 {
				b.Fatalf("noise matched: %+v", sc.events[0])
			}
		})
	}
}

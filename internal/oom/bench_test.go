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
	b.Cleanup(func() { d.Close() })
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

// BenchmarkMatchRealLog measures matching alone, per MiB of a log made of the
// real corpus's negatives (the lines that look most like an OOM) between
// training-step noise, with one real positive in every 1,000 lines.
func BenchmarkMatchRealLog(b *testing.B) {
	m, err := newMatcher(DefaultPatterns)
	if err != nil {
		b.Fatal(err)
	}
	var lines [][]byte
	size := 0
	for i := 0; size < 1<<20; i++ {
		var l string
		switch {
		case i%1000 == 999:
			l = realPositives[(i/1000)%len(realPositives)].line
		case i%10 == 9:
			l = realNegatives[(i/10)%len(realNegatives)].line
		default:
			l = fmt.Sprintf("step %d loss 0.%04d lr 3e-4 gpu_mem 11.2G", i, i%10000)
		}
		lines = append(lines, []byte(l))
		size += len(l) + 1
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		for _, l := range lines {
			m.match(l)
		}
	}
}

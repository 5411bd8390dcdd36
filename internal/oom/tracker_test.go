package oom

import (
	"maps"
	"testing"
	"time"
)

const gpuA = "GPU-a"

// counts returns the tracker's counters of trainer by source, the GPU
// blamed included.
func counts(tr *Tracker) map[string]float64 {
	out := map[string]float64{}
	tr.Counts(func(k CountKey, n float64) {
		out[k.Pod+"/"+k.UUID+"/"+string(k.Source)] = n
	})
	return out
}

func (w *world) trackerScan(tr *Tracker) {
	w.t.Helper()
	if err := tr.Scan(w.now, nil); err != nil {
		w.t.Fatal(err)
	}
}

func wantCounts(t *testing.T, step string, tr *Tracker, want map[string]float64) {
	t.Helper()
	if got := counts(tr); !maps.Equal(got, want) {
		t.Fatalf("%s: counters %v, want %v", step, got, want)
	}
}

// TestTrackerForgetPolicy walks a container through the one forget
// period: counters at 0 from the start, growing only, on view for the
// period after it was last live or last grew, while its logs are read for
// the period after it was last live; then forgotten, read state included,
// and never counting an old event again when it comes back.
func TestTrackerForgetPolicy(t *testing.T) {
	const period = time.Hour
	w := newWorld(t)
	tr := NewTracker(w.detector(Config{ForgetAfter: period}))
	p := w.logPath(trainer, 0)
	w.write(p, noise(0, 3))
	w.trackerScan(tr) // baseline

	tr.Watch(trainer, gpuA, w.now)
	w.trackerScan(tr)
	zero := map[string]float64{"trainer-0/GPU-a/log": 0, "trainer-0/GPU-a/termination": 0}
	wantCounts(t, "first watched", tr, zero)

	w.now = w.now.Add(time.Minute)
	w.write(p, cri(time.Minute, "stderr", "F", torchOOM))
	tr.Watch(trainer, gpuA, w.now)
	w.trackerScan(tr)
	one := map[string]float64{"trainer-0/GPU-a/log": 1, "trainer-0/GPU-a/termination": 0}
	wantCounts(t, "OOM while live", tr, one)
	lastLive := w.now

	// No longer live: still read until the period has passed since.
	w.now = lastLive.Add(period - time.Minute)
	w.write(p, cri(period, "stderr", "F", runtimeOOM))
	w.trackerScan(tr)
	two := map[string]float64{"trainer-0/GPU-a/log": 2, "trainer-0/GPU-a/termination": 0}
	wantCounts(t, "late OOM", tr, two)
	lateEvent := w.now

	// Past the period since last live: no longer read, its state gone;
	// the counter unchanged since last live is dropped, the one that grew
	// late stays for the period after it grew.
	w.now = lastLive.Add(period + time.Minute)
	w.write(p, cri(period+2*time.Minute, "stderr", "F", runtimeOOM))
	w.trackerScan(tr)
	if tr.d.containers[trainer] != nil {
		t.Fatal("read state kept after the forget period")
	}
	wantCounts(t, "forgotten", tr, map[string]float64{"trainer-0/GPU-a/log": 2})
	w.now = lateEvent.Add(period + time.Minute)
	w.trackerScan(tr)
	wantCounts(t, "late counter's period over", tr, map[string]float64{})

	// Back: new counters from 0 (the old series are gone), and the OOM
	// logged while it was forgotten counts, the old ones not again.
	tr.Watch(trainer, gpuA, w.now)
	w.trackerScan(tr)
	wantCounts(t, "watched again", tr, one)
}

// TestTrackerCountersNeverGoBack: a pod recreated under the same name (a
// StatefulSet's) keeps its counters, which go on from where they were,
// while its new log directory is read from the start.
func TestTrackerCountersNeverGoBack(t *testing.T) {
	w := newWorld(t)
	tr := NewTracker(w.detector(Config{}))
	w.trackerScan(tr)
	tr.Watch(trainer, gpuA, w.now)
	w.write(w.logPath(trainer, 0), cri(0, "stderr", "F", torchOOM))
	w.trackerScan(tr)
	wantCounts(t, "first pod", tr, map[string]float64{"trainer-0/GPU-a/log": 1, "trainer-0/GPU-a/termination": 0})

	again := trainer
	again.PodUID = "0e6a3c1e-7d3b-4c55-9a8e-2b7f7c1d9e01"
	w.now = w.now.Add(time.Minute)
	tr.Watch(again, gpuA, w.now)
	w.trackerScan(tr)
	if tr.d.containers[trainer] != nil {
		t.Error("the old pod's read state is kept beside the new one's")
	}
	w.write(w.logPath(again, 0), cri(time.Minute, "stderr", "F", torchOOM))
	w.trackerScan(tr)
	wantCounts(t, "recreated pod", tr, map[string]float64{"trainer-0/GPU-a/log": 2, "trainer-0/GPU-a/termination": 0})
}

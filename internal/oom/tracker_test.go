package oom

import (
	"maps"
	"testing"
	"time"
)

const gpuA = "GPU-a"

// counts returns the tracker's counters by pod, GPU blamed, source and
// kind.
func counts(tr *Tracker) map[string]float64 {
	out := map[string]float64{}
	tr.Counts(func(k CountKey, n float64) {
		out[k.Pod+"/"+k.UUID+"/"+string(k.Source)+"/"+k.Kind.Label()] = n
	})
	return out
}

// counters are the counters of a container watched on GPU-a, off MPS:
// one per source, of kind device, at log and term.
func counters(pod string, log, term float64) map[string]float64 {
	return map[string]float64{pod + "/GPU-a/log/device": log, pod + "/GPU-a/termination/device": term}
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
	zero := counters("trainer-0", 0, 0)
	wantCounts(t, "first watched", tr, zero)

	w.now = w.now.Add(time.Minute)
	w.write(p, cri(time.Minute, "stderr", "F", torchOOM))
	tr.Watch(trainer, gpuA, w.now)
	w.trackerScan(tr)
	one := counters("trainer-0", 1, 0)
	wantCounts(t, "OOM while live", tr, one)
	lastLive := w.now

	// No longer live: still read until the period has passed since.
	w.now = lastLive.Add(period - time.Minute)
	w.write(p, cri(period, "stderr", "F", runtimeOOM))
	w.trackerScan(tr)
	two := counters("trainer-0", 2, 0)
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
	wantCounts(t, "forgotten", tr, map[string]float64{"trainer-0/GPU-a/log/device": 2})
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
	wantCounts(t, "first pod", tr, counters("trainer-0", 1, 0))

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
	wantCounts(t, "recreated pod", tr, counters("trainer-0", 2, 0))
}

// TestTrackerCappedContainer: a container seen an MPS client with a
// pinned limit on its GPU has its device OOMs counted as process-cap, also
// when read after it was last seen so, until the period has passed; other
// kinds keep theirs. A client seen without a limit, and a container seen a
// client of another GPU than the one blamed, keep device. The counters at
// 0 are of the kind a plain OOM would count under.
func TestTrackerCappedContainer(t *testing.T) {
	const period = time.Hour
	const nvencOOM = "[h264_nvenc @ 0x46d8300] OpenEncodeSessionEx failed: out of memory (10): (no details)"
	w := newWorld(t)
	tr := NewTracker(w.detector(Config{ForgetAfter: period}))
	neighbour := Container{Namespace: "ml", Pod: "sliced-0", PodUID: "9d3e2b1a-0c4f-4e5d-8a7b-6c5d4e3f2a1b", Container: "app"}
	elsewhere := Container{Namespace: "ml", Pod: "other-0", PodUID: "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d", Container: "app"}
	p, pn, pe := w.logPath(trainer, 0), w.logPath(neighbour, 0), w.logPath(elsewhere, 0)
	w.trackerScan(tr) // baseline

	tr.Cap(trainer, gpuA, true, w.now)
	tr.Cap(neighbour, gpuA, false, w.now)
	tr.Cap(elsewhere, "GPU-b", true, w.now)
	for _, c := range []Container{trainer, neighbour, elsewhere} {
		tr.Watch(c, gpuA, w.now)
	}
	wantCounts(t, "watched", tr, map[string]float64{
		"trainer-0/GPU-a/log/process-cap": 0, "trainer-0/GPU-a/termination/process-cap": 0,
		"sliced-0/GPU-a/log/device": 0, "sliced-0/GPU-a/termination/device": 0,
		"other-0/GPU-a/log/device": 0, "other-0/GPU-a/termination/device": 0,
	})
	w.write(p, cri(0, "stderr", "F", torchOOM))
	w.write(pn, cri(0, "stderr", "F", torchOOM))
	w.write(pe, cri(0, "stderr", "F", torchOOM))
	w.trackerScan(tr)
	wantCounts(t, "capped while live", tr, map[string]float64{
		"trainer-0/GPU-a/log/process-cap": 1, "trainer-0/GPU-a/termination/process-cap": 0,
		"sliced-0/GPU-a/log/device": 1, "sliced-0/GPU-a/termination/device": 0,
		"other-0/GPU-a/log/device": 1, "other-0/GPU-a/termination/device": 0,
	})

	// Its processes gone (no Cap since), an OOM read later is still its
	// own cap's; an NVENC one stays an encoder session, its counter new.
	w.now = w.now.Add(period - time.Minute)
	w.write(p, cri(time.Minute, "stderr", "F", runtimeOOM)+cri(2*time.Minute, "stderr", "F", nvencOOM))
	w.trackerScan(tr)
	got := counts(tr)
	if got["trainer-0/GPU-a/log/process-cap"] != 2 || got["trainer-0/GPU-a/log/encoder-session"] != 1 {
		t.Errorf("after its processes ended: %v", got)
	}

	// Not seen a client for longer than the period, though still watched
	// on a GPU without MPS: its device OOMs are the GPU's again.
	w.now = w.now.Add(2 * time.Minute)
	tr.Watch(trainer, gpuA, w.now)
	w.write(p, cri(3*time.Minute, "stderr", "F", torchOOM))
	w.trackerScan(tr)
	if got := counts(tr); got["trainer-0/GPU-a/log/device"] != 1 || got["trainer-0/GPU-a/log/process-cap"] != 2 {
		t.Errorf("cap forgotten: %v", got)
	}

	// A termination of a capped container counts as process-cap too.
	tr.Cap(trainer, gpuA, true, w.now)
	if err := tr.Scan(w.now, func(c Container) []Termination {
		if c != trainer {
			return nil
		}
		return []Termination{{Container: trainer, Instance: 1, Reason: "Error", Message: torchOOM, ExitCode: 1, FinishedAt: w.now}}
	}); err != nil {
		t.Fatal(err)
	}
	if got := counts(tr); got["trainer-0/GPU-a/termination/process-cap"] != 1 || got["trainer-0/GPU-a/termination/device"] != 0 {
		t.Errorf("termination of a capped container: %v", got)
	}

	// A new pod under the same name starts as no client.
	again := trainer
	again.PodUID = "0e6a3c1e-7d3b-4c55-9a8e-2b7f7c1d9e01"
	tr.Watch(again, gpuA, w.now)
	w.write(w.logPath(again, 0), cri(4*time.Minute, "stderr", "F", torchOOM))
	w.trackerScan(tr)
	if got := counts(tr); got["trainer-0/GPU-a/log/device"] != 2 || got["trainer-0/GPU-a/log/process-cap"] != 2 {
		t.Errorf("recreated pod: %v", got)
	}
}

// TestTrackerMPSGPU: on a GPU that runs an MPS server, the device OOMs of
// a container never seen its client count as process-cap (a client that
// fails at its limit as it starts is gone before any scrape; seen on a real
// H200), its counters start as process-cap, and a client seen without a
// limit keeps device. Once the GPU runs no server, device again.
func TestTrackerMPSGPU(t *testing.T) {
	w := newWorld(t)
	tr := NewTracker(w.detector(Config{}))
	uncapped := Container{Namespace: "ml", Pod: "nolimit-0", PodUID: "9d3e2b1a-0c4f-4e5d-8a7b-6c5d4e3f2a1b", Container: "app"}
	w.trackerScan(tr)
	tr.MPS(gpuA, true)
	tr.Cap(uncapped, gpuA, false, w.now)
	tr.Watch(trainer, gpuA, w.now)
	tr.Watch(uncapped, gpuA, w.now)
	w.write(w.logPath(trainer, 0), cri(0, "stderr", "F", torchOOM))
	w.write(w.logPath(uncapped, 0), cri(0, "stderr", "F", torchOOM))
	w.trackerScan(tr)
	wantCounts(t, "MPS GPU", tr, map[string]float64{
		"trainer-0/GPU-a/log/process-cap": 1, "trainer-0/GPU-a/termination/process-cap": 0,
		"nolimit-0/GPU-a/log/device": 1, "nolimit-0/GPU-a/termination/device": 0,
	})
	tr.MPS(gpuA, false)
	w.write(w.logPath(trainer, 0), cri(time.Minute, "stderr", "F", torchOOM))
	w.trackerScan(tr)
	if got := counts(tr); got["trainer-0/GPU-a/log/device"] != 1 || got["trainer-0/GPU-a/log/process-cap"] != 1 {
		t.Errorf("MPS off: %v", got)
	}
}

// TestTrackerMPSProbe: a device OOM read on a GPU whose last reading had
// no MPS server asks the probe once per Scan, and counts as process-cap
// when it says a server runs now; a Scan right after a reading (a
// scrape's) takes the reading's word and does not ask.
func TestTrackerMPSProbe(t *testing.T) {
	w := newWorld(t)
	tr := NewTracker(w.detector(Config{}))
	asked, server := 0, false
	tr.SetMPSProbe(func(string) bool { asked++; return server })
	w.trackerScan(tr)
	tr.Watch(trainer, gpuA, w.now)
	oomAt := func(at time.Duration) {
		w.write(w.logPath(trainer, 0), cri(at, "stderr", "F", torchOOM))
	}
	tr.MPS(gpuA, false) // a scrape's reading, then its scan
	oomAt(0)
	w.trackerScan(tr)
	if asked != 0 {
		t.Errorf("a scan right after a reading asked the probe %d times", asked)
	}
	server = true // the watch's scan, the server started since
	oomAt(time.Minute)
	oomAt(2 * time.Minute)
	w.trackerScan(tr)
	if asked != 1 {
		t.Errorf("the probe was asked %d times in one scan, want once", asked)
	}
	wantCounts(t, "MPS probe", tr, map[string]float64{
		"trainer-0/GPU-a/log/device": 1, "trainer-0/GPU-a/termination/device": 0,
		"trainer-0/GPU-a/log/process-cap": 2,
	})
}

// TestTrackerZeroKind: the counters a container starts with are of the
// kind of a plain GPU OOM: device with the catalogue or any set of
// patterns that has a device one, else the first kind of the user's
// patterns (unknown for one outside the catalogue, labelled "unknown").
func TestTrackerZeroKind(t *testing.T) {
	device := Catalogue[len(Catalogue)-1]
	if device.Kind != KindDevice {
		t.Fatalf("the catalogue's last signature is %q, not a device one", device.Kind)
	}
	for _, tc := range []struct {
		patterns []string
		want     Kind
	}{
		{nil, KindDevice},
		{[]string{`my own oom`}, KindUnknown},
		{[]string{device.Pattern, `my own oom`}, KindDevice},
	} {
		w := newWorld(t)
		tr := NewTracker(w.detector(Config{Patterns: tc.patterns}))
		if got := tr.ZeroKind(trainer, gpuA); got != tc.want {
			t.Errorf("patterns %q: zero kind %q, want %q", tc.patterns, got, tc.want)
		}
	}
	if KindUnknown.Label() != "unknown" || KindDevice.Label() != "device" {
		t.Errorf("labels %q, %q", KindUnknown.Label(), KindDevice.Label())
	}

	w := newWorld(t)
	tr := NewTracker(w.detector(Config{Patterns: []string{`my own oom`}}))
	p := w.logPath(trainer, 0)
	w.trackerScan(tr)
	tr.Cap(trainer, gpuA, true, w.now)
	tr.Watch(trainer, gpuA, w.now)
	w.write(p, cri(0, "stderr", "F", "my own oom"))
	w.trackerScan(tr)
	wantCounts(t, "own pattern", tr, map[string]float64{"trainer-0/GPU-a/log/unknown": 1, "trainer-0/GPU-a/termination/unknown": 0})
}

// TestTrackerLiveContainerKeepsEveryCounter: a counter of a kind Watch
// does not keep at 0 (here encoder-session) stays while its container is
// live, however long it stays still; dropped, it would come back at 1 with
// the next such OOM, and increase() would see no event. Once the
// container is no longer live, the period applies as to any counter.
func TestTrackerLiveContainerKeepsEveryCounter(t *testing.T) {
	const period = time.Hour
	const nvenc = "[h264_nvenc @ 0x5601aa5b40c0] OpenEncodeSessionEx failed: out of memory (10)"
	w := newWorld(t)
	tr := NewTracker(w.detector(Config{ForgetAfter: period}))
	p := w.logPath(trainer, 0)
	w.write(p, noise(0, 1))
	w.trackerScan(tr) // baseline
	tr.Watch(trainer, gpuA, w.now)
	w.trackerScan(tr)
	w.now = w.now.Add(time.Minute)
	w.write(p, cri(time.Minute, "stderr", "F", nvenc))
	tr.Watch(trainer, gpuA, w.now)
	w.trackerScan(tr)
	want := counters("trainer-0", 0, 0)
	want["trainer-0/GPU-a/log/encoder-session"] = 1
	wantCounts(t, "NVENC OOM", tr, want)
	for range 2 * period / time.Minute {
		w.now = w.now.Add(time.Minute)
		tr.Watch(trainer, gpuA, w.now)
		w.trackerScan(tr)
	}
	wantCounts(t, "live for twice the period since", tr, want)
	w.now = w.now.Add(period + time.Minute)
	w.trackerScan(tr)
	wantCounts(t, "no longer live for the period", tr, map[string]float64{})
}

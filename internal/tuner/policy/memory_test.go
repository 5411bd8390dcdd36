package policy

import (
	"slices"
	"testing"
	"time"
)

// A workload's record prices its pending pods, running pods are reserved at
// what they and their workload's pods of their age did, and pods of
// workloads not known yet are admitted as far as the rules allow.
func TestDecideWithMemory(t *testing.T) {
	def := DefaultConfig()
	full := history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks))
	known := func(peak uint64) WorkloadMemory {
		return WorkloadMemory{PeakBytes: peak, Seen: time.Hour, LastSeen: now.Add(-time.Hour)}
	}
	// byAge is a known workload whose pods used bytes[i] at ages[i].
	byAge := func(lifetime time.Duration, ages []time.Duration, bytes []uint64) WorkloadMemory {
		w := known(0)
		for i, a := range ages {
			w.atAge(a, bytes[i])
			w.PeakBytes = max(w.PeakBytes, bytes[i])
		}
		w.Lifetime = lifetime
		return w
	}
	// ended folds the sizes of pods that ended into w.
	ended := func(w WorkloadMemory, sizes ...uint64) WorkloadMemory {
		for _, b := range sizes {
			w.addPod(b)
		}
		return w
	}
	obs := func(pending []PendingPod, mem map[string]WorkloadMemory) Observation {
		o := node(4, now.Add(-time.Minute), full)
		o.Pending, o.Memory = pending, Memory{Updated: now, Workloads: mem}
		return o
	}
	// job is the services and one more container c at peak bytes, 5
	// allocated, c first seen age ago.
	job := func(c, wl string, bytes uint64, age time.Duration, pending []PendingPod, mem map[string]WorkloadMemory) Observation {
		o := node(5, now.Add(-time.Minute), history(10*time.Minute, steady(servicesUsed+bytes, 5, 5, withPeak(servicePeaks, c, bytes))))
		o.Pending, o.ContainerWorkloads = pending, map[string]string{c: wl}
		o.Memory = Memory{Updated: now, Workloads: mem, Containers: map[string]ContainerMemory{c: {FirstSeen: now.Add(-age), LastSeen: now, PeakBytes: bytes, PeakAt: now}}}
		return o
	}
	tests := []struct {
		name     string
		obs      Observation
		replicas int
		reason   string
	}{
		{"pending pods of known small workloads are raised for at once, several in one step",
			obs([]PendingPod{{Workload: "job/embed", Replicas: 1}, {Workload: "job/embed", Replicas: 1}, {Workload: "job/thumbs", Replicas: 1}},
				map[string]WorkloadMemory{"job/embed": known(3 * GiB), "job/thumbs": known(2 * GiB)}), 7, ReasonSustainedHeadroom},
		{"a pending pod of unknown size is priced at the largest pod running, a change a minute ago or not",
			obs([]PendingPod{{Workload: "job/new", Replicas: 1}}, nil), 5, ReasonSustainedHeadroom},
		{"a known pod larger than the memory left waits, and services hand no replica on",
			// 27.5 GiB left: not 28
			obs([]PendingPod{{Workload: "job/finetune", Replicas: 1}}, map[string]WorkloadMemory{"job/finetune": known(28 * GiB)}), 4, ReasonInsufficientHeadroom},
		{"a known pod that fits the memory left is let in, with no margin beyond its own uncertainty",
			// 27.5 GiB left: 24 fits
			obs([]PendingPod{{Workload: "job/finetune", Replicas: 1}}, map[string]WorkloadMemory{"job/finetune": known(24 * GiB)}), 5, ReasonSustainedHeadroom},
		{"a pod of a leaking service is priced at what its pods grew to over their life",
			// small when it starts, 30 GiB a day later: 27.5 GiB left
			obs([]PendingPod{{Workload: "svc/leak", Replicas: 1}}, map[string]WorkloadMemory{"svc/leak": byAge(24*time.Hour,
				[]time.Duration{0, 6 * time.Hour, 23 * time.Hour}, []uint64{2 * GiB, 10 * GiB, 30 * GiB})}), 4, ReasonInsufficientHeadroom},
		{"a job still loading is reserved at what its workload's pods reached at its age a window later",
			// at 3 GiB 30 s in, its pods reach 9 GiB by 5 minutes: 43.2 -
			// 20.5 - 10.5 GiB backs one more 9 GiB pod, not two
			job("batch/new-1/c", "job/train", 3*GiB, 30*time.Second,
				[]PendingPod{{Workload: "job/train", Replicas: 1}, {Workload: "job/train", Replicas: 1}}, map[string]WorkloadMemory{"job/train": byAge(time.Hour,
					[]time.Duration{0, 5 * time.Minute}, []uint64{3 * GiB, 9 * GiB})}), 6, ReasonSustainedHeadroom},
		{"a young pod of a workload whose pods run for hours is reserved at what the largest reached by a window later",
			// a model 2 minutes in at 6 GiB; its workload's pods held 12 GiB
			// then and 20 GiB by 5 minutes: reserved at 20 GiB, not 6 + 8;
			// 48 - 20.5 - 20 GiB leaves 7.5 GiB, a 25% chance that a 7 GiB
			// job overflows it
			job("ml/llm-2/serve", "svc/llm", 6*GiB, 2*time.Minute,
				[]PendingPod{{Workload: "job/embed", Replicas: 1}}, map[string]WorkloadMemory{"job/embed": known(7 * GiB), "svc/llm": byAge(6*time.Hour,
					[]time.Duration{0, 90 * time.Second, 5 * time.Minute}, []uint64{12 * GiB, 12 * GiB, 20 * GiB})}), 5, ReasonInsufficientHeadroom},
		{"a young pod of a short job is reserved at its own size and its workload's growth",
			// the same pod of a workload whose pods run 15 minutes and
			// ended at 12 GiB on average: 6 + 8 GiB leaves 13.5 GiB, room
			// for the 7 GiB job
			job("batch/llm-2/serve", "job/eval", 6*GiB, 2*time.Minute,
				[]PendingPod{{Workload: "job/embed", Replicas: 1}}, map[string]WorkloadMemory{"job/embed": known(7 * GiB), "job/eval": ended(byAge(15*time.Minute,
					[]time.Duration{0, 90 * time.Second, 5 * time.Minute}, []uint64{12 * GiB, 12 * GiB, 20 * GiB}), 11*GiB, 12*GiB, 13*GiB)}), 6, ReasonSustainedHeadroom},
		{"a pod of a workload being learnt joins its first at a price twice what that one showed",
			// the first shows 0.5 GiB; the largest pod running, 8 GiB, is
			// more than twice that
			job("batch/thumbs-1/c", "job/thumbs", GiB/2, time.Minute, []PendingPod{{Workload: "job/thumbs", Replicas: 1}}, nil), 6, ReasonSustainedHeadroom},
		{"a pod of a workload being learnt waits when the room left is less than twice what its first showed",
			// the first shows 10 GiB a minute in: 17.5 GiB left, its
			// sibling priced at 20
			job("batch/ft-1/c", "job/ft", 10*GiB, time.Minute, []PendingPod{{Workload: "job/ft", Replicas: 1}}, nil), 5, ReasonLearning},
		{"a pod of a workload being learnt is let in when the room left backs twice what its first showed",
			// the first shows 6 GiB: 21.5 GiB left, its sibling priced at 12
			job("batch/ft-1/c", "job/ft", 6*GiB, time.Minute, []PendingPod{{Workload: "job/ft", Replicas: 1}}, nil), 6, ReasonSustainedHeadroom},
		{"a young container of a workload not known is reserved at the largest pod running",
			// 20.5 + 8 (not 1) GiB: 14.7 GiB left backs one 8 GiB stranger
			job("batch/x-1/c", "job/x", GiB, time.Minute, []PendingPod{{Workload: "job/y", Replicas: 1}, {Workload: "job/z", Replicas: 1}}, nil), 6, ReasonSustainedHeadroom},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(def, tc.obs)
			if d.Replicas != tc.replicas || d.Reason != tc.reason {
				t.Errorf("Decide = %d %s, want %d %s\nmessage: %s", d.Replicas, d.Reason, tc.replicas, tc.reason, d.Message)
			}
		})
	}
}

// A container is reserved at its own peak while it reached it within
// PeakHold: a service at its lunchtime dip comes back, one in its evening
// does not need its daytime peak kept.
func TestDecidePeakHold(t *testing.T) {
	for _, tc := range []struct {
		name     string
		peakAt   time.Time
		replicas int
		reason   string
	}{
		// 28 GiB kept leaves 7.5 GiB: no room for an 8 GiB job
		{"a peak left two hours ago is kept", now.Add(-2 * time.Hour), 4, ReasonInsufficientHeadroom},
		{"a peak left seven hours ago is not", now.Add(-7 * time.Hour), 5, ReasonSustainedHeadroom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := node(4, time.Time{}, history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks)))
			o.Pending = []PendingPod{{Workload: "job/embed", Replicas: 1}}
			o.Memory = Memory{Updated: now, Workloads: map[string]WorkloadMemory{"job/embed": {PeakBytes: 8 * GiB, Seen: time.Hour, LastSeen: now}},
				Containers: map[string]ContainerMemory{"media/rife/rife": {FirstSeen: now.Add(-9 * time.Hour), LastSeen: now, PeakBytes: 28 * GiB, PeakAt: tc.peakAt}}}
			d := Decide(DefaultConfig(), o)
			if d.Replicas != tc.replicas || d.Reason != tc.reason {
				t.Errorf("Decide = %d %s, want %d %s\nmessage: %s", d.Replicas, d.Reason, tc.replicas, tc.reason, d.Message)
			}
		})
	}
}

// The container that OOMed on a full GPU is not given its count again while
// it runs; its workload's next pod is priced at what the OOM asked for.
func TestDecideRemembersOOMs(t *testing.T) {
	roomy := history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks))
	ft := WorkloadMemory{PeakBytes: 12 * GiB, Seen: time.Hour, LastSeen: now.Add(-time.Hour), OOMAllocated: 5,
		OOMContainer: "ml/ft-1/train", LastOOM: now.Add(-24 * time.Hour)}
	ft.atAge(time.Minute, 12*GiB)
	ft.atAge(6*time.Minute, 30*GiB) // the OOM: 48 GiB less the 18 the others held
	rife := WorkloadMemory{PeakBytes: 8 * GiB, Seen: time.Hour, LastSeen: now, OOMAllocated: 5, OOMContainer: "media/rife/rife", LastOOM: now.Add(-time.Hour)}
	embed := WorkloadMemory{PeakBytes: 3 * GiB, Seen: time.Hour, LastSeen: now}
	for _, tc := range []struct {
		name     string
		pending  string
		mem      map[string]WorkloadMemory
		replicas int
		reason   string
	}{
		{"the container that OOMed with 5 pods, still running, is not given 5 again", "job/embed",
			map[string]WorkloadMemory{"media/rife/rife": rife, "job/embed": embed}, 4, ReasonRememberedOOM},
		{"an OOM older than remember is forgotten", "job/embed",
			map[string]WorkloadMemory{"media/rife/rife": func() WorkloadMemory { w := rife; w.LastOOM = now.Add(-DefaultConfig().Remember); return w }(), "job/embed": embed},
			5, ReasonSustainedHeadroom},
		{"a daily job that OOMed yesterday is priced at what the OOM asked for", "ml/ft",
			// 30 GiB; 27.5 GiB left
			map[string]WorkloadMemory{"ml/ft": ft}, 4, ReasonInsufficientHeadroom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := node(4, now.Add(-time.Hour), roomy)
			o.Pending = []PendingPod{{Workload: tc.pending, Replicas: 1}}
			o.Memory = Memory{Updated: now, Workloads: tc.mem}
			d := Decide(DefaultConfig(), o)
			if d.Replicas != tc.replicas || d.Reason != tc.reason {
				t.Errorf("Decide = %d %s, want %d %s\nmessage: %s", d.Replicas, d.Reason, tc.replicas, tc.reason, d.Message)
			}
		})
	}
}

func TestPeakBy(t *testing.T) {
	var w WorkloadMemory
	w.atAge(30*time.Second, 2*GiB) // [0, 1m)
	w.atAge(3*time.Minute, 6*GiB)  // [2m, 5m)
	w.atAge(13*time.Hour, 20*GiB)  // [12h, 16h)
	for _, tc := range []struct {
		age  time.Duration
		want uint64
	}{
		{0, 0},                      // a straight line from nothing at age 0
		{30 * time.Second, GiB},     // half way to the first bucket's 2 GiB
		{90 * time.Second, 2 * GiB}, // [1m, 2m) is empty: what came before
		{2 * time.Minute, 2 * GiB},
		{3*time.Minute + 30*time.Second, 4 * GiB}, // half way from 2 to 6 GiB
		{time.Hour, 6 * GiB},
		{14 * time.Hour, 13 * GiB}, // half way from 6 to 20 GiB
		{100 * time.Hour, 20 * GiB},
	} {
		if got := w.PeakBy(tc.age); got != tc.want {
			t.Errorf("PeakBy(%s) = %.2f GiB, want %.2f", tc.age, float64(got)/float64(GiB), float64(tc.want)/float64(GiB))
		}
	}
	if got := (WorkloadMemory{PeakBytes: 5 * GiB}).PeakBy(time.Minute); got != 5*GiB {
		t.Errorf("a record without PeakByAge answers %d, want its PeakBytes", got)
	}
}

func TestRemember(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxWorkloads = 2
	ss := with(history(2*time.Minute, steady(servicesUsed, 4, 4, map[string]uint64{"ns/rife-7f/rife": 8 * GiB, "ns/yolo-1/yolo": 6 * GiB})),
		last(1), func(s *Sample) { s.OOMEvents, s.OOMs = 1, []OOM{{Container: "ns/rife-7f/rife", Kind: OOMDevice}} })
	obs := Observation{Now: now, ContainerWorkloads: map[string]string{"ns/rife-7f/rife": "Deployment/ns/rife"},
		GPUs: []GPUObservation{{UUID: "g", Samples: ss}}}
	old := Memory{Updated: now.Add(-time.Hour), Workloads: map[string]WorkloadMemory{
		"Job/ns/gone": {PeakBytes: GiB, LastSeen: now.Add(-cfg.Remember - time.Second)},
		"Job/ns/old":  {PeakBytes: GiB, LastSeen: now.Add(-time.Hour)},
		// rife's record from yesterday: PeakByAge must not be written
		// through to the caller's copy
		"Deployment/ns/rife": {PeakBytes: 7 * GiB, PeakByAge: []uint64{7 * GiB}},
	}, Containers: map[string]ContainerMemory{
		"ns/ended/c": {FirstSeen: now.Add(-time.Hour), LastSeen: now.Add(-cfg.Window - time.Second), PeakBytes: GiB},
	}}
	got := Remember(cfg, old, obs)
	rife := got.Workloads["Deployment/ns/rife"]
	if rife.PeakBytes != 8*GiB || rife.Seen != time.Duration(len(ss))*cfg.SampleInterval || rife.OOMAllocated != 4 || !rife.LastOOM.Equal(now) ||
		rife.OOMContainer != "ns/rife-7f/rife" || rife.Lifetime != 2*time.Minute {
		t.Errorf("rife = %+v, want 8 GiB peak over %d samples, 2 minutes long, and an OOM of ns/rife-7f/rife at 4 pods now", rife, len(ss))
	}
	// The samples fall in the first buckets by age; the OOM asked for the
	// 48 GiB less the 6 GiB yolo held, at 2 minutes.
	if p := rife.PeakBy(90 * time.Second); p != 8*GiB {
		t.Errorf("rife's peak by 90 s is %.1f GiB, want 8", float64(p)/float64(GiB))
	}
	if p := rife.PeakBy(time.Hour); p != a6000-6*GiB {
		t.Errorf("rife's peak by an hour is %.1f GiB, want what the OOM asked for, %.1f", float64(p)/float64(GiB), float64(a6000-6*GiB)/float64(GiB))
	}
	if old.Workloads["Deployment/ns/rife"].PeakByAge[0] != 7*GiB || len(old.Workloads["Deployment/ns/rife"].PeakByAge) != 1 {
		t.Errorf("Remember changed its input's PeakByAge: %v", old.Workloads["Deployment/ns/rife"].PeakByAge)
	}
	c := got.Containers["ns/rife-7f/rife"]
	if !c.FirstSeen.Equal(ss[0].Time) || !c.LastSeen.Equal(now) || c.PeakBytes != 8*GiB {
		t.Errorf("rife's container = %+v, want seen from %s to now at 8 GiB", c, ss[0].Time)
	}
	if _, ok := got.Containers["ns/ended/c"]; ok {
		t.Errorf("a container gone for more than a window is still remembered")
	}
	if _, ok := got.Workloads["Job/ns/gone"]; ok || len(got.Workloads) != 2 {
		t.Errorf("workloads %v: want the expired one forgotten and at most maxWorkloads kept", got.Workloads)
	}
	if _, ok := got.Workloads["Job/ns/old"]; ok {
		t.Errorf("the least recently seen record survived the bound of %d", cfg.MaxWorkloads)
	}
	if again := Remember(cfg, got, obs); again.Workloads["Deployment/ns/rife"].Seen != rife.Seen {
		t.Errorf("the same samples were counted twice: seen %s, want %s", again.Workloads["Deployment/ns/rife"].Seen, rife.Seen)
	}
	if len(old.Workloads) != 3 || len(old.Containers) != 1 {
		t.Errorf("Remember changed its input")
	}
	// Containers are bounded like workloads.
	cfg.MaxWorkloads = 1
	if got := Remember(cfg, Memory{}, obs); len(got.Containers) != 1 {
		t.Errorf("%d containers kept, want at most maxWorkloads (1)", len(got.Containers))
	}
}

// Base is the count the tuner found, lowered only by evidence: replicas it
// raised are its bets and may be withdrawn on a guess, the operator's are
// not.
func TestRoundBase(t *testing.T) {
	def := DefaultConfig()
	// Six free replicas on the seed services and nobody waiting: the
	// objective keeps one spare, 5.
	roomy := history(10*time.Minute, steady(servicesUsed, 4, 10, servicePeaks))
	// Pressure with a free replica, and fullness: the same 47 GiB with or
	// without the smallest pod (a 0.5 GiB transcoder).
	pressed := history(10*time.Minute, steady(46*GiB, 4, 5, withPeak(servicePeaks, "media/rife/rife", 33*GiB+GiB/2)))
	full := history(10*time.Minute, steady(47*GiB, 5, 5, withPeak(servicePeaks, "media/rife/rife", 34*GiB+GiB/2)))
	tests := []struct {
		name     string
		base     int
		cur      int
		ss       []Sample
		replicas int
		reason   string
		wantBase int
	}{
		{"the first round takes the count it finds as the base", 0, 10, roomy, 10, ReasonFreeReplicas, 10},
		{"free replicas above the base are withdrawn but for one spare", 4, 10, roomy, 5, ReasonUnbackedReplicas, 4},
		{"withdrawal stops at the base", 8, 10, roomy, 8, ReasonUnbackedReplicas, 8},
		{"an OOM lowers the base with the count", 8, 8, with(history(10*time.Minute, steady(servicesUsed, 8, 8, servicePeaks)), last(1),
			func(s *Sample) { s.OOMEvents, s.MemoryUsedBytes = 1, 46*GiB }), 7, ReasonGPUOOM, 7},
		{"a free replica with no room for a pod is withdrawn, and the base stays", 3, 5, pressed, 4, ReasonUnbackedReplicas, 3},
		{"a free replica with no room for a pod is kept at the base", 5, 5, pressed, 5, ReasonFreeReplicas, 5},
		{"measured fullness without the smallest pod goes below the base, and lowers it", 5, 5, full, 4, ReasonMemoryFull, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := node(tc.cur, time.Time{}, tc.ss)
			o.Memory = Memory{Base: tc.base}
			d, mem := Round(def, o)
			if d.Replicas != tc.replicas || d.Reason != tc.reason || mem.Base != tc.wantBase {
				t.Errorf("Round = %d replicas (%s: %s), base %d; want %d %s, base %d", d.Replicas, d.Reason, d.Message, mem.Base, tc.replicas, tc.reason, tc.wantBase)
			}
		})
	}
}

// A service's pod that another pod of its workload replaced is recorded
// among the sizes as a restart, not a job, also when the replacement,
// created as it ended, still waits for a replica; a job that ended, a
// long job whose sibling was queued before it ended, and a service that
// ended with nothing of its workload running or waiting, are not.
// A record written before Restarts existed is padded to stay aligned.
func TestRememberMarksRestarts(t *testing.T) {
	cfg := DefaultConfig()
	gone := now.Add(-cfg.Window - time.Second)
	old := Memory{Updated: now.Add(-time.Hour), Since: now.Add(-2 * 24 * time.Hour),
		Sizes: []uint64{2 * GiB, 3 * GiB}, SizesAt: []time.Time{now.Add(-2 * time.Hour), now.Add(-time.Hour)},
		Containers: map[string]ContainerMemory{
			"batch/j-1/c":   {FirstSeen: gone.Add(-40 * time.Minute), LastSeen: gone, PeakBytes: 5 * GiB, Workload: "Job/batch/j"},
			"svc/leaky-3/c": {FirstSeen: gone.Add(-13 * time.Hour), LastSeen: gone, PeakBytes: 19 * GiB, Workload: "Deployment/svc/leaky"},
			"svc/lone-1/c":  {FirstSeen: gone.Add(-5 * time.Hour), LastSeen: gone, PeakBytes: 7 * GiB, Workload: "Deployment/svc/lone"},
			"svc/slow-1/c":  {FirstSeen: gone.Add(-4 * time.Hour), LastSeen: gone, PeakBytes: 9 * GiB, Workload: "Deployment/svc/slow"},
			"train/t-1/c":   {FirstSeen: gone.Add(-3 * time.Hour), LastSeen: gone, PeakBytes: 11 * GiB, Workload: "Job/train/t"},
			"svc/leaky-4/c": {FirstSeen: gone, LastSeen: now.Add(-time.Hour), PeakBytes: GiB, Workload: "Deployment/svc/leaky"},
			"batch/j-2/c":   {FirstSeen: gone.Add(-time.Hour), LastSeen: now.Add(-time.Hour), PeakBytes: 5 * GiB, Workload: "Job/batch/j"},
		}}
	obs := Observation{Now: now, ContainerWorkloads: map[string]string{"svc/leaky-4/c": "Deployment/svc/leaky", "batch/j-2/c": "Job/batch/j"},
		Pending: []PendingPod{{Workload: "Deployment/svc/slow", Replicas: 1, Since: gone}, {Workload: "Job/train/t", Replicas: 1, Since: gone.Add(-time.Hour)}, {Workload: "Job/batch/other", Replicas: 1, Since: gone}},
		GPUs:    []GPUObservation{{UUID: "g", Samples: history(2*time.Minute, steady(6*GiB, 2, 4, map[string]uint64{"svc/leaky-4/c": GiB, "batch/j-2/c": 5 * GiB}))}}}
	got := Remember(cfg, old, obs)
	want := []uint64{2 * GiB, 3 * GiB, 5 * GiB, 19 * GiB, 7 * GiB, 9 * GiB, 11 * GiB}
	if !slices.Equal(got.Sizes, want) {
		t.Fatalf("sizes %v, want %v (the five ended containers by key after the two remembered)", got.Sizes, want)
	}
	if wantR := []bool{false, false, false, true, false, true, false}; !slices.Equal(got.Restarts, wantR) {
		t.Errorf("restarts %v, want %v: leaky-3, which ran 13 h and leaky-4 replaced, and slow-1, whose next pod came as it ended and waits; not t-1, whose sibling waited before it ended", got.Restarts, wantR)
	}
	if len(old.Restarts) != 0 {
		t.Errorf("Remember changed its input's Restarts: %v", old.Restarts)
	}
}

// The ranks that price a pod never seen leave a service's restart out: a
// leaking service restarted at 19.3 GiB among 1-12 GiB jobs priced every
// next job at 6.5 ± 6.7 GiB and held a stream's jobs to one at a time with
// 23 GiB free (held-out generated seed 107).
func TestRankPriceLeavesRestartsOut(t *testing.T) {
	def := DefaultConfig()
	o := onCard(2, card(48*GiB, 20*time.Minute, 2, always(map[string]uint64{"svc/cache/c": GiB})))
	// 45 jobs of 1-12 GiB in the last 6 hours, then the restart.
	var sizes []uint64
	var at []time.Time
	for i := range 45 {
		sizes, at = append(sizes, GiB+uint64(i)*GiB/4), append(at, now.Add(-time.Duration(45-i)*7*time.Minute))
	}
	sizes, at = append(sizes, 19*GiB+GiB/4), append(at, now.Add(-5*time.Minute))
	price := func(restarts []bool) item {
		o.Memory = Memory{Since: now.Add(-24 * time.Hour), Sizes: sizes, SizesAt: at, Restarts: restarts}
		v := newGPUView(def, &o, o.GPUs[0], 0, 1, true)
		p, ok := v.rankPrice()
		if !ok {
			t.Fatalf("no rank price from %d sizes", len(sizes))
		}
		return p
	}
	with, without := price(nil), price(append(make([]bool, len(sizes)-1), true))
	if without.sd >= with.sd/2 {
		t.Errorf("a job priced %s ± %s with the restart left out, %s ± %s with it: want the restart's tail gone", gibf(without.mean), gibf(without.sd), gibf(with.mean), gibf(with.sd))
	}
	if top := without.mean + 2*without.sd; top < float64(11*GiB) || top > float64(15*GiB) {
		t.Errorf("a job priced %s ± %s: want its upper tail near the largest job, 11 GiB", gibf(without.mean), gibf(without.sd))
	}
}

// A container that comes back to within peakAgain (5%) of its peak has
// reached it again: a model server that loaded 2.68 GiB, then a 2.56 GiB
// model seven hours later, keeps its peak reserved for another PeakHold
// (held-out seed 71 loaded it into the 1.8 GiB a raise had left once the
// first load's time was up). One that comes back to three quarters of it
// has not.
func TestPeakReachedAgain(t *testing.T) {
	cfg := DefaultConfig()
	const c = "ai/ollama-0/c"
	first := now.Add(-7 * time.Hour)
	for _, tc := range []struct {
		name   string
		holds  uint64
		wantAt time.Time
	}{
		{"4.5% below", 2560 << 20, now},
		{"three quarters", 2010 << 20, first},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := Memory{Updated: now.Add(-2 * time.Minute), Since: now.Add(-24 * time.Hour),
				Containers: map[string]ContainerMemory{c: {FirstSeen: now.Add(-24 * time.Hour), LastSeen: now.Add(-2 * time.Minute), PeakBytes: 2680 << 20, PeakAt: first, Resident: true, Workload: "Deployment/ai/ollama"}}}
			obs := Observation{Now: now, ContainerWorkloads: map[string]string{c: "Deployment/ai/ollama"},
				GPUs: []GPUObservation{{UUID: "g", Samples: history(time.Minute, steady(tc.holds, 1, 4, map[string]uint64{c: tc.holds}))}}}
			got := Remember(cfg, old, obs).Containers[c]
			if got.PeakBytes != 2680<<20 || !got.PeakAt.Equal(tc.wantAt) {
				t.Errorf("peak %d MiB at %s, want 2680 MiB at %s", got.PeakBytes>>20, got.PeakAt, tc.wantAt)
			}
		})
	}
}

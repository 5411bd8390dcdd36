package policy

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// card samples a GPU of total bytes every 15 s over the last span: at(t)
// gives the memory of each container then, each holding a replica, with
// adv replicas advertised.
func card(total uint64, span time.Duration, adv int, at func(t time.Time) map[string]uint64) []Sample {
	return history(span, func(_ int, t time.Time) Sample {
		peaks := at(t)
		var used uint64
		for _, p := range peaks {
			used += p
		}
		return Sample{Time: t, MemoryTotalBytes: total, MemoryUsedBytes: used, ContainerPeaks: peaks,
			ReplicasAdvertised: adv, ReplicasAllocated: len(peaks)}
	})
}

// always is a container mix that never changes.
func always(peaks map[string]uint64) func(time.Time) map[string]uint64 {
	return func(time.Time) map[string]uint64 { return maps.Clone(peaks) }
}

// replay runs Round at every sample of the node's first GPU before o.Now,
// as the controller does each round, carrying the memory from round to
// round with the count held at o.CurrentReplicas, then the round at o.Now:
// what a container's record says (its age, whether it ran before the tuner
// came, its OOMs in a row) is what Round built, not what a test wrote.
func replay(cfg Config, o Observation) (Decision, Memory) {
	o.Memory = remembered(cfg, o)
	return Round(cfg, o)
}

// remembered is the memory of the rounds of replay before o.Now.
func remembered(cfg Config, o Observation) Memory {
	mem := o.Memory
	for _, s := range o.GPUs[0].Samples {
		if !s.Time.Before(o.Now) {
			break
		}
		step := o
		step.Now, step.Pending, step.Memory, step.LastChange = s.Time, nil, mem, time.Time{}
		step.GPUs = make([]GPUObservation, len(o.GPUs))
		for i, g := range o.GPUs {
			g.Samples = within(g.Samples, s.Time.Add(-cfg.Window), s.Time)
			step.GPUs[i] = g
		}
		_, mem = Round(cfg, step)
	}
	return mem
}

// besides is a container mix of services running since before the tuner
// came and job c, at bytes, since age ago.
func besides(services map[string]uint64, c string, bytes uint64, age time.Duration) func(time.Time) map[string]uint64 {
	return func(tm time.Time) map[string]uint64 {
		m := maps.Clone(services)
		if tm.After(now.Add(-age)) {
			m[c] = bytes
		}
		return m
	}
}

// onCard is a node of one GPU at cur replicas.
func onCard(cur int, ss []Sample) Observation {
	return Observation{Node: "homelab", Now: now, CurrentReplicas: cur, GPUs: []GPUObservation{{UUID: "GPU-0", Samples: ss}}}
}

// job is the record of a workload seen before, from yesterday: pods of
// these sizes, each reaching its size in its first minutes and running 20
// minutes.
func job(sizes ...uint64) WorkloadMemory {
	w := WorkloadMemory{Seen: time.Hour, LastSeen: now.Add(-24 * time.Hour), Lifetime: 20 * time.Minute}
	for _, b := range sizes {
		w.PeakBytes = max(w.PeakBytes, b)
		w.atAge(2*time.Minute, b)
		w.addPod(b)
	}
	return w
}

// roundIs fails t unless decision d is replicas for reason.
func roundIs(t *testing.T, d Decision, replicas int, reason string) {
	t.Helper()
	if d.Replicas != replicas || d.Reason != reason {
		t.Errorf("Round = %d %s, want %d %s\nmessage: %s", d.Replicas, d.Reason, replicas, reason, d.Message)
	}
}

// The objective's own rules, each on a node's history replayed through
// Round.
func TestObjective(t *testing.T) {
	def := DefaultConfig()
	card24, card80 := 24*GiB, 80*GiB
	// Two steady 10 GiB models on a 24 GiB card, running before the tuner
	// came (issue 21, kind 4).
	models := map[string]uint64{"ml/llm-a/serve": 10 * GiB, "ml/llm-b/serve": 10 * GiB}
	// A render job seen yesterday: 2.4-2.5 GiB pods.
	render := map[string]WorkloadMemory{"Job/batch/render": job(2*GiB+GiB*2/5, 2*GiB+GiB/2, 2*GiB+GiB/2)}
	// A fine-tune seen yesterday: 6 GiB pods.
	finetune := map[string]WorkloadMemory{"Job/batch/ft": job(6*GiB, 6*GiB)}
	waitingFor := func(o Observation, mem map[string]WorkloadMemory, wls ...string) Observation {
		o.Memory.Workloads = mem
		for _, wl := range wls {
			o.Pending = append(o.Pending, PendingPod{Workload: wl, Replicas: 1, Since: now.Add(-time.Minute)})
		}
		return o
	}
	// A job of the render workload started 5 minutes ago beside the models.
	withRender := func(t time.Time) map[string]uint64 {
		m := maps.Clone(models)
		if t.After(now.Add(-5 * time.Minute)) {
			m["batch/render-1/c"] = 2*GiB + GiB/2
		}
		return m
	}
	renderRunning := onCard(3, card(card24, 30*time.Minute, 3, withRender))
	renderRunning.ContainerWorkloads = map[string]string{"batch/render-1/c": "Job/batch/render"}
	// Issue 21, kind 1: a 40 GiB model server and three small embedders
	// on an 80 GiB card since before the tuner came.
	bigModel := map[string]uint64{"ml/llm/serve": 40 * GiB, "ml/embed-a/c": 2 * GiB, "ml/embed-b/c": 2 * GiB, "ml/embed-c/c": 2 * GiB}

	tests := []struct {
		name     string
		obs      Observation
		replicas int
		reason   string
		// message holds these, when set
		message []string
	}{
		{"a waiting pod of a known workload that fits is let in",
			waitingFor(onCard(2, card(card24, 30*time.Minute, 2, always(models))), render, "Job/batch/render"),
			3, ReasonSustainedHeadroom, nil},
		{"a waiting pod of a known workload that does not fit is held",
			// 6 GiB beside 20 GiB on 24
			waitingFor(onCard(2, card(card24, 30*time.Minute, 2, always(models))), finetune, "Job/batch/ft"),
			2, ReasonInsufficientHeadroom, nil},
		{"a 2.5 GiB job beside two steady 10 GiB models on 24 GiB is let in with 1.5 GiB to spare, and only one",
			// issue 21, kind 4: a margin of 10% of the card (2.4 GiB)
			// kept every such job out for 17.5 h
			waitingFor(onCard(2, card(card24, 30*time.Minute, 2, always(models))), render, "Job/batch/render", "Job/batch/render"),
			3, ReasonSustainedHeadroom, []string{"lets in 1 of 2 waiting"}},
		{"a second 2.5 GiB job beside the models and the first is held",
			waitingFor(renderRunning, render, "Job/batch/render"),
			3, ReasonInsufficientHeadroom, nil},
		{"a stranger is not priced at the model server that ran before the tuner came",
			// issue 21, kind 1: priced at the 40 GiB model, the job never
			// started while over 30 GiB were free
			waitingFor(onCard(4, card(card80, 30*time.Minute, 4, always(bigModel))), nil, "Job/batch/never-seen"),
			5, ReasonSustainedHeadroom, []string{"(2.0 GiB)"}},
		{"every replica taken, nobody waiting, lots of room: one spare",
			// the seed services: 20.5 of 48 GiB, a stranger priced at
			// their median, 6 GiB
			onCard(4, card(a6000, 30*time.Minute, 4, always(servicePeaks))),
			5, ReasonSustainedHeadroom, []string{"1 spare"}},
		{"every replica taken, nobody waiting, little room: no spare",
			onCard(2, card(card24, 30*time.Minute, 2, always(models))),
			2, ReasonInsufficientHeadroom, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := replay(def, tc.obs)
			if d.Replicas != tc.replicas || d.Reason != tc.reason {
				t.Errorf("Round = %d %s, want %d %s\nmessage: %s", d.Replicas, d.Reason, tc.replicas, tc.reason, d.Message)
			}
			for _, want := range tc.message {
				if !strings.Contains(d.Message, want) {
					t.Errorf("message %q lacks %q", d.Message, want)
				}
			}
		})
	}
}

// A change stands for its settle time (its apply mode's latency, then
// Config.Settle) before the count may move the other way, unless an OOM
// since says it was wrong: a raise undone a round later paid twice for
// nothing (issue 21, kind 2).
func TestObjectiveSettle(t *testing.T) {
	def := DefaultConfig()
	plugin, err := ApplyCostOf(ModePlugin)
	if err != nil {
		t.Fatal(err)
	}
	// Six of ten replicas free on the seed services: the objective keeps
	// one spare and would give the others back.
	free := history(10*time.Minute, steady(servicesUsed, 4, 10, servicePeaks))
	// Every replica taken and a stranger waiting who fits.
	full := history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks))
	after := func(o Observation, dir string, ago time.Duration, apply ApplyCost) Observation {
		o.LastDirection, o.LastChange, o.Apply = dir, now.Add(-ago), apply
		return o
	}
	tests := []struct {
		name     string
		obs      Observation
		replicas int
		reason   string
	}{
		{"a raise a minute ago is not undone, though lowering would be cheaper",
			after(node(10, time.Time{}, free), DirectionUp, time.Minute, ApplyCost{}), 10, ReasonSettling},
		{"an OOM since the raise unlocks it",
			func() Observation {
				o := after(node(10, time.Time{}, free), DirectionUp, time.Minute, ApplyCost{})
				o.Memory.LastOOM = now.Add(-30 * time.Second)
				return o
			}(), 5, ReasonUnbackedReplicas},
		{"an OOM before the raise does not",
			func() Observation {
				o := after(node(10, time.Time{}, free), DirectionUp, time.Minute, ApplyCost{})
				o.Memory.LastOOM = now.Add(-2 * time.Minute)
				return o
			}(), 10, ReasonSettling},
		{"once settled the free replica is given back",
			after(node(10, time.Time{}, free), DirectionUp, 6*time.Minute, ApplyCost{}), 5, ReasonUnbackedReplicas},
		{"the apply mode's latency is part of the settle time",
			// plugin: 10 s, then 5 minutes
			after(node(10, time.Time{}, free), DirectionUp, 5*time.Minute+5*time.Second, plugin), 10, ReasonSettling},
		{"a lowering a minute ago is not undone for a waiting pod",
			after(waiting(1, node(4, time.Time{}, full)), DirectionDown, time.Minute, ApplyCost{}), 4, ReasonSettling},
		{"once settled the waiting pod is let in",
			after(waiting(1, node(4, time.Time{}, full)), DirectionDown, 6*time.Minute, ApplyCost{}), 5, ReasonSustainedHeadroom},
		{"a raise a minute ago does not hold a further raise",
			after(waiting(1, node(4, time.Time{}, full)), DirectionUp, time.Minute, ApplyCost{}), 5, ReasonSustainedHeadroom},
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

// Nothing is judged against a count not in effect yet; but evidence is
// not held back by it.
func TestObjectiveAwaitingApply(t *testing.T) {
	roomy := history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks))
	if d := Decide(DefaultConfig(), node(5, now.Add(-time.Minute), roomy)); d.Replicas != 5 || d.Reason != ReasonAwaitingApply {
		t.Errorf("4 advertised, 5 decided: got %d %s, want a hold at 5 for AwaitingApply (%s)", d.Replicas, d.Reason, d.Message)
	}
	oom := with(roomy, last(1), func(s *Sample) { s.OOMEvents, s.MemoryUsedBytes = 1, 46*GiB })
	if d := Decide(DefaultConfig(), node(5, now.Add(-time.Minute), oom)); d.Replicas != 3 || d.Reason != ReasonGPUOOM {
		t.Errorf("an OOM on a full GPU with 4 pods: got %d %s, want 3 GPUOOM first (%s)", d.Replicas, d.Reason, d.Message)
	}
}

// A pod that ended between two samples leaves its replica at once, but its
// peak is still in the latest sample: the ledger holds its memory for a
// round, and a lowering on it would be undone the next.
func TestObjectiveEndedPodInTheLatestSample(t *testing.T) {
	// Six containers, 44 of 48 GiB, five replicas held: no spare fits.
	peaks := withPeak(withPeak(servicePeaks, "batch/x-1/c", 12*GiB), "batch/x-2/c", 11*GiB+GiB/2)
	ss := history(10*time.Minute, steady(44*GiB, 6, 6, peaks))
	ss = with(ss, last(1), func(s *Sample) { s.ReplicasAllocated = 5 })
	d := Decide(DefaultConfig(), node(6, time.Time{}, ss))
	if d.Replicas != 6 || d.Reason != ReasonAwaitingApply || !strings.Contains(d.Message, "a pod has just ended") {
		t.Errorf("got %d %s, want a hold at 6 while the pod that ended is in the sample (%s)", d.Replicas, d.Reason, d.Message)
	}
}

// A container that OOMs again and again on a full GPU beside other pods is
// reported whatever the config; with EvictCrashLoops the count is lowered
// so that, evicted, it is not let in again until it fits (issue 21, kind
// 3: a job that needs 14 GiB beside three 4 GiB services on 24 GiB,
// admitted while it held 2 GiB).
func TestObjectiveCrashLoops(t *testing.T) {
	services := map[string]uint64{"svc/a/c": 4 * GiB, "svc/b/c": 4 * GiB, "svc/c/c": 4 * GiB}
	// jobs start 20 minutes ago at 2 GiB each and OOM at the times given,
	// on a full card, with every pod holding a replica and one replica
	// free.
	jobs := func(ooms map[string][]time.Duration) Observation {
		mix := func(t time.Time) map[string]uint64 {
			m := maps.Clone(services)
			if t.After(now.Add(-20 * time.Minute)) {
				for c := range ooms {
					m[c] = 2 * GiB
				}
			}
			return m
		}
		ss := card(24*GiB, 30*time.Minute, 3+len(ooms)+1, mix)
		for c, ats := range ooms {
			for _, ago := range ats {
				ss = with(ss, func(_ int, s Sample) bool { return s.Time.Equal(now.Add(-ago)) }, func(s *Sample) {
					s.OOMEvents++
					s.OOMs = append(slices.Clone(s.OOMs), OOM{Container: c, Kind: OOMDevice})
					s.MemoryUsedBytes = 24*GiB - GiB/4
				})
			}
		}
		o := onCard(3+len(ooms)+1, ss)
		o.ContainerWorkloads = map[string]string{}
		for c := range ooms {
			o.ContainerWorkloads[c] = "Job/batch/ft"
		}
		return o
	}
	evict := DefaultConfig()
	evict.EvictCrashLoops = true
	twice := map[string][]time.Duration{"batch/ft-1/c": {5 * time.Minute, 2 * time.Minute}}
	tests := []struct {
		name     string
		cfg      Config
		obs      Observation
		replicas int
		reason   string
		loops    []CrashLoop
	}{
		// 5 replicas, 4 held: the OOM lowers to 3
		{"one OOM is no loop", DefaultConfig(), jobs(map[string][]time.Duration{"batch/ft-1/c": {2 * time.Minute}}),
			3, ReasonGPUOOM, nil},
		// Two OOMs in a row beside the services that stay make a loop
		// no count ends (TestHopelessLoop): its OOMs no longer lower the
		// count, the memory the OOM samples show beyond the pods does.
		{"two OOMs in a row are a loop, reported without eviction", DefaultConfig(), jobs(twice),
			3, ReasonUnbackedReplicas, []CrashLoop{{Container: "batch/ft-1/c", GPU: "GPU-0", OOMs: 2}}},
		{"two OOMs more than a Window apart are no loop", DefaultConfig(), jobs(map[string][]time.Duration{"batch/ft-1/c": {13 * time.Minute, 2 * time.Minute}}),
			3, ReasonGPUOOM, nil},
		{"with eviction a loop is marked for it", evict, jobs(twice),
			3, ReasonCrashLoop, []CrashLoop{{Container: "batch/ft-1/c", GPU: "GPU-0", OOMs: 2, Evict: true}}},
		// 6 replicas, 5 held: the OOM lowers to 4, eviction of both to 3
		// Each refused room beside the other, a job: neither is
		// hopeless, and their OOMs lower the count.
		{"two loops: without eviction the OOM lowers by one", DefaultConfig(),
			jobs(map[string][]time.Duration{"batch/ft-1/c": {5 * time.Minute, 2 * time.Minute}, "batch/ft-2/c": {4 * time.Minute, time.Minute}}),
			4, ReasonGPUOOM, []CrashLoop{{Container: "batch/ft-1/c", GPU: "GPU-0", OOMs: 2}, {Container: "batch/ft-2/c", GPU: "GPU-0", OOMs: 2}}},
		{"two loops: with eviction both replicas are withdrawn", evict,
			jobs(map[string][]time.Duration{"batch/ft-1/c": {5 * time.Minute, 2 * time.Minute}, "batch/ft-2/c": {4 * time.Minute, time.Minute}}),
			3, ReasonCrashLoop, []CrashLoop{{Container: "batch/ft-1/c", GPU: "GPU-0", OOMs: 2, Evict: true}, {Container: "batch/ft-2/c", GPU: "GPU-0", OOMs: 2, Evict: true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := replay(tc.cfg, tc.obs)
			roundIs(t, d, tc.replicas, tc.reason)
			if !slices.Equal(d.CrashLoops, tc.loops) {
				t.Errorf("crash loops %+v, want %+v", d.CrashLoops, tc.loops)
			}
		})
	}
}

// An OOM among pods that all stay (services running for hours, none in a
// loop) is not parted by any count: the count is not lowered below them
// on it, nor held there by the ban, and the pods that come are weighed
// against the ledger. Among a job that may leave the OOM lowers the count
// as before.
// test/traces/unseen/ollama-48g-70b.yaml: a 40 GiB model's first load
// among three services lowered 6 -> 2 and the ban held 2 for six hours,
// every 6 GiB eval job waiting, where static:6 ran them with no more OOMs.
func TestOOMAmongPodsThatStay(t *testing.T) {
	const big = "ai/ollama-big/ollama"
	services := map[string]uint64{big: GiB / 2, "ai/ollama-small/ollama": 10 * GiB, "ai/embed/c": 3 * GiB}
	// The services have run for span, three hours unless given: since
	// the tuner's first look, the window's first sample.
	obs := func(cur int, mix func(time.Time) map[string]uint64, ago time.Duration, span ...time.Duration) Observation {
		ss := card(48*GiB, append(span, 3*time.Hour)[0], cur, mix)
		ss = with(ss, func(_ int, s Sample) bool { return s.Time.Equal(now.Add(-ago)) }, func(s *Sample) {
			s.OOMEvents++
			s.OOMs = []OOM{{Container: big, Kind: OOMDevice}}
			s.MemoryUsedBytes = 48*GiB - GiB/4
		})
		o := onCard(cur, ss)
		o.ContainerWorkloads = map[string]string{"batch/eval-1/c": "Job/batch/eval"}
		o.Memory.Workloads = map[string]WorkloadMemory{"Job/batch/eval": job(6 * GiB)}
		return o
	}
	eval := besides(services, "batch/eval-1/c", 6*GiB, 20*time.Minute)
	pending := func(o Observation) Observation {
		o.Pending = []PendingPod{{Workload: "Job/batch/eval", Replicas: 1, Since: now.Add(-30 * time.Second)}}
		return o
	}
	check := func(name string, o Observation, replicas int, reason string) {
		t.Run(name, func(t *testing.T) {
			d, _ := replay(DefaultConfig(), o)
			roundIs(t, d, replicas, reason)
		})
	}
	// The operator's count stays the base: only the tuner's own bets are
	// withdrawn on a guess.
	check("among services: the spares stay", obs(6, always(services), 2*time.Minute), 6, ReasonFreeReplicas)
	check("among services, an hour on: a job is let in beside them", pending(obs(2, always(services), time.Hour)), 4, ReasonSustainedHeadroom)
	check("beside a job that may leave: lowered below the pods it OOMed with", obs(6, eval, 2*time.Minute), 3, ReasonGPUOOM)
	// The allocation lags the pods (PodResources not yet showing the
	// job's replica): the job the OOM's sample showed still counts, and
	// the count is lowered below the allocation.
	lagging := obs(6, besides(services, "batch/eval-1/c", 6*GiB, 2*time.Minute+15*time.Second), 2*time.Minute)
	lagging.GPUs[0].Samples = with(lagging.GPUs[0].Samples, func(int, Sample) bool { return true }, func(s *Sample) { s.ReplicasAllocated = 3 })
	check("beside a job the allocation does not count yet: lowered", lagging, 2, ReasonGPUOOM)
	// Pods running when the tuner first looked, 20 minutes ago, are not
	// services by that alone.
	check("among pods there at the first look, young: lowered", obs(6, always(services), 2*time.Minute, 20*time.Minute), 2, ReasonGPUOOM)
}

func TestApplyCostOf(t *testing.T) {
	cfg := DefaultConfig()
	for _, tc := range []struct {
		mode              string
		latency, blackout time.Duration
	}{
		// plugin: the kubelet's next node-status update; nothing restarts
		{ModePlugin, 10 * time.Second, 0},
		// restart and config-manager: NVIDIA's plugin is down until the
		// new count is in effect
		{ModeRestart, 11 * time.Second, 11 * time.Second},
		{ModeConfigManager, 6 * time.Second, 6 * time.Second},
		{ModeInstant, 0, 0},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			c, err := ApplyCostOf(tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			if c.Mode != tc.mode || c.Latency != tc.latency || c.Blackout != tc.blackout {
				t.Errorf("ApplyCostOf(%q) = %+v, want latency %s, blackout %s", tc.mode, c, tc.latency, tc.blackout)
			}
			if got := c.Settle(cfg); got != tc.latency+cfg.Settle {
				t.Errorf("Settle = %s, want the latency and then %s", got, cfg.Settle)
			}
		})
	}
	_, err := ApplyCostOf("daemonset-restart")
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "config-manager") {
		t.Errorf("unknown mode: err = %v, want ErrInvalidConfig naming the known modes", err)
	}
}

// An OOM on a GPU with room (its kind unknown, 3 of 48 GiB in use) is the
// pod's own, not sharing's (the OOM rule ignores it): twice in a row it is
// no crash loop, and eviction would not end it.
func TestObjectiveCrashLoopNeedsAFullGPU(t *testing.T) {
	peaks := map[string]uint64{"a/svc/c": 2 * GiB, "a/job-1/c": GiB}
	ss := card(a6000, 30*time.Minute, 3, always(peaks))
	for _, ago := range []time.Duration{5 * time.Minute, 2 * time.Minute} {
		ss = with(ss, func(_ int, s Sample) bool { return s.Time.Equal(now.Add(-ago)) }, func(s *Sample) {
			s.OOMEvents, s.OOMs = 1, []OOM{{Container: "a/job-1/c"}}
		})
	}
	cfg := DefaultConfig()
	cfg.EvictCrashLoops = true
	if d, _ := replay(cfg, onCard(3, ss)); len(d.CrashLoops) != 0 || d.Replicas < 2 {
		t.Errorf("got %d %s, loops %+v; want no loop and no lowering below the pods holding replicas (%s)", d.Replicas, d.Reason, d.CrashLoops, d.Message)
	}
}

// A pod not here yet is priced as the sibling of a workload being learnt
// (twice what its pod has shown) only when that workload shows siblings:
// an ad hoc job that came alone has none to come, and the next pod is one
// of the node's sizes (generated seed 32: a lone 10 GiB job made every pod
// after the waiting ones 20 GiB, and jobs waited that static:7 let in).
func TestArrivalSiblings(t *testing.T) {
	def := DefaultConfig()
	// Two services since before the tuner came, and a job of a workload
	// never seen, started 5 minutes ago, at 10 GiB.
	at := besides(map[string]uint64{"svc/a/c": 2 * GiB, "svc/b/c": 3 * GiB}, "batch/adhoc-1/c", 10*GiB, 5*time.Minute)
	arrival := func(pending ...PendingPod) item {
		o := onCard(3, card(48*GiB, 30*time.Minute, 3, at))
		o.ContainerWorkloads = map[string]string{"batch/adhoc-1/c": "Job/batch/adhoc"}
		o.Memory = remembered(def, o)
		o.Pending = pending
		_, o.Memory = Round(def, o)
		v := newGPUView(def, &o, o.GPUs[0], 0, 1, true)
		a, _ := v.arrival(v.latest)
		return a
	}
	if a := arrival(); a.mean >= float64(10*GiB) {
		t.Errorf("alone: a pod not here yet priced at %s, want the node's sizes, under the job's 10 GiB", gibf(a.mean))
	}
	sibling := PendingPod{Workload: "Job/batch/adhoc", Replicas: 1, Since: now.Add(-time.Minute)}
	if a := arrival(sibling); a.mean < float64(20*GiB) {
		t.Errorf("a sibling waits: a pod not here yet priced at %s, want at least twice the 10 GiB shown", gibf(a.mean))
	}
}

// A departing job's replica goes to a pod not here yet only if one comes
// while the count stands: on a quiet node a raise for the pod that waits is
// not refused for an arrival that is not coming, while on a node where
// pods come every minute it is (issue 21, kind 1: every job of a workload
// never seen waited on the 80 GiB card because the forecast put a pod of
// the node's size behind every departure).
func TestHandoffArrivals(t *testing.T) {
	def := DefaultConfig()
	// Two services since before the tuner came, and a 2 GiB job of a
	// known workload started 5 minutes ago, on 24 GiB; before it, 15
	// pods of 2-8 GiB came and went, one a minute, lately or hours ago.
	at := besides(map[string]uint64{"svc/a/c": 8 * GiB, "svc/b/c": 4 * GiB}, "batch/job-1/c", 2*GiB, 5*time.Minute)
	// ago is how long before now the last of 15 pods came and went.
	decide := func(ago time.Duration) Decision {
		o := onCard(3, card(24*GiB, 30*time.Minute, 3, at))
		o.ContainerWorkloads = map[string]string{"batch/job-1/c": "Job/batch/job"}
		o.Memory.Workloads = map[string]WorkloadMemory{"Job/batch/job": job(2*GiB, 2*GiB), "Job/batch/etl": job(3*GiB, 3*GiB)}
		o.Memory = remembered(def, o)
		// The pods that came and went, at 2-8 GiB, one a minute: the
		// sizes a pod not here yet is drawn from.
		for i := range 15 {
			came := now.Add(-ago - time.Duration(14-i)*time.Minute)
			o.Memory.Arrivals = append(o.Memory.Arrivals, came)
			o.Memory.Sizes = append(o.Memory.Sizes, []uint64{2 * GiB, 3 * GiB, 4 * GiB, 5 * GiB, 6 * GiB, 8 * GiB}[i%6])
			o.Memory.SizesAt = append(o.Memory.SizesAt, came.Add(30*time.Second))
		}
		o.Pending = []PendingPod{{Workload: "Job/batch/etl", Replicas: 1, Since: now.Add(-time.Minute)}}
		d, _ := Round(def, o)
		return d
	}
	if d := decide(3 * time.Hour); d.Replicas != 4 {
		t.Errorf("quiet node: %d %s, want 4 (the 3 GiB job let in)\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
	if d := decide(time.Minute); d.Replicas != 3 {
		t.Errorf("a pod a minute: %d %s, want 3 (held)\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
}

// pooledSpread is the spread of the node's workloads that ended two pods
// or more, pooled by their degrees of freedom, and defaultPodSpread before
// there is any.
func TestPooledSpread(t *testing.T) {
	if got := pooledSpread(nil); got != defaultPodSpread {
		t.Errorf("no workload: %v, want %v", got, defaultPodSpread)
	}
	one := map[string]WorkloadMemory{"a": job(6 * GiB)}
	if got := pooledSpread(one); got != defaultPodSpread {
		t.Errorf("one pod ended: %v, want %v", got, defaultPodSpread)
	}
	// 2 and 4 GiB: sd √2 GiB of a 3 GiB mean (one degree of freedom);
	// five pods of 10 GiB: none (four degrees of freedom).
	ws := map[string]WorkloadMemory{"a": job(2*GiB, 4*GiB), "b": job(10*GiB, 10*GiB, 10*GiB, 10*GiB, 10*GiB)}
	want := math.Sqrt((1 * 2.0 / 9) / 5)
	if got := pooledSpread(ws); math.Abs(got-want) > 1e-9 {
		t.Errorf("pooled: %v, want %v", got, want)
	}
	// Alike pods are still priced at least at settledSpread.
	if got := pooledSpread(map[string]WorkloadMemory{"b": ws["b"]}); got != settledSpread {
		t.Errorf("alike pods: %v, want %v", got, settledSpread)
	}
}

// A pod not here yet is priced from the pods that came, not from a service
// that ran before the tuner came: a model server's 13.5 GiB peak among
// notebooks of 2-2.5 GiB does not make the next notebook 13.5 GiB.
func TestArrivalFromPodsThatCame(t *testing.T) {
	def := DefaultConfig()
	at := func(tm time.Time) map[string]uint64 {
		m := map[string]uint64{"ml/ollama/c": 13*GiB + GiB/2}
		for i, b := range []uint64{2 * GiB, 2*GiB + GiB/4, 2*GiB + GiB/2} {
			if tm.After(now.Add(-time.Duration(20-5*i) * time.Minute)) {
				m[fmt.Sprintf("class/nb-%d/c", i)] = b
			}
		}
		return m
	}
	o := onCard(4, card(48*GiB, 40*time.Minute, 4, at))
	o.Memory = remembered(def, o)
	_, o.Memory = Round(def, o)
	v := newGPUView(def, &o, o.GPUs[0], 0, 1, true)
	a, _ := v.arrival(v.latest)
	if a.mean > float64(3*GiB) || a.sd > float64(GiB) {
		t.Errorf("a pod not here yet priced at %s ± %s, want about the notebooks' 2-2.5 GiB", gibf(a.mean), gibf(a.sd))
	}
	if s := v.sizes.stranger(); s.sd < float64(2*GiB) {
		t.Errorf("the node's sizes, the server's among them, spread by %s: the test no longer shows the difference", gibf(s.sd))
	}
}

// Until three pods came, the services running since before the tuner came
// stand in for the sizes of a pod not here yet, but none above twice the
// largest pod that came, or, before any came, twice what a stranger
// waiting would be priced at: a 40 GiB model beside 2 GiB embedders priced
// the next pod at 2.0 ± 29.7 GiB, and an 80 GiB card with 34 GiB free held
// no spare replica for a batch job (issue21-80g-deadlock, in plugin mode).
func TestArrivalBeforePodsCame(t *testing.T) {
	def := DefaultConfig()
	services := map[string]uint64{"ml/llm/c": 40 * GiB, "ml/embed-0/c": 2 * GiB, "ml/embed-1/c": 2 * GiB}
	price := func(at func(time.Time) map[string]uint64) item {
		o := onCard(4, card(80*GiB, 40*time.Minute, 4, at))
		o.Memory = remembered(def, o)
		_, o.Memory = Round(def, o)
		v := newGPUView(def, &o, o.GPUs[0], 0, 1, true)
		a, _ := v.arrival(v.latest)
		return a
	}
	// An embedder that came 20 minutes in: one pod came.
	if a := price(besides(services, "ml/embed-2/c", 2*GiB, 20*time.Minute)); a.mean > float64(4*GiB) || a.sd > float64(3*GiB) {
		t.Errorf("after one 2 GiB pod came, a pod not here yet priced at %s ± %s, want the embedders' size, not the model's", gibf(a.mean), gibf(a.sd))
	}
	// No pod came: the services stand in, the model bounded at twice
	// what a stranger waiting would be priced at (the embedders' 2 GiB).
	if a := price(always(services)); a.mean > float64(3*GiB) || a.sd > float64(3*GiB) {
		t.Errorf("before any pod came, a pod not here yet priced at %s ± %s, want about the embedders' size, the model bounded", gibf(a.mean), gibf(a.sd))
	}
	// Two 10 GiB models with 4 GiB free on 24 GiB: a stranger would get
	// 2 GiB, the models stand in at 4 GiB each, and no spare is worth
	// its risk there (TestObjective).
	models := map[string]uint64{"ml/llm-a/c": 10 * GiB, "ml/llm-b/c": 10 * GiB}
	o := onCard(2, card(24*GiB, 40*time.Minute, 2, always(models)))
	o.Memory = remembered(def, o)
	_, o.Memory = Round(def, o)
	v := newGPUView(def, &o, o.GPUs[0], 0, 1, true)
	if a, _ := v.arrival(v.latest); a.mean < float64(3*GiB) {
		t.Errorf("beside two 10 GiB models, a pod not here yet priced at %s ± %s, want the models bounded at twice a stranger's 2 GiB", gibf(a.mean), gibf(a.sd))
	}
}

// Learning is bounded while another workload is being learnt too: of a
// burst of a workload never seen, one pod is let in and its siblings wait
// for it to show its size. Without that, a model server still in its
// first window let a 33-pod burst in at its own 0.8 GiB, 15 at once, and
// the card OOMed 71 times (held-out generated seed 66).
func TestLearningOnePodAtATime(t *testing.T) {
	def := DefaultConfig()
	// Two services since before the tuner came and a job of a workload
	// never seen, two minutes in, on 48 GiB.
	at := besides(map[string]uint64{"svc/a/c": 4 * GiB, "svc/b/c": 4 * GiB}, "batch/a-1/c", GiB, 2*time.Minute)
	o := onCard(3, card(48*GiB, 30*time.Minute, 3, at))
	o.ContainerWorkloads = map[string]string{"batch/a-1/c": "Job/batch/a"}
	for range 5 {
		o.Pending = append(o.Pending, PendingPod{Workload: "Job/batch/b", Replicas: 1, Since: now.Add(-time.Minute)})
	}
	d, _ := replay(def, o)
	if d.Replicas != 4 {
		t.Errorf("Round = %d %s, want 4: one pod of the burst let in\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
}

// The siblings queued behind the first pod of a workload never seen, which
// no price reaches yet, are taken in a departing job's handoff at what that
// first pod is priced to learn it, not at the node's largest sizes: priced
// at a 4 GiB model's size with a stranger's spread, the second of a burst
// of 1.2 GiB jobs, handed a crash-looping job's replica in the forecast,
// kept the first out of a 12 GiB card with 4.5 GiB free for over an hour
// (held-out generated seed 144).
func TestUnpricedSiblingInAHandoff(t *testing.T) {
	def := DefaultConfig()
	// A 4 GiB model and a 1 GiB web service since before the tuner came,
	// and a 2.5 GiB job of a short-lived workload 40 minutes in.
	at := besides(map[string]uint64{"svc/vllm/c": 4 * GiB, "svc/web/c": GiB}, "batch/looper-1/c", 5*GiB/2, 40*time.Minute)
	o := onCard(3, card(12*GiB, time.Hour, 3, at))
	o.ContainerWorkloads = map[string]string{"batch/looper-1/c": "Job/batch/looper"}
	o.Memory.Workloads = map[string]WorkloadMemory{"Job/batch/looper": job(5*GiB/2, 5*GiB/2)}
	for range 3 {
		o.Pending = append(o.Pending, PendingPod{Workload: "Job/batch/burst", Replicas: 1, Since: now.Add(-5 * time.Minute)})
	}
	d, _ := replay(def, o)
	if d.Replicas != 4 {
		t.Errorf("Round = %d %s, want 4: the burst's first pod let in\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
}

// A server that has held its size flat for a whole window is uncertain by
// what no record foresees at any size (allocator rounding, a CUDA
// context), not by a share of its size: vLLM at its default
// gpu_memory_utilization holds 43.2 GiB of a 48 GiB card to the byte, and
// 3% of it (1.3 GiB) put a 3.5% risk on every 1.2 GiB job beside it, so
// none started all day where one more replica started them all with no
// OOM. A server that moved within the window keeps the share.
func TestFlatServerSpread(t *testing.T) {
	def := DefaultConfig()
	vllm := uint64(43*GiB + GiB/5)
	round := func(server func(time.Time) uint64) Decision {
		at := func(tm time.Time) map[string]uint64 {
			return map[string]uint64{"llm/vllm/c": server(tm), "llm/reranker/c": GiB + GiB/5}
		}
		o := onCard(2, card(48*GiB, time.Hour, 2, at))
		o.Pending = []PendingPod{{Workload: "Job/batch/embed", Replicas: 1, Since: now.Add(-time.Minute)}}
		d, _ := replay(def, o)
		return d
	}
	if d := round(func(time.Time) uint64 { return vllm }); d.Replicas != 3 {
		t.Errorf("beside a flat 43.2 GiB server: Round = %d %s, want 3: the job let in\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
	moving := func(tm time.Time) uint64 {
		if tm.Equal(now.Add(-5 * time.Minute).Truncate(15 * time.Second)) {
			return 40 * GiB
		}
		return vllm
	}
	if d := round(moving); d.Replicas != 2 {
		t.Errorf("beside a server that fell to 40 GiB five minutes ago: Round = %d %s, want 2\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
}

// A pod of a workload never seen is priced to learn it at no less than
// the median of the pods that came here, once three came, however little
// room is left: at half the room left alone, a team's notebooks, each its
// own workload and each loading a 7-10 GiB model, let a seventh in at
// 2.8 GiB beside 42.5 GiB used of 48, and when a student loaded a second
// model the card OOMed 37 times (test/traces/unseen/jupyter-48g-team.yaml,
// now twice).
func TestLearnerNotBelowWhatComes(t *testing.T) {
	def := DefaultConfig()
	notebooks := map[string]uint64{"lab/nb-1/c": 8 * GiB, "lab/nb-2/c": 10 * GiB, "lab/nb-3/c": 7 * GiB, "lab/nb-4/c": 9 * GiB}
	at := func(tm time.Time) map[string]uint64 {
		m := map[string]uint64{"svc/embed/c": 8*GiB + GiB/2}
		if tm.After(now.Add(-3 * time.Hour)) { // no longer jobs (transientAge)
			maps.Copy(m, notebooks)
		}
		return m
	}
	room := func(left uint64) Decision {
		o := onCard(5, card(42*GiB+GiB/2+left, 4*time.Hour, 5, at))
		o.Pending = []PendingPod{{Workload: "Job/lab/nb-5", Replicas: 1, Since: now.Add(-time.Minute)}}
		d, _ := replay(def, o)
		return d
	}
	if d := room(5*GiB + GiB/2); d.Replicas != 5 { // 48 GiB
		t.Errorf("5.5 GiB left, notebooks of 7-10 GiB: Round = %d %s, want 5: no notebook let in\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
	if d := room(20 * GiB); d.Replicas != 6 {
		t.Errorf("20 GiB left: Round = %d %s, want 6: the notebook let in\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
}

// Strangers that came together after the tuner's first look, priced on no
// job the node has seen (the learner's price is its services' sizes), are
// let in a few at a time: a burst of anonymous cron jobs priced at the 0.8
// GiB of the services, 10% sure, was let in seven at once onto a 12 GiB
// card with 5.2 GiB held and OOMed 13 times (held-out generated seed 64).
// Once a job of the node has shown a size, the price is measured and the
// burst goes in as before.
func TestGuessedStrangersSpread(t *testing.T) {
	def := DefaultConfig()
	services := map[string]uint64{"svc/a/c": GiB / 2, "svc/b/c": GiB - GiB/4, "svc/c/c": 4 * GiB}
	burst := func(o Observation) Observation {
		for i := range 10 {
			o.Pending = append(o.Pending, PendingPod{Workload: fmt.Sprintf("Pod/cron/j-%d", i), Replicas: 1, Since: now.Add(-30 * time.Second)})
		}
		return o
	}
	o := burst(onCard(3, card(12*GiB, 40*time.Minute, 3, always(services))))
	d, _ := replay(def, o)
	if d.Replicas > 3+5 {
		t.Errorf("Round = %d %s, want at most 8: strangers priced on the services' sizes let in five at most (seven before)\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
	if d.Replicas <= 3 {
		t.Errorf("Round = %d %s, want a raise: 6.8 GiB is free\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
	// The same card where a 0.75 GiB job came and went 35 minutes ago: the
	// price is that job's size, measured, and the burst is let in as the
	// room backs it.
	var guessed int
	if guessed = d.Replicas; guessed >= 3+6 {
		return
	}
	o = burst(onCard(3, card(12*GiB, time.Hour, 3, func(tm time.Time) map[string]uint64 {
		m := maps.Clone(services)
		if tm.After(now.Add(-50*time.Minute)) && tm.Before(now.Add(-35*time.Minute)) {
			m["batch/x/c"] = GiB - GiB/4
		}
		return m
	})))
	if d, _ = replay(def, o); d.Replicas <= guessed {
		t.Errorf("Round = %d %s, want more than the %d of the guessed price: a job's size is a measure\nmessage: %s", d.Replicas, d.Reason, guessed, d.Message)
	}
}

// A departure's replica goes on whenever it comes; the ones after it are
// weighed by the chance that they come while the count stands.
func TestDeparting(t *testing.T) {
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	// Workloads not known: nothing says when they end, every departure is
	// certain, up to as many pods as leave.
	if got := departing([]time.Duration{-1, -1, -1}, 5*time.Minute, 4, 0); !slices.Equal(got, []float64{1, 1, 1, 0, 0}) {
		t.Errorf("departing(unknown ×3) = %v, want [1 1 1 0 0]", got)
	}
	// Jobs with an hour left each: the first goes on whenever it leaves;
	// each other leaves within 5 minutes with the chance 1/12.
	got := departing([]time.Duration{time.Hour, time.Hour, time.Hour}, 5*time.Minute, 4, 0)
	p := 1.0 / 12
	if want := 1 - (1-p)*(1-p); !near(got[0], 1) || !near(got[1], want) || !near(got[2], p*p) || !near(got[3], 0) {
		t.Errorf("departing(an hour left ×3) = %v, want [1 %.4f %.4f 0 0]", got, want, p*p)
	}
	// Pods alone whose workload's lifetime is not known, on a node where
	// pods leave at a measured rate: each leaves with its share of it.
	got = departing([]time.Duration{-1, -1, -1}, 5*time.Minute, 4, 1.0/600)
	q := 1 - math.Exp(-0.5)
	if want := 1 - (1-q)*(1-q); !near(got[0], 1) || !near(got[1], want) || !near(got[2], q*q) {
		t.Errorf("departing(unknown ×3, one pod in 600 s each) = %v, want [1 %.4f %.4f 0 0]", got, want, q*q)
	}
	// A job whose time is up leaves for certain beside the first.
	if got := departing([]time.Duration{time.Hour, 0, 2 * time.Minute}, 5*time.Minute, 4, 0); !near(got[1], 1) || !near(got[2], 5.0/60) {
		t.Errorf("departing(an hour, none and 2 minutes left) = %v, want [1 1 0.0833 0 0]", got)
	}
}

// A job past its first window that holds far less than its workload's pods
// reach is still loading, and is reserved at their size: a notebook loads
// its model minutes after its kernel starts, some after more than a window
// (held-out generated seed 81: reserved at its 2.2 GiB eleven minutes in,
// a raise let another pod in on that room and it grew to 9 GiB).
func TestLoadingPastItsWindow(t *testing.T) {
	def := DefaultConfig()
	reserved := func(bytes uint64, lifetime time.Duration) float64 {
		c := "class/nb-9/c"
		o := onCard(3, card(48*GiB, 30*time.Minute, 3, besides(map[string]uint64{"svc/a/c": 20 * GiB}, c, bytes, 11*time.Minute)))
		o.ContainerWorkloads = map[string]string{c: "Job/class/nb"}
		o.Memory = remembered(def, o)
		_, o.Memory = Round(def, o)
		w := job(7*GiB, 7*GiB+GiB/2, 8*GiB)
		w.Lifetime = lifetime
		o.Memory.Workloads["Job/class/nb"] = w
		v := newGPUView(def, &o, o.GPUs[0], 0, 1, true)
		return v.reservation(c, def.Window).mean
	}
	if r := reserved(2*GiB+GiB/5, 90*time.Minute); r < float64(7*GiB) {
		t.Errorf("a notebook at 2.2 GiB 11 minutes in, of pods of 7-8 GiB, reserved at %s, want its workload's 7.5 GiB", gibf(r))
	}
	if r := reserved(7*GiB, 90*time.Minute); r > float64(7*GiB+GiB/4) {
		t.Errorf("a notebook at 7 GiB reserved at %s, want its own size: it has loaded", gibf(r))
	}
	if r := reserved(2*GiB+GiB/5, 24*time.Hour); r > float64(3*GiB) {
		t.Errorf("a service's pod at 2.2 GiB reserved at %s, want its own size: a service grows along its record's trajectory", gibf(r))
	}
}

// A workload known only from pods still running (its first pod watched a
// window, none ended) is priced at what they showed ± 10% at least, and
// its siblings let in together share that error: a cron burst's first job
// at 6.2 GiB after its window, nine waiting beside 44.5 GiB on 80 GiB.
// Priced ± 3% each, independent, five went in at once; each grew to
// 7.5 GiB and the card OOMed after the raise (held-out generated seed 74).
func TestKnownFromRunningPods(t *testing.T) {
	def := DefaultConfig()
	services := map[string]uint64{"svc/a/c": 30 * GiB, "svc/b/c": 8*GiB + GiB/10}
	first := "cron/j-0/c"
	o := onCard(3, card(80*GiB, 40*time.Minute, 3, besides(services, first, 6*GiB+GiB/5, 12*time.Minute)))
	o.ContainerWorkloads = map[string]string{first: "Job/cron/j"}
	for i := range 9 {
		o.Pending = append(o.Pending, PendingPod{Workload: "Job/cron/j", Replicas: 1, Since: now.Add(-12 * time.Minute).Add(time.Duration(i) * time.Second)})
	}
	d, mem := replay(def, o)
	if w := mem.Workloads["Job/cron/j"]; !w.Known(def) || w.Pods != 0 {
		t.Fatalf("the burst's workload: known %v, %d pods ended; want known from its running pod alone", w.Known(def), w.Pods)
	}
	if d.Replicas > 3+4 {
		t.Errorf("Round = %d %s, want at most 7: five siblings at 6.2 GiB ± 10%%, sharing their error, may not fit the 35.5 GiB free\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
	if d.Replicas < 3+3 {
		t.Errorf("Round = %d %s, want a raise for three or four: they fit with room to spare\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
}

// A pod in its first window, of a workload whose pods run for more than two
// windows, is reserved at what the largest of its pods reached only while
// their spread is not measured (a model loading 20 GiB, seen once); once
// it is, the pod is one more draw of their sizes, their mean ± their
// spread, not their largest (held-out generated seed 63: a job of a
// workload of 3-11.5 GiB pods, at 5.2 GiB eight minutes in, was reserved
// at 11.5 GiB).
func TestYoungPodOfVariedWorkload(t *testing.T) {
	def := DefaultConfig()
	reservation := func(w WorkloadMemory, bytes uint64) item {
		c := "batch/mixed-33/c"
		o := onCard(3, card(48*GiB, 30*time.Minute, 3, besides(map[string]uint64{"svc/a/c": 10 * GiB}, c, bytes, 8*time.Minute)))
		o.ContainerWorkloads = map[string]string{c: "Job/batch/mixed"}
		o.Memory = remembered(def, o)
		_, o.Memory = Round(def, o)
		w.Lifetime = 47 * time.Minute
		o.Memory.Workloads["Job/batch/mixed"] = w
		v := newGPUView(def, &o, o.GPUs[0], 0, 1, true)
		return v.reservation(c, def.Window)
	}
	varied := job(3*GiB, 4*GiB, 5*GiB, 11*GiB+GiB/2)
	mean, sd := varied.MeanPeak, math.Sqrt(varied.M2/3)
	r := reservation(varied, 5*GiB+GiB/5)
	if math.Abs(r.mean-mean) > float64(GiB)/10 || math.Abs(r.sd-sd) > float64(GiB)/10 {
		t.Errorf("a 5.2 GiB pod 8 minutes in, of pods of 3-11.5 GiB, reserved at %s ± %s, want their mean %s ± their spread %s", gibf(r.mean), gibf(r.sd), gibf(mean), gibf(sd))
	}
	if r := reservation(varied, 9*GiB); r.mean < float64(9*GiB) {
		t.Errorf("a 9 GiB pod of the same workload reserved at %s, want at least what it holds", gibf(r.mean))
	}
	if r := reservation(job(20*GiB), 12*GiB); r.mean < float64(20*GiB) {
		t.Errorf("a model at 12 GiB 8 minutes in, of a workload seen once at 20 GiB, reserved at %s, want the 20 GiB its pod reached", gibf(r.mean))
	}
}

// A pod of a workload never seen, in its first window, is priced as a
// stranger (explorer) until it has shown its size: once it grew to it from
// under half and has held it for settleSpan, it is uncertain as one pod
// of a workload seen once, not by the spread of every size the node has
// seen. Priced at the node's ±8.7 GiB (thirty 2 GiB cron jobs and one
// 18.5 GiB daily job) for its whole first window, each anonymous cron job
// of a scheduled burst that had loaded 2 GiB and held it for five minutes
// kept the next out of 27 GiB free (generated seed 67). A pod still at
// its CUDA context keeps the stranger's spread: a notebook loads its
// model minutes in.
func TestLoadedStrangerShowsItsSize(t *testing.T) {
	def := DefaultConfig()
	reservation := func(at func(time.Time) uint64) item {
		c := "adhoc/cron-33/c"
		ss := card(48*GiB, 30*time.Minute, 3, func(tm time.Time) map[string]uint64 {
			m := map[string]uint64{"svc/a/c": 10 * GiB}
			if b := at(tm); b > 0 {
				m[c] = b
			}
			return m
		})
		o := onCard(3, ss)
		o.ContainerWorkloads = map[string]string{c: "Pod/adhoc/cron-33"}
		o.Memory = remembered(def, o)
		_, o.Memory = Round(def, o)
		o.Memory.Sizes, o.Memory.SizesAt, o.Memory.Restarts = nil, nil, nil
		for i := range 30 {
			o.Memory.Sizes = append(o.Memory.Sizes, 2*GiB-GiB/8+uint64(i%3)*GiB/8)
			o.Memory.SizesAt = append(o.Memory.SizesAt, now.Add(-time.Duration(30-i)*time.Minute))
		}
		o.Memory.Sizes = append(o.Memory.Sizes, 18*GiB+GiB/2)
		o.Memory.SizesAt = append(o.Memory.SizesAt, now.Add(-time.Minute))
		v := newGPUView(def, &o, o.GPUs[0], 0, 1, true)
		if !v.rankOK || v.rank.sd < float64(5*GiB) {
			t.Fatalf("the node's sizes price a stranger at %s ± %s (ranked %v), want a spread of several GiB", gibf(v.rank.mean), gibf(v.rank.sd), v.rankOK)
		}
		if w := v.obs.Memory.Workloads["Pod/adhoc/cron-33"]; w.Known(def) {
			t.Fatalf("the pod's workload is known, want it never seen before")
		}
		return v.reservation(c, def.Window)
	}
	from := func(age time.Duration, steps ...uint64) func(time.Time) uint64 {
		return func(tm time.Time) uint64 {
			if !tm.After(now.Add(-age)) {
				return 0
			}
			if tm.Before(now.Add(-age + 30*time.Second)) {
				return steps[0]
			}
			return steps[1]
		}
	}
	if r := reservation(from(6*time.Minute, GiB/2, 2*GiB)); r.mean < float64(2*GiB) || r.sd > 0.1*r.mean+1 {
		t.Errorf("a job that loaded 2 GiB 30 s in and held it for five and a half minutes reserved at %s ± %s, want 2 GiB ± at most 10%%", gibf(r.mean), gibf(r.sd))
	}
	if r := reservation(from(3*time.Minute, GiB/2, 2*GiB)); r.sd < float64(5*GiB) {
		t.Errorf("a job that loaded 2 GiB two and a half minutes ago reserved at %s ± %s, want a stranger's spread: it has not held it for %s", gibf(r.mean), gibf(r.sd), settleSpan)
	}
	if r := reservation(from(6*time.Minute, GiB/4, GiB/4+GiB/16)); r.sd < float64(5*GiB) {
		t.Errorf("a pod at its 0.3 GiB context for six minutes reserved at %s ± %s, want a stranger's spread: it has loaded nothing yet", gibf(r.mean), gibf(r.sd))
	}
}

// A raise's apply latency is not charged to the waiting pods it lets in:
// they wait it whenever the count is raised for them, so keeping the
// count spares them none of it. Charged, a 2.7% risk against a window's
// patience tipped from a raise in instant mode to a keep in plugin mode,
// every round, and family-48g-leaky's 15 pods never started in plugin
// (sim's TestCriterionPlugin). A change that lets nobody in still pays it.
func TestLatencyNotChargedToWaitingPods(t *testing.T) {
	plugin, err := ApplyCostOf(ModePlugin)
	if err != nil {
		t.Fatal(err)
	}
	cost := func(apply ApplyCost, c candidate) float64 {
		v := gpuView{cfg: DefaultConfig(), now: now, cur: 4, obs: &Observation{Apply: apply}}
		v.price(&c)
		return c.cost
	}
	letIn := candidate{n: 5, risk: 0.027, admitted: 1, saved: 600}
	if i, p := cost(ApplyCost{}, letIn), cost(plugin, letIn); i != p {
		t.Errorf("a raise letting a waiting pod in costs %.1f in instant mode, %.1f in plugin mode: want the same", i, p)
	}
	lower := candidate{n: 3}
	if i, p := cost(ApplyCost{}, lower), cost(plugin, lower); p != i+plugin.Latency.Seconds() {
		t.Errorf("a lowering costs %.1f in instant mode, %.1f in plugin mode: want the latency (%s) more", i, p, plugin.Latency)
	}
}

// An OOM risk reads as a percentage in decision messages, never in
// exponent form once it reaches 100% (a full card reported "OOM risk
// 1e+02%").
func TestPercent(t *testing.T) {
	for _, tc := range []struct {
		risk float64
		want string
	}{
		{0, "0%"}, {1.2e-56, "1.2e-54%"}, {0.00033, "0.033%"}, {0.027, "2.7%"}, {0.81, "81%"},
		{0.994, "99%"}, {0.9999, "100%"}, {1, "100%"}, {1.6, "160%"}, {4.044, "404%"},
	} {
		if got := percent(tc.risk); got != tc.want {
			t.Errorf("percent(%g) = %q, want %q", tc.risk, got, tc.want)
		}
	}
}

// A workload whose pods ended is known from them however short they ran:
// a burst of three 0.5 GiB jobs that ran three minutes each, half an hour
// ago, left its workload watched for less than a window. Not known, the
// next burst of ten was learnt again one pod at a time (generated seed
// 35's hourly bursts waited a round each time where static:15 had its
// replicas free).
func TestKnownFromEndedPods(t *testing.T) {
	def := DefaultConfig()
	jobs := []string{"cron/j-0/c", "cron/j-1/c", "cron/j-2/c"}
	o := onCard(4, card(12*GiB, 40*time.Minute, 4, func(tm time.Time) map[string]uint64 {
		m := map[string]uint64{"svc/a/c": 2 * GiB}
		if tm.After(now.Add(-30*time.Minute)) && tm.Before(now.Add(-27*time.Minute)) {
			for _, c := range jobs {
				m[c] = GiB / 2
			}
		}
		return m
	}))
	o.ContainerWorkloads = map[string]string{}
	for _, c := range jobs {
		o.ContainerWorkloads[c] = "Job/cron/j"
	}
	for i := range 10 {
		o.Pending = append(o.Pending, PendingPod{Workload: "Job/cron/j", Replicas: 1, Since: now.Add(-10 * time.Second).Add(time.Duration(i) * time.Millisecond)})
	}
	d, mem := replay(def, o)
	w := mem.Workloads["Job/cron/j"]
	if w.Seen >= def.Window || w.Pods != 3 {
		t.Fatalf("the burst's workload: watched %s, %d pods ended; want less than a window (%s) and 3", w.Seen, w.Pods, def.Window)
	}
	if !w.Known(def) {
		t.Errorf("a workload of three pods that ended is not known: its pods showed all they held")
	}
	if d.Replicas < 1+10 {
		t.Errorf("Round = %d %s, want at least 11: ten more 0.5 GiB jobs fit beside 2 GiB on 12 GiB\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
}

// A lowering locks the count for its settle time (no raise undoes it
// without an OOM), so the pods that come meanwhile wait it out: in the
// middle of a burst, seven cron jobs in the last 90 seconds beside a 7.5
// GiB server on 24 GiB, the three spares (a 0.11% risk) are kept for the
// jobs still coming; once the burst is 50 minutes old, spares go. Without
// the lock priced, both lower to 9.
func TestLoweringLockPricedInABurst(t *testing.T) {
	def := DefaultConfig()
	running := map[string]uint64{"web/server/c": 7*GiB + GiB/2}
	wls := map[string]string{}
	for i := range 7 {
		c := fmt.Sprintf("batch/hourly-%d/c", i)
		running[c], wls[c] = GiB+GiB*2/5, "CronJob/batch/hourly"
	}
	// ago is how long before now the last of the burst's seven jobs came
	// (one every 15 s).
	decide := func(ago time.Duration) Decision {
		o := onCard(11, card(24*GiB, 30*time.Minute, 11, always(running)))
		o.ContainerWorkloads = wls
		o.Memory.Workloads = map[string]WorkloadMemory{"CronJob/batch/hourly": job(GiB+GiB*2/5, GiB+GiB/2, GiB+GiB*3/10)}
		o.Memory = remembered(def, o)
		o.Memory.Arrivals = nil
		for i := range 7 {
			o.Memory.Arrivals = append(o.Memory.Arrivals, now.Add(-ago-time.Duration(6-i)*15*time.Second))
		}
		// Earlier hours' jobs, 1.4-2 GiB: the sizes a pod not here yet is
		// drawn from.
		for i := range 12 {
			o.Memory.Sizes = append(o.Memory.Sizes, []uint64{GiB + GiB*2/5, 2 * GiB, GiB + GiB/2}[i%3])
			o.Memory.SizesAt = append(o.Memory.SizesAt, now.Add(-2*time.Hour))
		}
		o.Memory.Base = 3 // the spares are the tuner's own bets
		d, _ := Round(def, o)
		return d
	}
	if d := decide(0); d.Replicas != 11 {
		t.Errorf("mid-burst: %d %s, want 11 kept for the jobs still coming\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
	if d := decide(50 * time.Minute); d.Replicas >= 11 {
		t.Errorf("50 minutes after the burst: %d %s, want a lowering\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
}

// beyond is E[(N - free)+] for N Poisson: all of N with no replica free,
// the mean less the free replicas when many come, nothing when none does.
func TestBeyond(t *testing.T) {
	for _, tc := range []struct {
		mu   float64
		free int
		want float64
	}{
		{0, 3, 0},
		{2, 0, 2},
		{2, 1, 1 + math.Exp(-2)},
		{0.5, 2, 0.5 - 2 + math.Exp(-0.5)*(2+1*0.5)},
		{40, 1, 39 + math.Exp(-40)},
	} {
		if got := beyond(tc.mu, tc.free); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("beyond(%v, %d) = %v, want %v", tc.mu, tc.free, got, tc.want)
		}
	}
}

// A sibling of a pod being learnt is priced at twice what that pod showed
// only while the pod may still grow: once it has held its size for
// settleSpan, the sibling is priced at that size. At twice it, a job that
// loaded 13 GiB in a minute and held it for eight priced its waiting
// sibling at 26 GiB; the count was lowered to keep the departing job's
// replica from it, and the sibling waited out the lowering's settle time
// where a static count let it in (issue 21's kind 4).
func TestSiblingOfASettledPod(t *testing.T) {
	def := DefaultConfig()
	models := map[string]uint64{"svc/m0/c": 15 * GiB, "svc/m1/c": 15 * GiB}
	// Two models since before the tuner came, on 48 GiB, and a job of a
	// workload never seen that started 9 minutes ago at 5 GiB and has held
	// 13 GiB since rose ago.
	mix := func(rose time.Duration) func(time.Time) map[string]uint64 {
		return func(tm time.Time) map[string]uint64 {
			m := maps.Clone(models)
			switch {
			case !tm.Before(now.Add(-rose)):
				m["batch/job-0/c"] = 13 * GiB
			case tm.After(now.Add(-9 * time.Minute)):
				m["batch/job-0/c"] = 5 * GiB
			}
			return m
		}
	}
	run := func(rose time.Duration) (Decision, demand) {
		o := onCard(3, card(48*GiB, 30*time.Minute, 3, mix(rose)))
		o.ContainerWorkloads = map[string]string{"batch/job-0/c": "Job/batch/job"}
		o.Memory.Base = 2 // the operator's count: the job's replica is the tuner's own
		o.Memory = remembered(def, o)
		o.Pending = []PendingPod{{Workload: "Job/batch/job", Replicas: 1, Since: now.Add(-15 * time.Second)}}
		d, mem := Round(def, o)
		o.Memory = mem
		v := newGPUView(def, &o, o.GPUs[0], 0, 1, true)
		return d, v.queue(v.latest)[0]
	}
	d, q := run(8 * time.Minute)
	if q.mean > float64(14*GiB) || q.mean < float64(13*GiB) {
		t.Errorf("settled for 8 minutes: the sibling priced at %s ± %s, want the 13 GiB its first pod holds", gibf(q.mean), gibf(q.sd))
	}
	if d.Replicas != 3 {
		t.Errorf("settled for 8 minutes: Round = %d %s, want 3 kept: the departing job's replica may go to its 13 GiB sibling\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
	if _, q := run(2 * time.Minute); q.mean < float64(26*GiB) {
		t.Errorf("grown 2 minutes ago: the sibling priced at %s, want twice the 13 GiB shown: it may grow again", gibf(q.mean))
	}
}

// A pod that has loaded inside its age's PeakByAge bucket is reserved at
// what it holds, not at that plus the growth the line drawn through the
// bucket still expects: an hourly burst's job loads its 1.6 GiB in its
// first 30 s, and 45 s in the line says 1.2 GiB, so 0.4 GiB more was
// reserved for each job (issue 21's hourly bursts: 3 GiB of a 16 GiB card
// held for growth that never came, and the burst waited for it). A pod
// still behind the line keeps the growth its workload's pods showed, one
// larger than any of its age keeps the line's growth on top, and so does
// a pod of a workload whose spread is not measured (one pod ended): that
// margin is what strangers loading late were let in on.
func TestLoadedWithinItsBucket(t *testing.T) {
	def := DefaultConfig()
	record := func(sizes ...uint64) WorkloadMemory {
		w := WorkloadMemory{Seen: 6 * time.Hour, LastSeen: now.Add(-time.Hour), Lifetime: 8 * time.Minute}
		for _, b := range sizes {
			w.PeakBytes = max(w.PeakBytes, b)
			w.atAge(0, b/4)
			w.atAge(30*time.Second, b)
			w.addPod(b)
		}
		return w
	}
	reserved := func(w WorkloadMemory, bytes uint64, age time.Duration) float64 {
		c := "batch/hourly-9/c"
		o := onCard(3, card(16*GiB, 20*time.Minute, 3, besides(map[string]uint64{"svc/server/c": 4 * GiB}, c, bytes, age)))
		o.ContainerWorkloads = map[string]string{c: "Job/batch/hourly"}
		o.Memory = remembered(def, o)
		_, o.Memory = Round(def, o)
		o.Memory.Workloads["Job/batch/hourly"] = w
		v := newGPUView(def, &o, o.GPUs[0], 0, 1, true)
		return v.reservation(c, def.Window).mean
	}
	w := record(GiB+GiB/2, GiB+6*GiB/10, GiB+4*GiB/10, GiB+GiB/2)
	peak := float64(w.PeakBytes)
	if r := reserved(w, GiB+6*GiB/10, 45*time.Second); r > 1.02*peak {
		t.Errorf("a job at its 1.6 GiB 45 s in, of pods that load 1.4-1.6 GiB in 30 s, reserved at %s, want %s: it has loaded", gibf(r), gibf(peak))
	}
	if r := reserved(w, GiB/2, 45*time.Second); r < 0.9*w.MeanPeak {
		t.Errorf("a job at 0.5 GiB 45 s in reserved at %s, want its workload's %s: it is still loading", gibf(r), gibf(w.MeanPeak))
	}
	if r := reserved(w, 2*GiB, 45*time.Second); r < float64(2*GiB)+float64(GiB)/4 {
		t.Errorf("a job at 2 GiB 45 s in, larger than any of its age, reserved at %s, want the line's growth on top of it", gibf(r))
	}
	if r := reserved(record(GiB+6*GiB/10), GiB+6*GiB/10, 45*time.Second); r < peak+float64(GiB)/4 {
		t.Errorf("a job at 1.6 GiB 45 s in, of a workload one 1.6 GiB pod of which ended, reserved at %s, want the line's growth on top: its spread is not measured", gibf(r))
	}
}

// A loop no count ends (hopelessLoops): a trainer that asks for 12 GiB
// beside three services that hold 12 GiB of 24 for good fails at every
// load whatever the count, so its OOMs hold nothing and it is reserved at
// what it holds; a known 2 GiB job that fits beside it is let in. Beside a
// job that will leave, the loop is not hopeless: the job's room is the
// trainer's, and the count keeps it.
func TestHopelessLoop(t *testing.T) {
	const trainer = "batch/ft-1/c"
	// restarting: the trainer shows nothing in the latest sample.
	node := func(stay map[string]uint64, leaving string, restarting bool) Observation {
		mix := func(tm time.Time) map[string]uint64 {
			m := maps.Clone(stay)
			if leaving != "" && tm.After(now.Add(-25*time.Minute)) {
				m[leaving] = 4 * GiB
			}
			if tm.After(now.Add(-20*time.Minute)) && !(restarting && !tm.Before(now)) {
				m[trainer] = 2 * GiB
			}
			return m
		}
		ss := card(24*GiB, 40*time.Minute, 4, mix)
		ss = with(ss, last(1), func(s *Sample) { s.ReplicasAllocated = 4 }) // a restarting pod keeps its replica
		for _, ago := range []time.Duration{8 * time.Minute, 5 * time.Minute, 2 * time.Minute} {
			ss = with(ss, func(_ int, s Sample) bool { return s.Time.Equal(now.Add(-ago)) }, func(s *Sample) {
				s.OOMEvents++
				s.OOMs = append(slices.Clone(s.OOMs), OOM{Container: trainer, Kind: OOMDevice})
			})
		}
		o := onCard(4, ss)
		o.ContainerWorkloads = map[string]string{trainer: "Job/batch/ft", "batch/etl-1/c": "Job/batch/etl"}
		o.Memory.Workloads = map[string]WorkloadMemory{"Job/batch/small": job(2 * GiB), "Job/batch/etl": job(4 * GiB)}
		o.Pending = []PendingPod{{Workload: "Job/batch/small", Replicas: 1, Since: now.Add(-time.Minute)}}
		return o
	}
	services := map[string]uint64{"svc/a/c": 4 * GiB, "svc/b/c": 4 * GiB, "svc/c/c": 4 * GiB}
	two := map[string]uint64{"svc/a/c": 4 * GiB, "svc/b/c": 4 * GiB}
	evict := DefaultConfig()
	evict.EvictCrashLoops = true
	tests := []struct {
		name     string
		cfg      Config
		obs      Observation
		replicas int
		reason   string
		reserved string // in the message, when set
		loops    int    // the trainer's, reported
	}{
		{"beside services only: the job is let in", DefaultConfig(), node(services, "", false), 5, ReasonSustainedHeadroom, "14.0 GiB reserved", 1},
		{"restarting, it is reserved at what it reached (and not reported: it shows nothing now)", DefaultConfig(), node(services, "", true), 5, ReasonSustainedHeadroom, "14.0 GiB reserved", 0},
		{"beside a job that leaves: its OOMs lower the count as before", DefaultConfig(), node(two, "batch/etl-1/c", false), 3, ReasonGPUOOM, "", 1},
		{"with eviction the loop is evicted either way", evict, node(services, "", false), 3, ReasonCrashLoop, "", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := replay(tc.cfg, tc.obs)
			roundIs(t, d, tc.replicas, tc.reason)
			if !strings.Contains(d.Message, tc.reserved) {
				t.Errorf("message %q does not say %q", d.Message, tc.reserved)
			}
			if len(d.CrashLoops) != tc.loops || tc.loops > 0 && d.CrashLoops[0].Container != trainer {
				t.Errorf("crash loops %+v, want %d of the trainer's", d.CrashLoops, tc.loops)
			}
		})
	}
}

// The node's record holds every GPU's containers; a loop is hopeless on
// the GPU whose window shows it, and nothing of it is reserved on another.
func TestHopelessLoopStaysOnItsGPU(t *testing.T) {
	const trainer = "batch/ft-1/c"
	services := map[string]uint64{"svc/a/c": 4 * GiB, "svc/b/c": 4 * GiB, "svc/c/c": 4 * GiB}
	ss := card(24*GiB, 40*time.Minute, 4, besides(services, trainer, 2*GiB, 20*time.Minute))
	for _, ago := range []time.Duration{8 * time.Minute, 5 * time.Minute, 2 * time.Minute} {
		ss = with(ss, func(_ int, s Sample) bool { return s.Time.Equal(now.Add(-ago)) }, func(s *Sample) {
			s.OOMEvents++
			s.OOMs = append(slices.Clone(s.OOMs), OOM{Container: trainer, Kind: OOMDevice})
		})
	}
	// As full as the trainer's card without it: its need would not fit there either.
	other := card(24*GiB, 40*time.Minute, 4, always(map[string]uint64{"svc/d/c": 12 * GiB}))
	o := onCard(4, ss)
	o.GPUs = append(o.GPUs, GPUObservation{UUID: "GPU-1", Samples: other})
	o.ContainerWorkloads = map[string]string{trainer: "Job/batch/ft"}
	cfg := DefaultConfig()
	o.Memory = remembered(cfg, o)
	if cm := o.Memory.Containers[trainer]; cm.OOMs < 2 {
		t.Fatalf("the trainer's record shows %d OOMs in a row, want a loop", cm.OOMs)
	}
	for i, want := range []int{1, 0} {
		v := newGPUView(cfg, &o, o.GPUs[i], 0, 1, true)
		if len(v.hopeless) != want {
			t.Errorf("%s: hopeless %v, want %d", o.GPUs[i].UUID, v.hopeless, want)
		}
		if i == 1 && v.latest.other != 0 {
			t.Errorf("%s reserves %s for a container it never showed", o.GPUs[i].UUID, gibf(v.latest.other))
		}
	}
}

// The round the last pod ends, its peak is still in the sample while the
// source counts no replica held: none are, and the forecast does not take
// the count for unknown and every replica for taken. Taken so, a queue's
// last job ending raised an idle 16 GiB card 4 -> 5 for "one spare", and
// five minutes later five spares were 91% to overflow it and the count fell
// to 3 under the next burst (test/traces/unseen/whisper-16g-queue.yaml).
// A source that counts no replicas at all (no PodResources) still has
// every replica taken by the pods it shows.
func TestLastPodEnds(t *testing.T) {
	def := DefaultConfig()
	// Jobs of 3.4 GiB, one after the other, each 12 minutes, on 16 GiB; the
	// last ends in the latest sample.
	at := func(tm time.Time) map[string]uint64 {
		m := map[string]uint64{}
		if k := int(now.Sub(tm) / (12 * time.Minute)); k < 4 && now.Sub(tm) > 0 {
			m[fmt.Sprintf("asr/whisper-%d/c", 4-k)] = 3*GiB + 2*GiB/5
		}
		return m
	}
	decide := func(counts bool) Decision {
		ss := card(16*GiB, time.Hour, 4, at)
		last := &ss[len(ss)-1]
		last.ContainerPeaks = map[string]uint64{"asr/whisper-4/c": 3*GiB + 2*GiB/5}
		last.MemoryUsedBytes, last.ReplicasAllocated = 0, 0
		if !counts {
			for i := range ss {
				ss[i].ReplicasAllocated = 0
			}
		}
		o := onCard(4, ss)
		o.LastChange = now.Add(-time.Hour)
		d, _ := replay(def, o)
		return d
	}
	if d := decide(true); d.Replicas != 4 {
		t.Errorf("the last job ended: %d %s, want 4 kept\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
	if d := decide(false); d.Replicas < 4 {
		t.Errorf("no replicas counted: %d %s, want no lowering below the pod shown\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
}

// A pod let in now, or handed a departing pod's replica, may itself leave
// while the count holds, and its replica goes on to the next waiting pod,
// whatever its size: a CI push's short unit tests take the replicas of the
// first to leave and leave in turn, and the model test queued behind them
// gets the third. Counting only the pods running now as leavers, a 24 GiB
// card with 21 GiB forecast after the raise took 3 -> 5 at a 0.24% risk and
// OOMed five minutes later (test/traces/unseen/ci-24g-push-bursts).
func TestHandoffChain(t *testing.T) {
	def := DefaultConfig()
	unit, model, integ := "Job/ci/gpu-unit", "Job/ci/gpu-model", "Job/ci/gpu-integration"
	// Three jobs started since the tuner came: two unit tests 90 s ago,
	// a model test 45 s ago.
	started := map[string]time.Duration{"ci/unit-a/c": 90 * time.Second, "ci/unit-b/c": 90 * time.Second, "ci/model-a/c": 45 * time.Second}
	sizes := map[string]uint64{"ci/unit-a/c": 2 * GiB, "ci/unit-b/c": GiB, "ci/model-a/c": 4*GiB + GiB/2}
	at := func(tm time.Time) map[string]uint64 {
		m := map[string]uint64{}
		for c, age := range started {
			if tm.After(now.Add(-age)) {
				m[c] = sizes[c]
			}
		}
		return m
	}
	lived := func(w WorkloadMemory, d time.Duration) WorkloadMemory { w.Lifetime = d; return w }
	o := onCard(3, card(24*GiB, time.Hour, 3, at))
	o.LastChange = now.Add(-time.Hour)
	o.ContainerWorkloads = map[string]string{"ci/unit-a/c": unit, "ci/unit-b/c": unit, "ci/model-a/c": model}
	o.Memory.Workloads = map[string]WorkloadMemory{
		unit:  lived(job(GiB, 3*GiB/2, 2*GiB, 3*GiB/2, GiB, 2*GiB), 5*time.Minute),
		model: lived(job(4*GiB+GiB/2, 4*GiB+GiB/2, 5*GiB, 4*GiB, 4*GiB+GiB/2), 12*time.Minute),
		integ: lived(job(9*GiB, 9*GiB, 9*GiB), 10*time.Minute),
	}
	// Queued behind the integration and a model test: two unit tests,
	// then another model test.
	for i, w := range []string{integ, model, unit, unit, model} {
		o.Pending = append(o.Pending, PendingPod{Workload: w, Replicas: 1, Since: now.Add(-time.Duration(60-i) * time.Second)})
	}
	d, _ := replay(def, o)
	if d.Replicas > 4 {
		t.Errorf("Round = %d %s, want at most 4: at 5 the unit tests' replicas go on to the model test behind them\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
}

// A replica a departing job hands, within the count's settle time, to a
// pod not here yet goes to one like those that came lately: a nightly
// 17 GiB fine-tune that ended twelve hours ago says little of who comes
// in the next minutes of a day of 2-3 GiB captioning jobs. Priced from
// every size the node kept (3.0 ± 10.9 GiB), the handoff kept a waiting
// 3 GiB job off a 24 GiB card with 5.2 GiB used, by one pod-second of
// cost, for 21 minutes
// (test/traces/unseen/nightly-train-24g-grow.yaml: 2,035 pod-seconds
// pending against static:5's none).
func TestHandoffToRecentArrivals(t *testing.T) {
	def := DefaultConfig()
	caption := "Job/media/caption-infer"
	services := map[string]uint64{"media/frigate/c": 6 * GiB / 5, "media/immich/c": 2 * GiB}
	o := onCard(3, card(24*GiB, time.Hour, 3, besides(services, "media/caption-a/c", 2*GiB, 34*time.Minute)))
	o.LastChange = now.Add(-2 * time.Hour)
	o.ContainerWorkloads = map[string]string{"media/caption-a/c": caption}
	o.Memory.Workloads = map[string]WorkloadMemory{caption: job(3*GiB, 2*GiB, 5*GiB/2, 3*GiB)}
	w := o.Memory.Workloads[caption]
	w.Lifetime = 55 * time.Minute
	o.Memory.Workloads[caption] = w
	o.Pending = []PendingPod{{Workload: caption, Replicas: 1, Since: now.Add(-7 * time.Second)}}
	decide := func(nightlyAgo time.Duration) Decision {
		o := o
		o.Memory = remembered(def, o)
		// Last night's fine-tune, then the day's captioning jobs.
		o.Memory.Sizes = []uint64{17 * GiB, 3 * GiB, 2 * GiB, 3 * GiB, 5 * GiB / 2}
		o.Memory.SizesAt = []time.Time{now.Add(-nightlyAgo), now.Add(-4 * time.Hour), now.Add(-3 * time.Hour), now.Add(-40 * time.Minute), now.Add(-20 * time.Minute)}
		o.Memory.Arrivals = append(o.Memory.Arrivals, now.Add(-80*time.Minute), now.Add(-38*time.Minute), now.Add(-34*time.Minute))
		d, _ := Round(def, o)
		return d
	}
	if d := decide(12 * time.Hour); d.Replicas != 4 {
		t.Errorf("the fine-tune 12 h gone: %d %s, want 4, the caption job let in\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
	if d := decide(time.Hour); d.Replicas != 3 {
		t.Errorf("the fine-tune an hour gone: %d %s, want 3 kept: the next pod may be one like it\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
}

// A workload being learnt whose oldest pod has held its size for
// settleSpan prices its siblings at that size, though a younger pod of it
// is still within its own first minutes: the younger one follows the path
// the oldest took. A Whisper queue's third job was priced at twice the
// 3.4 GiB its first had held for five minutes, because the second had
// reached 3.4 GiB three minutes before, and waited for the first to end
// (test/traces/unseen/whisper-16g-queue). A younger pod past the oldest
// shows the size is not steady: twice what was shown, as before.
func TestSiblingsOfASettledFirstPod(t *testing.T) {
	def := DefaultConfig()
	loads := func(since time.Duration, size uint64) func(time.Time) (uint64, bool) {
		return func(tm time.Time) (uint64, bool) {
			switch {
			case tm.Before(now.Add(-since)):
				return 0, false
			case tm.Before(now.Add(-since + 30*time.Second)):
				return 800 << 20, true
			}
			return size, true
		}
	}
	run := func(second uint64, waiting bool) (Decision, gpuView) {
		first, younger := loads(9*time.Minute, 3400<<20), loads(4*time.Minute, second)
		o := onCard(2, card(16*GiB, 30*time.Minute, 2, func(tm time.Time) map[string]uint64 {
			m := map[string]uint64{}
			if b, ok := first(tm); ok {
				m["q/w-1/c"] = b
			}
			if b, ok := younger(tm); ok {
				m["q/w-2/c"] = b
			}
			return m
		}))
		o.ContainerWorkloads = map[string]string{"q/w-1/c": "Job/q/w", "q/w-2/c": "Job/q/w"}
		o.Memory.Base = 2
		o.Memory = remembered(def, o)
		if waiting {
			o.Pending = []PendingPod{{Workload: "Job/q/w", Replicas: 1, Since: now.Add(-10 * time.Second)}}
		}
		d, mem := Round(def, o)
		o.Memory = mem
		return d, newGPUView(def, &o, o.GPUs[0], 0, 1, true)
	}
	d, v := run(3400<<20, true)
	if q := v.queue(v.latest)[0]; q.mean > float64(3500<<20) {
		t.Errorf("oldest pod settled: the sibling priced at %s ± %s, want the 3.4 GiB it holds", gibf(q.mean), gibf(q.sd))
	}
	roundIs(t, d, 3, ReasonSustainedHeadroom)
	if a, _ := v.arrival(v.latest); a.mean >= float64(2*3400<<20) {
		t.Errorf("oldest pod settled: a pod not here yet priced at %s, want less than twice the 3.4 GiB shown", gibf(a.mean))
	}
	d, v = run(4400<<20, true)
	if q := v.queue(v.latest)[0]; q.mean < float64(2*4400<<20) {
		t.Errorf("a younger pod past the oldest: the sibling priced at %s, want twice the 4.4 GiB shown", gibf(q.mean))
	}
	if d.Replicas != 2 {
		t.Errorf("a younger pod past the oldest: Round = %d %s, want 2 kept\nmessage: %s", d.Replicas, d.Reason, d.Message)
	}
	if a, _ := v.arrival(v.latest); a.mean < float64(2*4400<<20) {
		t.Errorf("a younger pod past the oldest: a pod not here yet priced at %s, want twice the 4.4 GiB shown", gibf(a.mean))
	}
}

// A pod that came since the last sample, beside a free replica, is the
// scheduler's to place, while a lowering reaches the node only after its
// apply latency: the count is not lowered under it on a guess. vLLM holds
// 43.2 GiB of 48 to the byte and a reranker 1.2 GiB; the third replica, a
// spare, is wanted by a 3.5 GiB layout job that came five seconds ago (a
// 45% risk at 3). Lowered in that round with no latency, the job headed the queue
// all day and the small jobs behind it never started
// (test/traces/unseen/vllm-48g-reserved.yaml, instant). A pod that has
// waited beside a free replica for ten minutes is not the scheduler's
// turn: the count is lowered under it, as before.
func TestPodThatCameForAFreeReplica(t *testing.T) {
	def := DefaultConfig()
	decide := func(waited time.Duration) Decision {
		o := onCard(3, card(48*GiB, 30*time.Minute, 3, always(map[string]uint64{
			"llm/vllm/c": 43*GiB + GiB/5, "llm/rerank/c": GiB + GiB/5})))
		o.Memory = remembered(def, o)
		o.Memory.Workloads["Job/docs/layout"] = job(3*GiB + GiB/2)
		o.Memory.Base = 2 // the spare is the tuner's own bet
		o.Pending = []PendingPod{{Workload: "Job/docs/layout", Replicas: 1, Since: now.Add(-waited)}}
		d, _ := Round(def, o)
		return d
	}
	roundIs(t, decide(5*time.Second), 3, ReasonFreeReplicas)
	roundIs(t, decide(10*time.Minute), 2, ReasonUnbackedReplicas)
}

package policy

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const GiB = uint64(1) << 30

var now = time.Date(2026, 1, 24, 12, 0, 0, 0, time.UTC)

// The seed homelab's four services on one 48 GiB RTX A6000.
var (
	a6000        = uint64(51527024640)
	servicePeaks = map[string]uint64{
		"media/yolo/yolo": 6 * GiB, "media/rife/rife": 8 * GiB,
		"media/esrgan/esrgan": 6 * GiB, "media/ffmpeg/ffmpeg": GiB / 2,
	}
	servicesUsed = 20*GiB + GiB/2
)

// sampleFn returns the sample taken at time t, i steps of 15 s after the
// first one.
type sampleFn func(i int, t time.Time) Sample

// steady is a GPU whose numbers never move.
func steady(used uint64, alloc, advertised int, peaks map[string]uint64) sampleFn {
	return func(_ int, t time.Time) Sample {
		return Sample{Time: t, MemoryTotalBytes: a6000, MemoryUsedBytes: used, ContainerPeaks: peaks,
			ReplicasAdvertised: advertised, ReplicasAllocated: alloc}
	}
}

// history samples f every 15 s from now-span to now, both included.
func history(span time.Duration, f sampleFn) []Sample {
	var ss []Sample
	for i, t := 0, now.Add(-span); !t.After(now); i, t = i+1, t.Add(15*time.Second) {
		ss = append(ss, f(i, t))
	}
	return ss
}

// with changes the samples for which pick is true.
func with(ss []Sample, pick func(i int, s Sample) bool, change func(*Sample)) []Sample {
	out := make([]Sample, len(ss))
	copy(out, ss)
	for i := range out {
		if pick(i, out[i]) {
			change(&out[i])
		}
	}
	return out
}

func last(n int) func(int, Sample) bool {
	return func(i int, s Sample) bool { return s.Time.After(now.Add(-time.Duration(n) * 15 * time.Second)) }
}

func node(cur int, lastChange time.Time, ss []Sample) Observation {
	return Observation{Node: "polydev-desktop", Now: now, CurrentReplicas: cur, LastChange: lastChange,
		GPUs: []GPUObservation{{UUID: "GPU-a6000", Samples: ss}}}
}

// waiting adds n pending pods of n workloads never seen to o.
func waiting(n int, o Observation) Observation {
	for i := range n {
		o.Pending = append(o.Pending, PendingPod{Workload: fmt.Sprintf("new-%d", i), Replicas: 1})
	}
	return o
}

func TestDecide(t *testing.T) {
	def := DefaultConfig()
	cfg := func(change func(*Config)) Config { c := DefaultConfig(); change(&c); return c }
	roomy := history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks))
	pressured := history(10*time.Minute, steady(uint64(0.96*float64(a6000)), 6, 6, servicePeaks))
	// oomAt is an OOM on a full GPU: 46 of 48 GiB in use leaves less free
	// than the 8 GiB footprint.
	oomAt := func(alloc int) func(*Sample) {
		return func(s *Sample) { s.OOMEvents, s.ReplicasAllocated, s.MemoryUsedBytes = 1, alloc, 46*GiB }
	}
	// oomOf is an OOM whose source says its kind and container.
	oomOf := func(alloc int, used uint64, ooms ...OOM) func(*Sample) {
		return func(s *Sample) {
			s.OOMEvents, s.OOMs, s.ReplicasAllocated, s.MemoryUsedBytes = len(ooms), ooms, alloc, used
		}
	}
	// everyMinute picks a sample a minute, a crash loop's rhythm.
	everyMinute := func(i int, _ Sample) bool { return i%4 == 1 }
	hungry := map[string]uint64{"a/big/c": 20 * GiB, "a/big2/c": 20 * GiB, "a/s1/c": 2 * GiB, "a/s2/c": 2 * GiB, "a/s3/c": 2 * GiB, "a/s4/c": 2 * GiB}

	tests := []struct {
		name      string
		cfg       Config
		obs       Observation
		replicas  int
		reason    string
		direction string
	}{
		{"raise after sustained headroom", def, node(4, time.Time{}, roomy), 5, ReasonSustainedHeadroom, DirectionUp},
		{"a spare long after the last change", def, node(4, now.Add(-def.Cooldown), roomy), 5, ReasonSustainedHeadroom, DirectionUp},
		{"raise is bounded by maxStepUp", cfg(func(c *Config) { c.MaxStepUp = 2 }),
			waiting(4, node(2, time.Time{}, history(10*time.Minute, steady(8*GiB, 2, 2, map[string]uint64{"a": 4 * GiB, "b": 4 * GiB})))),
			4, ReasonSustainedHeadroom, DirectionUp},
		{"a raise adds no more replicas than pods wait for", def,
			waiting(2, node(2, time.Time{}, history(10*time.Minute, steady(8*GiB, 2, 2, map[string]uint64{"a": 4 * GiB, "b": 4 * GiB})))),
			4, ReasonSustainedHeadroom, DirectionUp},
		{"running pods are measured, only new pods are priced at the largest pod running", cfg(func(c *Config) { c.MaxStepUp = 4 }),
			// 48 - 20.5 GiB used takes two more strangers at 8 GiB, not a
			// third, though 48 / 8 = 6: strangers let in together are one
			// kind of job, their uncertainties (10% each) add up, and three
			// would leave 3.5 GiB against 1.9 x 2.4 GiB
			waiting(4, node(4, time.Time{}, roomy)), 6, ReasonSustainedHeadroom, DirectionUp},
		{"memory no container accounts for is reserved at the most it held in the window", cfg(func(c *Config) { c.MaxStepUp = 4 }),
			// 38 GiB outside the pods at one sample: 48 - 4 - 38 GiB
			// leaves room for two 2 GiB pods, not three
			waiting(4, node(2, time.Time{}, with(history(10*time.Minute, steady(4*GiB, 2, 2, map[string]uint64{"a": 2 * GiB, "b": 2 * GiB})),
				func(i int, _ Sample) bool { return i == 7 }, func(s *Sample) { s.MemoryUsedBytes = 42 * GiB }))),
			4, ReasonSustainedHeadroom, DirectionUp},
		{"no change within a sample of the last one", def, node(4, now.Add(-10*time.Second), roomy), 4, ReasonCooldown, DirectionNone},
		{"insufficient history: window half covered", def,
			// the waiting stranger would fit beside the young services
			// even at 8 GiB each
			waiting(1, node(4, time.Time{}, history(5*time.Minute, steady(servicesUsed, 4, 4, servicePeaks)))), 4, ReasonInsufficientHistory, DirectionNone},
		{"insufficient history: a gap of three intervals", def,
			node(4, time.Time{}, append(append([]Sample{}, roomy[:10]...), roomy[13:]...)), 4, ReasonInsufficientHistory, DirectionNone},
		{"insufficient history: stale samples", def,
			node(4, time.Time{}, roomy[:len(roomy)-3]), 4, ReasonInsufficientHistory, DirectionNone},
		{"one lost scrape is tolerated", def,
			node(4, time.Time{}, append(append([]Sample{}, roomy[:10]...), roomy[11:]...)), 5, ReasonSustainedHeadroom, DirectionUp},
		{"no raise while the change is not advertised yet", def,
			node(5, time.Time{}, roomy), 5, ReasonAwaitingApply, DirectionNone},
		{"no raise without a footprint", def,
			node(4, time.Time{}, history(10*time.Minute, steady(GiB, 4, 4, nil))), 4, ReasonNoWorkload, DirectionNone},
		{"no raise when the largest pod would not fit", def,
			// 43.2 GiB target - 30 GiB used < 18 GiB
			node(2, time.Time{}, history(10*time.Minute, steady(30*GiB, 2, 2, map[string]uint64{"train": 18 * GiB, "ffmpeg": GiB}))),
			2, ReasonInsufficientHeadroom, DirectionNone},
		{"no raise into free replicas", def,
			node(5, time.Time{}, history(10*time.Minute, steady(servicesUsed, 4, 5, servicePeaks))), 5, ReasonFreeReplicas, DirectionNone},
		{"pods above a lowered count that fit again win their replicas back, and room for the next", def,
			node(5, time.Time{}, history(10*time.Minute, steady(servicesUsed, 6, 5, servicePeaks))), 7, ReasonSustainedHeadroom, DirectionUp},
		{"no raise when memory outside the pods took the room once in the window", def,
			// 19.5 GiB outside the pods: 40 GiB reserved leaves no 8 GiB spare
			node(4, time.Time{}, with(roomy, func(i int, _ Sample) bool { return i == 20 }, func(s *Sample) { s.MemoryUsedBytes = 40 * GiB })),
			4, ReasonInsufficientHeadroom, DirectionNone},
		{"no raise while an OOM is in the window", def,
			// the device was full at the OOM, and a sixth pod has gone since:
			// nothing else would hold the spare back
			node(4, time.Time{}, with(roomy, func(i int, _ Sample) bool { return i == 2 },
				oomOf(5, servicesUsed, OOM{Container: "media/rife/rife", Kind: OOMDevice}))), 4, ReasonRecentOOM, DirectionNone},
		{"an OOM older than the window is forgotten", def,
			node(4, time.Time{}, append([]Sample{{Time: now.Add(-11 * time.Minute), MemoryTotalBytes: a6000, OOMEvents: 3, ReplicasAllocated: 2}}, roomy...)),
			5, ReasonSustainedHeadroom, DirectionUp},
		{"lower at once on an OOM", def,
			node(6, now.Add(-time.Minute), with(roomy, last(1), oomAt(6))), 5, ReasonGPUOOM, DirectionDown},
		{"lower on an OOM below a count that was already lowered", def,
			node(8, now.Add(-time.Minute), with(roomy, last(1), oomAt(5))), 4, ReasonGPUOOM, DirectionDown},
		{"the same crashing mix does not ratchet the count down", def,
			node(5, now.Add(-time.Minute), with(roomy, last(8), oomAt(6))), 5, ReasonRecentOOM, DirectionNone},
		{"a new OOM at a smaller mix lowers further", def,
			node(5, now.Add(-time.Minute), with(with(roomy, last(8), oomAt(6)), last(1), oomAt(4))), 3, ReasonGPUOOM, DirectionDown},
		{"an OOM with an unknown allocation lowers the current count by one", def,
			node(6, time.Time{}, with(roomy, last(1), oomAt(0))), 5, ReasonGPUOOM, DirectionDown},
		{"an OOM never lowers below minReplicas", cfg(func(c *Config) { c.MinReplicas = 2 }),
			node(3, time.Time{}, with(roomy, last(1), oomAt(2))), 2, ReasonGPUOOM, DirectionDown},
		{"an OOM may make the GPU exclusive", def,
			node(2, time.Time{}, with(roomy, last(1), oomAt(2))), 1, ReasonGPUOOM, DirectionDown},
		{"an OOM is not held back by a recent change", def,
			node(6, now.Add(-10*time.Second), with(roomy, last(1), oomAt(6))), 5, ReasonGPUOOM, DirectionDown},
		{"sustained pressure with every replica taken holds: a lowering stops no running pod", def,
			node(6, time.Time{}, pressured), 6, ReasonInsufficientHeadroom, DirectionNone},
		{"free replicas under pressure are withdrawn down to the pods holding replicas", def,
			node(8, time.Time{}, with(pressured, func(int, Sample) bool { return true }, func(s *Sample) { s.ReplicasAdvertised, s.ReplicasAllocated = 8, 4 })),
			4, ReasonUnbackedReplicas, DirectionDown},
		{"an apply in flight under pressure names the pressure", def,
			node(5, now.Add(-time.Hour), pressured), 5, ReasonOngoingPressure, DirectionNone},
		{"pressure shorter than pressureWindow is not sustained", def,
			node(4, time.Time{}, history(10*time.Minute, func(i int, t time.Time) Sample {
				s := steady(servicesUsed, 4, 4, servicePeaks)(i, t)
				if t.After(now.Add(-def.PressureWindow + 15*time.Second)) {
					s.MemoryUsedBytes = uint64(0.97 * float64(a6000))
				}
				return s
			})), 4, ReasonInsufficientHeadroom, DirectionNone},
		{"above maxReplicas", cfg(func(c *Config) { c.MaxReplicas = 8 }),
			node(10, time.Time{}, history(10*time.Minute, steady(servicesUsed, 10, 10, servicePeaks))), 8, ReasonAboveMaximum, DirectionDown},
		{"free replicas nobody waits for are given up but for one spare", def,
			// one spare serves the next pod as well as six would, at a
			// sixth of the risk
			node(10, time.Time{}, history(10*time.Minute, steady(servicesUsed, 4, 10, servicePeaks))), 5, ReasonUnbackedReplicas, DirectionDown},
		{"free replicas left by pods that ended are given up at once, whatever they were idle for", def,
			node(10, time.Time{}, with(history(10*time.Minute, steady(servicesUsed, 4, 10, servicePeaks)),
				func(i int, _ Sample) bool { return i < 20 }, func(s *Sample) { s.ReplicasAllocated = 10 })),
			5, ReasonUnbackedReplicas, DirectionDown},
		{"a replica a waiting pod would take is given up when the memory left cannot back it", def,
			// 40.5 GiB used with 5 allocated: 7.5 GiB left, the stranger in
			// the queue is priced at the 20 GiB fine-tune. The services
			// (no record says they are jobs) hand no replica on, so the
			// count stops at the pods holding replicas.
			waiting(1, node(6, now.Add(-time.Minute), history(10*time.Minute, steady(40*GiB+GiB/2, 5, 6, withPeak(servicePeaks, "ml/lora/train", 20*GiB))))),
			5, ReasonUnbackedReplicas, DirectionDown},
		{"pods waiting are raised for as far as the memory backs them, whatever the last change", def,
			// 48 - 28 GiB backs two strangers of 8 GiB, not three
			waiting(3, node(5, now.Add(-time.Minute), history(10*time.Minute, steady(28*GiB, 5, 5, withPeak(servicePeaks, "ml/esrgan/up", 7*GiB))))),
			7, ReasonSustainedHeadroom, DirectionUp},
		{"a full GPU with a pod waiting holds: a lowering stops no running pod, and services hand no replica on", def,
			waiting(1, node(6, now.Add(-time.Minute), history(10*time.Minute, steady(44*GiB, 6, 6, withPeak(servicePeaks, "ml/lora/train", 18*GiB))))),
			6, ReasonInsufficientHeadroom, DirectionNone},
		{"a free replica beyond those the queue takes is kept while pods wait", def,
			// two free, one pod waiting and backed (6 GiB of 22.7 left)
			waiting(1, node(6, now.Add(-time.Minute), history(10*time.Minute, steady(servicesUsed, 4, 6, servicePeaks)))),
			6, ReasonFreeReplicas, DirectionNone},
		{"OOM below maxReplicas names the OOM", def, node(10, time.Time{}, with(roomy, last(1), oomAt(7))), 6, ReasonGPUOOM, DirectionDown},
		{"below minReplicas", cfg(func(c *Config) { c.MinReplicas = 3 }), node(2, time.Time{}, nil), 3, ReasonBelowMinimum, DirectionUp},
		{"no GPUs", def, Observation{Node: "cpu-only", Now: now, CurrentReplicas: 4}, 4, ReasonNoGPUs, DirectionNone},

		// Proportionate lowering (issue 9).
		{"an OOM with 3 of 48 GiB in use is not a full GPU: no lowering, no hold", def,
			node(4, time.Time{}, with(history(10*time.Minute, steady(3*GiB, 4, 4, map[string]uint64{"a/p/c": 2 * GiB})), last(1),
				oomOf(4, 3*GiB, OOM{Container: "a/p/c"}))), 5, ReasonSustainedHeadroom, DirectionUp},
		{"an OOM raised by a per-process cap does not lower, even on a full GPU", def,
			// held by the 46 GiB in use, as any sample would be, not by the OOM
			node(4, now.Add(-time.Hour), with(roomy, last(1), oomOf(4, 46*GiB, OOM{Container: "media/rife/rife", Kind: OOMCap}))),
			4, ReasonInsufficientHeadroom, DirectionNone},
		{"an NVENC session failure is no memory OOM", def,
			node(4, now.Add(-time.Hour), with(roomy, last(1), oomOf(4, 46*GiB, OOM{Container: "media/ffmpeg/ffmpeg", Kind: OOMEncoderSession}))),
			4, ReasonInsufficientHeadroom, DirectionNone},
		{"an OOM the source calls a full device lowers whatever the figures", def,
			node(4, now.Add(-time.Hour), with(roomy, last(1), oomOf(4, 10*GiB, OOM{Container: "media/rife/rife", Kind: OOMDevice}))),
			3, ReasonGPUOOM, DirectionDown},
		{"a lone pod's OOM neither lowers nor holds a raise back", def,
			node(1, now.Add(-time.Hour), with(history(10*time.Minute, steady(4*GiB, 1, 1, map[string]uint64{"a/p/c": 4 * GiB})), everyMinute,
				oomOf(1, 4*GiB, OOM{Container: "a/p/c", Kind: OOMDevice}))), 2, ReasonSustainedHeadroom, DirectionUp},
		{"a crash loop is one incident and lowers once", def,
			node(3, now.Add(-time.Minute), with(roomy, everyMinute, oomOf(4, 46*GiB, OOM{Container: "media/rife/rife"}))),
			3, ReasonRecentOOM, DirectionNone},
		{"lowering goes to the count the measured footprints fit, not one step", def,
			// 20+20+2 = 42 GiB fit 43.2 GiB, a fourth pod does not
			node(6, now.Add(-time.Hour), with(history(10*time.Minute, steady(30*GiB, 6, 6, hungry)), last(1), oomAt(6))),
			3, ReasonGPUOOM, DirectionDown},
		{"lowering never goes below what the OOM proves when the footprints fit", def,
			node(6, now.Add(-time.Hour), with(roomy, last(1), oomAt(6))), 5, ReasonGPUOOM, DirectionDown},
		{"a renamed config's floor of 2 holds against an OOM", def,
			func() Observation {
				o := node(2, now.Add(-time.Hour), with(roomy, last(1), oomAt(2)))
				o.Floor = 2
				return o
			}(), 2, ReasonRecentOOM, DirectionNone},
		{"a floor above the count raises to it", def,
			func() Observation { o := node(1, time.Time{}, roomy); o.Floor = 2; return o }(), 2, ReasonBelowMinimum, DirectionUp},
		{"a pending pod asking for 2 with 1 free is demand", def,
			func() Observation {
				o := node(4, time.Time{}, history(10*time.Minute, steady(servicesUsed, 3, 4, servicePeaks)))
				o.Pending = []PendingPod{{Workload: "train", Replicas: 2}}
				return o
			}(), 5, ReasonSustainedHeadroom, DirectionUp},
		{"a pending pod that fits the free replicas is no demand", def,
			func() Observation {
				o := node(4, time.Time{}, history(10*time.Minute, steady(servicesUsed, 3, 4, servicePeaks)))
				o.Pending = []PendingPod{{Workload: "train", Replicas: 1}}
				return o
			}(), 4, ReasonFreeReplicas, DirectionNone},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			d := Decide(tc.cfg, tc.obs)
			if d.Replicas != tc.replicas || d.Reason != tc.reason || d.Direction != tc.direction {
				t.Errorf("Decide = %d %s %q, want %d %s %q\nmessage: %s",
					d.Replicas, d.Reason, d.Direction, tc.replicas, tc.reason, tc.direction, d.Message)
			}
			if d.Message == "" {
				t.Error("empty message")
			}
		})
	}
}

func TestDecideFootprintAndMessage(t *testing.T) {
	d := Decide(DefaultConfig(), node(4, time.Time{}, history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks))))
	if d.FootprintBytes != 8*GiB {
		t.Errorf("footprint = %d, want the largest container peak %d", d.FootprintBytes, 8*GiB)
	}
	for _, want := range []string{"GPU-a6000", "20.5 GiB of 48.0 GiB used with 4 allocated", "1 spare", "4 -> 5"} {
		if !strings.Contains(d.Message, want) {
			t.Errorf("message %q lacks %q", d.Message, want)
		}
	}
	// A container still running is priced at its peak in the window, seen
	// once 9 minutes ago: one more 18 GiB pod fits beside 20.5 GiB (and
	// the trainer, at 2 GiB now, may go back to its 18), two would not.
	ss := history(10*time.Minute, steady(servicesUsed+2*GiB, 5, 5, withPeak(servicePeaks, "batch/train/train", 2*GiB)))
	ss[4].ContainerPeaks = withPeak(servicePeaks, "batch/train/train", 18*GiB)
	if d := Decide(DefaultConfig(), node(5, time.Time{}, ss)); d.FootprintBytes != 18*GiB || d.Reason != ReasonInsufficientHeadroom {
		t.Errorf("got footprint %d, %d replicas %s, want 18 GiB and no raise (%s)", d.FootprintBytes, d.Replicas, d.Reason, d.Message)
	}
	// A container gone sets no footprint; but the node saw its size, so a
	// spare's pod is priced uncertain by it (the 90th percentile of 0.5-18
	// GiB): a 1% chance of an OOM is worth more than a spare saves.
	ss = history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks))
	ss[4].ContainerPeaks, ss[4].MemoryUsedBytes = map[string]uint64{"batch/train/train": 18 * GiB}, 18*GiB
	if d := Decide(DefaultConfig(), node(4, time.Time{}, ss)); d.FootprintBytes != 8*GiB || d.Replicas != 4 || d.Reason != ReasonInsufficientHeadroom {
		t.Errorf("got footprint %d, %d replicas %s, want 8 GiB and a hold at 4 (%s)", d.FootprintBytes, d.Replicas, d.Reason, d.Message)
	}
}

// Alternating pressure and headroom, sample by sample, must neither lower
// (pressure is not sustained) nor raise (headroom is not sustained), round
// after round.
func TestDecideFlappingInputDoesNotOscillate(t *testing.T) {
	cfg := DefaultConfig()
	tight := uint64(0.97 * float64(a6000))
	var ss []Sample
	cur, lastChange, changes := 4, time.Time{}, 0
	start := now.Add(-2 * time.Hour)
	for i := 0; i < 8*60*4; i++ { // 8 hours of 15 s rounds
		at := start.Add(time.Duration(i) * 15 * time.Second)
		used := servicesUsed
		if i%2 == 1 {
			used = tight
		}
		ss = append(ss, Sample{Time: at, MemoryTotalBytes: a6000, MemoryUsedBytes: used, ContainerPeaks: servicePeaks,
			ReplicasAdvertised: cur, ReplicasAllocated: 4})
		ss = within(ss, at.Add(-cfg.Window), at)
		d := Decide(cfg, Observation{Node: "n", Now: at, CurrentReplicas: cur, LastChange: lastChange,
			GPUs: []GPUObservation{{UUID: "GPU-0", Samples: ss}}})
		if d.Replicas != cur {
			changes++
			cur, lastChange = d.Replicas, at
			t.Logf("round %d: %s %s", i, d.Reason, d.Message)
		}
	}
	if changes != 0 || cur != 4 {
		t.Errorf("%d changes, ended at %d replicas; want 0 changes at 4", changes, cur)
	}
}

func TestDecideTightestGPUHoldsTheNode(t *testing.T) {
	roomy := history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks))
	tight := history(10*time.Minute, steady(40*GiB, 4, 4, servicePeaks))
	gpus := []GPUObservation{{UUID: "GPU-0", Samples: roomy}, {UUID: "GPU-1", Samples: tight}, {UUID: "GPU-2", Samples: roomy}}
	obs := Observation{Node: "n", Now: now, CurrentReplicas: 4, GPUs: gpus}
	d := Decide(DefaultConfig(), obs)
	if d.Replicas != 4 || d.Reason != ReasonInsufficientHeadroom || d.GPU != "GPU-1" || !strings.HasPrefix(d.Message, "GPU-1: ") {
		t.Errorf("got %+v, want GPU-1 holding at 4 for InsufficientHeadroom", d)
	}
	// Without the tight GPU the same node is raised.
	obs.GPUs = []GPUObservation{gpus[0], gpus[2]}
	if d := Decide(DefaultConfig(), obs); d.Replicas != 5 {
		t.Errorf("without the tight GPU got %d (%s), want 5", d.Replicas, d.Reason)
	}
	// One GPU's OOM lowers the node even though the others have room.
	obs.GPUs = []GPUObservation{gpus[0], {UUID: "GPU-3", Samples: with(roomy, last(1), func(s *Sample) { s.OOMEvents, s.MemoryUsedBytes = 2, 46*GiB })}}
	if d := Decide(DefaultConfig(), obs); d.Replicas != 3 || d.Reason != ReasonGPUOOM || d.GPU != "GPU-3" {
		t.Errorf("with an OOM on GPU-3 got %+v, want 3 GPUOOM GPU-3", d)
	}
}

// A spare is priced from the node's sizes, not each GPU's own: a raise
// adds a replica on every GPU, and GPU-1's may go to a pod like the 20 GiB
// trainer on GPU-0 (beside two idle notebooks that hold replicas and no
// memory). Alone, GPU-1's three 10 GiB pods price a stranger at 10 GiB, and
// 40 of 48 GiB is safe; with the trainer among the node's sizes, a spare
// on GPU-1 has a 15% chance of an OOM, and a pod like it one of 100%.
// GPU-1's own decision is checked: GPU-0 keeps its count as well, and a
// tie names the lower UUID in the node's answer.
func TestDecideSparePricedFromTheNodesSizes(t *testing.T) {
	gpu0 := history(10*time.Minute, steady(20*GiB, 3, 3, map[string]uint64{"a/train/c": 20 * GiB}))
	gpu1 := history(10*time.Minute, steady(30*GiB, 3, 3, map[string]uint64{"a/yolo/c": 10 * GiB, "a/esrgan/c": 10 * GiB, "a/rife/c": 10 * GiB}))
	obs := Observation{Node: "n", Now: now, CurrentReplicas: 3, GPUs: []GPUObservation{{UUID: "GPU-0", Samples: gpu0}, {UUID: "GPU-1", Samples: gpu1}}}
	cfg := DefaultConfig()
	if d := decideGPU(cfg, obs, obs.GPUs[1], 20*GiB); d.Replicas != 3 || d.Reason != ReasonInsufficientHeadroom {
		t.Errorf("GPU-1 beside the trainer's GPU: got %d %s, want a hold at 3 (%s)", d.Replicas, d.Reason, d.Message)
	}
	alone := Observation{Node: "n", Now: now, CurrentReplicas: 3, GPUs: obs.GPUs[1:]}
	if d := decideGPU(cfg, alone, obs.GPUs[1], 10*GiB); d.Replicas != 4 {
		t.Errorf("GPU-1 alone on its node: got %d %s, want a raise to 4, its spare priced from its own 10 GiB pods (%s)", d.Replicas, d.Reason, d.Message)
	}
	if d := Decide(cfg, obs); d.Replicas != 3 {
		t.Errorf("the node: got %d %s on %s, want a hold at 3 (%s)", d.Replicas, d.Reason, d.GPU, d.Message)
	}
}

// At the ceiling the hold names the ceiling: the spare the objective
// would take is refused by maxReplicas, not by the memory.
func TestDecideAtMaximumNamesTheCeiling(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxReplicas = 4
	roomy := history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks))
	if d := Decide(cfg, node(4, time.Time{}, roomy)); d.Replicas != 4 || d.Reason != ReasonAtMaximum {
		t.Errorf("at maxReplicas: got %d %s, want a hold at 4 for AtMaximum (%s)", d.Replicas, d.Reason, d.Message)
	}
	cfg.MinReplicas, cfg.MaxReplicas = 1, 1
	lone := history(10*time.Minute, steady(4*GiB, 1, 1, map[string]uint64{"a": 4 * GiB}))
	if d := Decide(cfg, node(1, time.Time{}, lone)); d.Replicas != 1 || d.Reason != ReasonAtMaximum {
		t.Errorf("min = max = 1: got %d %s, want exclusive to stay exclusive for AtMaximum (%s)", d.Replicas, d.Reason, d.Message)
	}
}

// A sample whose allocation is unknown (0, with containers running: a
// source without the kubelet's pod resources) says nothing about free
// replicas: the count is not lowered on it.
func TestDecideUnknownAllocationLowersNothing(t *testing.T) {
	pressured := with(history(10*time.Minute, steady(uint64(0.96*float64(a6000)), 6, 6, servicePeaks)),
		func(int, Sample) bool { return true }, func(s *Sample) { s.ReplicasAllocated = 0 })
	if d := Decide(DefaultConfig(), node(6, time.Time{}, pressured)); d.Replicas != 6 {
		t.Errorf("under pressure: got %d %s, want 6 (%s)", d.Replicas, d.Reason, d.Message)
	}
	roomy := with(history(10*time.Minute, steady(servicesUsed, 6, 6, servicePeaks)),
		func(int, Sample) bool { return true }, func(s *Sample) { s.ReplicasAllocated = 0 })
	if d := Decide(DefaultConfig(), node(6, time.Time{}, roomy)); d.Replicas < 6 {
		t.Errorf("with room: got %d %s, want no lowering (%s)", d.Replicas, d.Reason, d.Message)
	}
}

// A GPU the config leaves exclusive (devices) advertises 1 while the node
// has 4: it must not hold the node in AwaitingApply, and its OOM says
// nothing about the shared GPUs.
func TestDecideExclusiveGPUIsNotJudged(t *testing.T) {
	shared := history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks))
	excl := history(10*time.Minute, steady(46*GiB, 1, 1, map[string]uint64{"a/train/c": 8 * GiB}))
	excl = with(excl, last(1), func(s *Sample) { s.OOMEvents = 1 })
	obs := Observation{Node: "n", Now: now, CurrentReplicas: 4, GPUs: []GPUObservation{
		{UUID: "GPU-0", Samples: shared}, {UUID: "GPU-1", Exclusive: true, Samples: excl}}}
	if d := Decide(DefaultConfig(), obs); d.Replicas != 5 || d.GPU != "GPU-0" {
		t.Errorf("got %d %s on %s; want the shared GPU-0 to raise to 5 (%s)", d.Replicas, d.Reason, d.GPU, d.Message)
	}
	obs.GPUs = obs.GPUs[1:]
	if d := Decide(DefaultConfig(), obs); d.Replicas != 4 || d.Reason != ReasonNoGPUs {
		t.Errorf("only an exclusive GPU: got %d %s, want a NoGPUs hold at 4", d.Replicas, d.Reason)
	}
}

func TestDecideCrashLoopMessageCountsOneIncident(t *testing.T) {
	ss := with(history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks)), func(i int, _ Sample) bool { return i%4 == 1 },
		func(s *Sample) {
			s.OOMEvents, s.MemoryUsedBytes = 1, 46*GiB
			s.OOMs = []OOM{{Container: "media/rife/rife"}}
		})
	d := Decide(DefaultConfig(), node(4, now.Add(-time.Hour), ss))
	if d.Replicas != 3 || !strings.Contains(d.Message, "1 GPU OOM incident(s)") {
		t.Errorf("got %d: %s; want 3 for one incident", d.Replicas, d.Message)
	}
}

func TestDecidePerNodeIndependence(t *testing.T) {
	cfg := DefaultConfig()
	roomy := node(4, time.Time{}, history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks)))
	crashed := node(6, time.Time{}, with(history(10*time.Minute, steady(servicesUsed, 6, 6, servicePeaks)), last(1),
		func(s *Sample) { s.OOMEvents, s.MemoryUsedBytes = 1, 46*GiB }))
	roomy.Node, crashed.Node = "node-a", "node-b"

	alone := Decide(cfg, roomy)
	b := Decide(cfg, crashed)
	after := Decide(cfg, roomy)
	if alone.Replicas != 5 || b.Replicas != 5 || b.Direction != DirectionDown || alone.Direction != DirectionUp {
		t.Errorf("node-a %d %s, node-b %d %s; want node-a up to 5, node-b down to 5", alone.Replicas, alone.Direction, b.Replicas, b.Direction)
	}
	if diff := cmp.Diff(alone, after); diff != "" {
		t.Errorf("node-a's decision changed after deciding node-b (-before +after):\n%s", diff)
	}
}

func TestDecideIsDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var gpus []GPUObservation
	for g := range 8 {
		used := uint64(10+rng.IntN(30)) * GiB
		gpus = append(gpus, GPUObservation{UUID: fmt.Sprintf("GPU-%d", g), Samples: history(10*time.Minute,
			steady(used, 4, 4, map[string]uint64{"a": uint64(1+rng.IntN(8)) * GiB, "b": uint64(1+rng.IntN(8)) * GiB}))})
	}
	obs := Observation{Node: "n", Now: now, CurrentReplicas: 4, GPUs: gpus}
	first := Decide(DefaultConfig(), obs)
	for range 20 {
		shuffled := append([]GPUObservation{}, gpus...)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		obs.GPUs = shuffled
		if diff := cmp.Diff(first, Decide(DefaultConfig(), obs)); diff != "" {
			t.Fatalf("decision depends on GPU order (-first +now):\n%s", diff)
		}
	}
}

// BenchmarkDecideRound is one decision round of a 100-node cluster with 8
// GPUs per node, each carrying a 10-minute window of 15 s samples.
func BenchmarkDecideRound(b *testing.B) {
	cfg := DefaultConfig()
	nodes := make([]Observation, 100)
	for n := range nodes {
		gpus := make([]GPUObservation, 8)
		for g := range gpus {
			peaks := map[string]uint64{}
			for c := range 6 {
				peaks[fmt.Sprintf("ns/pod-%d-%d/c", g, c)] = uint64(1+(n+g+c)%7) * GiB
			}
			gpus[g] = GPUObservation{UUID: fmt.Sprintf("GPU-%d-%d", n, g),
				Samples: history(10*time.Minute, steady(uint64(10+(n*g)%30)*GiB, 6, 6, peaks))}
		}
		nodes[n] = Observation{Node: fmt.Sprintf("node-%d", n), Now: now, CurrentReplicas: 6, GPUs: gpus}
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, obs := range nodes {
			Decide(cfg, obs)
		}
	}
}

// withPeak is peaks with one more container.
func withPeak(peaks map[string]uint64, c string, p uint64) map[string]uint64 {
	out := map[string]uint64{c: p}
	for k, v := range peaks {
		out[k] = v
	}
	return out
}

package sim

import (
	"math"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// applyModes are the modes `simulate --apply-mode` takes.
var applyModes = []string{policy.ModeInstant, policy.ModePlugin, policy.ModeRestart, policy.ModeConfigManager}

// applyTrace is the shipped trace the apply-mode tests replay: a night
// burst of small jobs on a 12 GiB card, through which the tuner changes
// the count dozens of times, so that each mode's charge is a sum over many
// changes, some of them while the queue waits.
const applyTrace = "family-12g-night-burst.yaml"

// TestApplyModes replays one shipped trace under each apply mode
// (`simulate --apply-mode`): every change is charged its mode's latency and
// blackout, once, and a slower apply must not let a raise cause an OOM,
// since the count a raise asked for arrives later, not larger.
func TestApplyModes(t *testing.T) {
	tr := mustRead(t, applyTrace)
	for _, mode := range applyModes {
		t.Run(mode, func(t *testing.T) {
			cost, err := policy.ApplyCostOf(mode)
			if err != nil {
				t.Fatal(err)
			}
			got, err := RunWith(tr, Tuner{Config: policy.DefaultConfig()}, Options{Apply: cost})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d changes (%d reversals), %d OOM events (%d after a raise), %.0f pod-s pending, %.0f s latency, %.0f s blackout",
				mode, got.ReplicaChanges, got.Reversals, got.OOMEvents, got.RaiseOOMEvents, got.PodSecondsPending, got.ApplyLatencySeconds, got.BlackoutSeconds)
			if got.ReplicaChanges == 0 {
				t.Fatalf("the tuner made no change on %s: the charges are not tested (pick a trace it changes on)", applyTrace)
			}
			if got.ApplyMode != mode {
				t.Errorf("applyMode %q, want %q", got.ApplyMode, mode)
			}
			if want := float64(got.ReplicaChanges) * cost.Latency.Seconds(); !near(got.ApplyLatencySeconds, want) {
				t.Errorf("applyLatencySeconds %.1f, want %d changes x %s = %.1f", got.ApplyLatencySeconds, got.ReplicaChanges, cost.Latency, want)
			}
			if want := float64(got.ReplicaChanges) * cost.Blackout.Seconds(); !near(got.BlackoutSeconds, want) {
				t.Errorf("blackoutSeconds %.1f, want %d changes x %s = %.1f", got.BlackoutSeconds, got.ReplicaChanges, cost.Blackout, want)
			}
			if got.RaiseOOMEvents > 0 {
				t.Errorf("%d of %d OOM events came after a raise", got.RaiseOOMEvents, got.OOMEvents)
			}
		})
	}
}

// TestApplyModesStatic checks that a count that never changes is charged
// nothing in any mode: the charge is per change, not per round.
func TestApplyModesStatic(t *testing.T) {
	tr := mustRead(t, applyTrace)
	want := mustRun(t, tr, Static{Replicas: 3})
	for _, mode := range applyModes {
		cost, err := policy.ApplyCostOf(mode)
		if err != nil {
			t.Fatal(err)
		}
		got, err := RunWith(tr, Static{Replicas: 3}, Options{Apply: cost})
		if err != nil {
			t.Fatal(err)
		}
		if got.ApplyLatencySeconds != 0 || got.BlackoutSeconds != 0 || got.PodSecondsPending != want.PodSecondsPending || got.OOMEvents != want.OOMEvents {
			t.Errorf("%s: static:3 charged %.0f s latency, %.0f s blackout, %.0f pod-s pending, %d OOMs; want none and %.0f, %d as instant",
				mode, got.ApplyLatencySeconds, got.BlackoutSeconds, got.PodSecondsPending, got.OOMEvents, want.PodSecondsPending, want.OOMEvents)
		}
	}
}

// raiseAt is a policy that holds from until at, then asks for to.
type raiseAt struct {
	from, to int
	at       time.Duration
}

func (p raiseAt) Name() string         { return "raise-at" }
func (p raiseAt) Start(int) int        { return p.from }
func (raiseAt) Tick() time.Duration    { return 15 * time.Second }
func (raiseAt) History() time.Duration { return 0 }
func (p raiseAt) Decide(obs policy.Observation) policy.Decision {
	if obs.Now.Sub(Epoch) >= p.at {
		return policy.Decision{Replicas: p.to, Reason: "Scripted"}
	}
	return policy.Decision{Replicas: p.from, Reason: "Scripted"}
}

// TestApplyBlackout checks when a change takes effect and what the node
// admits meanwhile: a raise from 2 to 3 at 60s, a pod running, and two
// pods arriving at 65s, while the change is on its way. With a free
// replica in the old count, the first of them starts at once unless the
// mode restarts the device plugin (blackout); the second needs the third
// replica, which no mode gives before its latency.
func TestApplyBlackout(t *testing.T) {
	tr := &Trace{MemoryTotalBytes: 8 * gib, InitialReplicas: 2, Duration: 10 * time.Minute, Pods: []Pod{
		{Name: "a", Workload: "a", Arrive: 0, Run: time.Hour, Memory: []MemoryStep{{At: 0, Bytes: gib}}},
		{Name: "b", Workload: "b", Arrive: 65 * time.Second, Run: time.Hour, Memory: []MemoryStep{{At: 0, Bytes: gib}}},
		{Name: "c", Workload: "c", Arrive: 65 * time.Second, Run: time.Hour, Memory: []MemoryStep{{At: 0, Bytes: gib}}},
	}}
	for _, mode := range applyModes {
		t.Run(mode, func(t *testing.T) {
			cost, err := policy.ApplyCostOf(mode)
			if err != nil {
				t.Fatal(err)
			}
			got, err := RunWith(tr, raiseAt{from: 2, to: 3, at: time.Minute}, Options{Apply: cost})
			if err != nil {
				t.Fatal(err)
			}
			effect := time.Minute + cost.Latency
			wantB := time.Duration(0) // a free replica in the old count
			if cost.Blackout > 0 && 65*time.Second >= effect-cost.Blackout {
				wantB = effect - 65*time.Second
			}
			wantC := max(effect-65*time.Second, 0)
			if got.waits[1] != wantB || got.waits[2] != wantC {
				t.Errorf("waits b %s, c %s; want %s, %s (change at 1m0s, in effect at %s, blackout %s)", got.waits[1], got.waits[2], wantB, wantC, effect, cost.Blackout)
			}
			if got.ReplicaChanges != 1 || !near(got.ApplyLatencySeconds, cost.Latency.Seconds()) || !near(got.BlackoutSeconds, cost.Blackout.Seconds()) {
				t.Errorf("%d changes, %.1f s latency, %.1f s blackout; want 1, %.1f, %.1f", got.ReplicaChanges, got.ApplyLatencySeconds, got.BlackoutSeconds,
					cost.Latency.Seconds(), cost.Blackout.Seconds())
			}
		})
	}
}

// near compares sums of seconds, which float addition may round.
func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

// TestWarmupCoversTheFirstChangesLatency: the pending time left out of the
// criterion's comparison (PodSecondsPendingWarmup) is the first window and
// the mode's latency after it, in which no change of the tuner could have
// taken effect. Pod b cannot start beside a (20 of 24 GiB) until a ends
// after an hour, so its warmup is exactly that span.
func TestWarmupCoversTheFirstChangesLatency(t *testing.T) {
	tr := mustParse(t, `
gpu: {memoryTotalBytes: 25769803776}
initialReplicas: 1
duration: 2h
pods:
  - {name: a, arrive: 0s, run: 1h, memory: [[0s, 21474836480]]}
  - {name: b, arrive: 0s, run: 30m, memory: [[0s, 8589934592]]}
`)
	cfg := policy.DefaultConfig()
	for _, mode := range applyModes {
		cost, err := policy.ApplyCostOf(mode)
		if err != nil {
			t.Fatal(err)
		}
		got := mustRunIn(t, tr, Tuner{Config: cfg}, mode)
		if got.PodSecondsPending < time.Hour.Seconds() {
			t.Fatalf("%s: b waited %.0f s, want the hour a runs (the test needs a wait past the warmup)", mode, got.PodSecondsPending)
		}
		if want := (cfg.Window + cost.Latency).Seconds(); got.PodSecondsPendingWarmup != want {
			t.Errorf("%s: %.0f pod-s of warmup, want %.0f (a window and the latency)", mode, got.PodSecondsPendingWarmup, want)
		}
	}
}

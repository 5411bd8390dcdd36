package sim

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

const GiB = uint64(1) << 30

func tracePath(name string) string { return filepath.Join("..", "..", "..", "test", "traces", name) }

func mustRead(t *testing.T, name string) *Trace {
	t.Helper()
	tr, err := ReadTrace(tracePath(name))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func mustRun(t *testing.T, tr *Trace, p Policy) *Result {
	t.Helper()
	r, err := Run(tr, p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// mustRunIn replays tr under p with the named apply mode's cost.
func mustRunIn(t *testing.T, tr *Trace, p Policy, mode string) *Result {
	t.Helper()
	cost, err := policy.ApplyCostOf(mode)
	if err != nil {
		t.Fatal(err)
	}
	r, err := RunWith(tr, p, Options{Apply: cost})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustParse(t *testing.T, yaml string) *Trace {
	t.Helper()
	tr, err := ParseTrace("inline.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// fastTuner judges over 30 s, so that tiny.yaml's five minutes see raises.
func fastTuner() Tuner {
	cfg := policy.DefaultConfig()
	cfg.Window, cfg.Cooldown, cfg.PressureWindow, cfg.MaxReplicas = 30*time.Second, 30*time.Second, 30*time.Second, 4
	cfg.Settle = 30 * time.Second
	return Tuner{Config: cfg}
}

// tiny.yaml worked out by hand (10 GiB GPU; a: 4 GiB then 7 GiB 50 s into
// each attempt, run 100 s, arrives 0s; b: 4 GiB, 100 s, arrives 10s; c: 1
// GiB, 60 s, arrives 20s):
//
// static:1: a 0-100 s alone (7 GiB fits); b waits 10-100 s, runs 100-200 s;
// c waits 20-200 s, runs 200-260 s. Pending 90+180 = 270, running 260.
//
// static:2: a at 0, b at 10 s, c waits. At 50 s a grows: 4+7 > 10, a is
// killed (lost: 50 s of work + 30 s restart wait), restarts at 80 s with 4 GiB
// and ends at 100 s on its run clock; c gets a's replica at 100 s (waited
// 80 s). Running 100+100+60.
//
// static:3: c starts at 20 s (9 GiB used); a's growth at 50 s fails the same
// way; c ends at 80 s before a restarts. Nobody waits.
//
// tuner (30 s window and cooldown, sampled every 15 s): the OOM at 50 s is
// first sampled at 60 s with 2 allocated: 2 -> 1, and a's record keeps that
// it OOMed with 2 pods. At 105 s the OOM has left the window, but a, which
// ended at 100 s, is still in the latest sample (its peak since 90 s): the
// container that OOMed at 2 is not given 2 (RememberedOOM). b ends at 110 s
// and c takes its replica (waited 90 s). At 120 s b is still in the sample
// (its peak since 105 s). From 135 s only c is left, every replica taken
// and nobody waiting: a spare would go to a pod of the node's sizes, which
// are a (what its OOM asked for), b (4 GiB) and c (1 GiB), so widely
// spread that the policy puts an 18% chance of an OOM on that pod beside
// c, worth more than the round a spare would save. The count stays at 1
// to the end.
func TestRunTinyByHand(t *testing.T) {
	tr := mustRead(t, "tiny.yaml")
	type change struct {
		At       float64
		From, To int
		Reason   string
	}
	tests := []struct {
		policy                  Policy
		ooms                    int
		pending, running, lost  float64
		maxPending              float64
		final, minRepl, maxRepl int
		changes                 []change
	}{
		{Static{1}, 0, 270, 260, 0, 180, 1, 1, 1, nil},
		{Static{2}, 1, 80, 260, 80, 80, 2, 2, 2, nil},
		{Static{3}, 1, 0, 260, 80, 0, 3, 3, 3, nil},
		{fastTuner(), 1, 90, 260, 80, 90, 1, 1, 2, []change{
			{60, 2, 1, policy.ReasonGPUOOM},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.policy.Name(), func(t *testing.T) {
			r := mustRun(t, tr, tc.policy)
			var changes []change
			for _, c := range r.Changes {
				changes = append(changes, change{c.Seconds, c.From, c.To, c.Reason})
			}
			got := []any{r.OOMEvents, r.PodSecondsPending, r.PodSecondsRunning, r.PodSecondsLost, r.MaxPendingSeconds,
				r.FinalReplicas, r.MinReplicas, r.MaxReplicas, r.ReplicaChanges, r.PodsCompleted, r.PodsNeverStarted, r.Pods}
			want := []any{tc.ooms, tc.pending, tc.running, tc.lost, tc.maxPending,
				tc.final, tc.minRepl, tc.maxRepl, len(tc.changes), 3, 0, 3}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("[oom pending running lost maxPending final min max changes completed neverStarted pods] (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.changes, changes, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("changes (-want +got):\n%s", diff)
			}
		})
	}
}

// The shipped traces, with the outcomes they exist to show.
func TestRunShippedTraces(t *testing.T) {
	tuner := Tuner{Config: policy.DefaultConfig()}
	run := func(name string, p Policy) *Result { return mustRun(t, mustRead(t, name), p) }

	t.Run("seed-a6000", func(t *testing.T) {
		tu, s2, s4, s8 := run("seed-a6000.yaml", tuner), run("seed-a6000.yaml", Static{2}), run("seed-a6000.yaml", Static{4}), run("seed-a6000.yaml", Static{8})
		for _, r := range []*Result{tu, s2, s4, s8} {
			t.Logf("%-8s oom=%-4d pending=%-8.0f running=%-7.0f lost=%-6.0f changes=%d completed=%d neverStarted=%d",
				r.Policy, r.OOMEvents, r.PodSecondsPending, r.PodSecondsRunning, r.PodSecondsLost, r.ReplicaChanges, r.PodsCompleted, r.PodsNeverStarted)
		}
		if s8.OOMEvents == 0 || tu.OOMEvents*10 > s8.OOMEvents {
			t.Errorf("tuner has %d OOM events, static:8 %d: want static:8 to crash and the tuner at least ten times less", tu.OOMEvents, s8.OOMEvents)
		}
		if s2.OOMEvents != 0 || s4.OOMEvents != 0 {
			t.Errorf("static:2 and static:4 crashed (%d, %d OOM events): the services fit together", s2.OOMEvents, s4.OOMEvents)
		}
		// The note's replicas: 4 is taken by the four services all day.
		if s4.PodsNeverStarted < 30 || s2.PodsNeverStarted <= s4.PodsNeverStarted {
			t.Errorf("static:4 left %d pods never started, static:2 %d: want the batch jobs starved", s4.PodsNeverStarted, s2.PodsNeverStarted)
		}
		// static:5 is the largest count that crashes nothing; 6 crashes the
		// fine-tunes. The tuner may not crash them either, and must serve
		// more than 5 does.
		s5 := run("seed-a6000.yaml", Static{5})
		if tu.OOMEvents != 0 || tu.PodsNeverStarted >= s5.PodsNeverStarted || tu.PodSecondsPending >= s5.PodSecondsPending {
			t.Errorf("tuner: %d OOM events, %d pods never started, %.0f pod-s pending; static:5 %d, %d, %.0f: want no OOM and fewer waiting",
				tu.OOMEvents, tu.PodsNeverStarted, tu.PodSecondsPending, s5.OOMEvents, s5.PodsNeverStarted, s5.PodSecondsPending)
		}
		// Every job of the day started under the rules before issue 21; the
		// objective prices a stranger (a job's first run: the day's keyless
		// jobs are keyed by their names' stems) at the largest pod that
		// came and went within PeakHold, and the fine-tunes of the
		// afternoon keep the evening's strangers waiting
		// (docs/tuner-policy.md says so). It still waits far less than the
		// operator's count.
		if 2*tu.PodSecondsPending > s4.PodSecondsPending {
			t.Errorf("tuner pending %.0f s, static:4 %.0f s: want at least twice less", tu.PodSecondsPending, s4.PodSecondsPending)
		}
		if tu.MaxReplicas > policy.DefaultConfig().MaxReplicas || tu.MinReplicas < 1 {
			t.Errorf("tuner went to [%d, %d] replicas, outside the config's bounds", tu.MinReplicas, tu.MaxReplicas)
		}
	})
	t.Run("collide: static:8 crashes, the tuner does not", func(t *testing.T) {
		tu, s8 := run("collide.yaml", tuner), run("collide.yaml", Static{8})
		if s8.OOMEvents == 0 || tu.OOMEvents != 0 {
			t.Errorf("OOM events: static:8 %d, tuner %d; want static:8 > 0 and tuner 0", s8.OOMEvents, tu.OOMEvents)
		}
		// Four 5 GiB jobs fit under 90% of 24 GiB, five do not: four run
		// together, never five (a spare on the empty card at the end is
		// no fifth job).
		if tu.MaxHeld != 4 {
			t.Errorf("tuner let %d jobs run at once, want 4", tu.MaxHeld)
		}
	})
	t.Run("queue: static:2 keeps pods waiting for hours, the tuner does not", func(t *testing.T) {
		tu, s2 := run("queue.yaml", tuner), run("queue.yaml", Static{2})
		if s2.MaxPendingSeconds < (9 * time.Hour).Seconds() {
			t.Errorf("static:2: longest wait %.0f s, want the last pods waiting over 9 h", s2.MaxPendingSeconds)
		}
		if tu.MaxPendingSeconds > (3*time.Hour).Seconds() || 4*tu.PodSecondsPending > s2.PodSecondsPending || tu.OOMEvents != 0 {
			t.Errorf("tuner: longest wait %.0f s, pending %.0f s (static:2 %.0f s), %d OOMs; want under 3 h, a quarter of static:2, no OOM",
				tu.MaxPendingSeconds, tu.PodSecondsPending, s2.PodSecondsPending, tu.OOMEvents)
		}
		// Once the first two are measured, the ten waiting are priced at 3 GiB
		// and raised for in one step.
		if tu.MaxReplicas < 12 || tu.ReplicaChanges > 4 {
			t.Errorf("tuner reached %d replicas in %d changes, want all twelve served at once in a step or two", tu.MaxReplicas, tu.ReplicaChanges)
		}
	})
}

func TestRunIsDeterministic(t *testing.T) {
	tr := mustRead(t, "seed-a6000.yaml")
	first := mustRun(t, tr, Tuner{Config: policy.DefaultConfig()})
	for range 3 {
		if diff := cmp.Diff(first, mustRun(t, tr, Tuner{Config: policy.DefaultConfig()}), cmp.AllowUnexported(Result{})); diff != "" {
			t.Fatalf("second replay differs (-first +again):\n%s", diff)
		}
	}
}

// scripted answers fixed counts at fixed instants and records what it saw.
type scripted struct {
	start int
	at    map[time.Duration]int
	seen  []policy.Observation
}

func (s *scripted) Name() string           { return "scripted" }
func (s *scripted) Start(int) int          { return s.start }
func (s *scripted) Tick() time.Duration    { return 15 * time.Second }
func (s *scripted) History() time.Duration { return time.Minute }
func (s *scripted) Decide(obs policy.Observation) policy.Decision {
	s.seen = append(s.seen, obs)
	if n, ok := s.at[obs.Now.Sub(Epoch)]; ok {
		return policy.Decision{Replicas: n, Reason: "Scripted"}
	}
	return policy.Decision{Replicas: obs.CurrentReplicas}
}

func TestRunRules(t *testing.T) {
	const header = "gpu: {memoryTotalBytes: 10737418240}\nduration: 10m\n"
	tests := []struct {
		name                    string
		trace                   string
		policy                  Policy
		ooms                    int
		pending, running, lost  float64
		completed, neverStarted int
	}{
		{"the pod that grows is the one that fails", header + `initialReplicas: 2
pods:
  - {name: steady, arrive: 0s, run: 100s, memory: [[0s, 6442450944]]}
  - {name: grower, arrive: 0s, run: 100s, memory: [[0s, 2147483648], [40s, 5368709120]]}
`, Static{2}, 1, 0, 200, 40 + 30, 2, 0}, // fails at 40 s (6+5 > 10), restarts at 70 s; its next growth, 110 s, is after its end
		{"a pod that starts into a full GPU fails at once and keeps its replica", header + `initialReplicas: 2
pods:
  - {name: big, arrive: 0s, run: 60s, memory: [[0s, 8589934592]]}
  - {name: late, arrive: 10s, run: 60s, memory: [[0s, 4294967296]]}
  - {name: third, arrive: 20s, run: 10s, memory: [[0s, 1073741824]]}
`, Static{2}, 2, 60 - 20, 60 + 60 + 10, 30 + 30, 3, 0}, // late fails at 10 s and 40 s, ends at 70 s in its wait; third waits for big's end
		{"decreases come before increases at the same instant", header + `initialReplicas: 2
pods:
  - {name: shrinks, arrive: 0s, run: 60s, memory: [[0s, 6442450944], [10s, 2147483648]]}
  - {name: grows, arrive: 0s, run: 60s, memory: [[0s, 2147483648], [10s, 6442450944]]}
`, Static{2}, 0, 0, 120, 0, 2, 0},
		{"lowering never stops a running pod", header + `initialReplicas: 3
pods:
  - {name: a, arrive: 0s, run: 5m, memory: [[0s, 1073741824]]}
  - {name: b, arrive: 0s, run: 5m, memory: [[0s, 1073741824]]}
  - {name: c, arrive: 0s, run: 5m, memory: [[0s, 1073741824]]}
  - {name: d, arrive: 1m, run: 1m, memory: [[0s, 1073741824]]}
`, &scripted{start: 3, at: map[time.Duration]int{15 * time.Second: 1}}, 0, 4 * 60, 3*300 + 60, 0, 4, 0},
		{"pods still waiting at the end count until the end", header + `initialReplicas: 1
pods:
  - {name: a, arrive: 0s, run: 9m, memory: [[0s, 1073741824]]}
  - {name: b, arrive: 1m, run: 5m, memory: [[0s, 1073741824]]}
  - {name: c, arrive: 2m, run: 1h, memory: [[0s, 1073741824]]}
`, Static{1}, 0, 9*60 - 60 + 10*60 - 2*60, 9*60 + 60, 0, 1, 1}, // b starts at 9m and is still running at 10m; c never starts
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRun(t, mustParse(t, tc.trace), tc.policy)
			got := []any{r.OOMEvents, r.PodSecondsPending, r.PodSecondsRunning, r.PodSecondsLost, r.PodsCompleted, r.PodsNeverStarted}
			want := []any{tc.ooms, tc.pending, tc.running, tc.lost, tc.completed, tc.neverStarted}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("[oom pending running lost completed neverStarted] (-want +got):\n%s", diff)
			}
		})
	}
}

// The samples handed to the policy are what the controller would build:
// used memory at the tick, each container's peak since the previous tick,
// OOMs since the previous tick, a pod killed by an OOM still allocated.
func TestRunSamples(t *testing.T) {
	tr := mustParse(t, `gpu: {memoryTotalBytes: 10737418240}
initialReplicas: 2
duration: 120s
pods:
  - {name: spiky, arrive: 0s, run: 60s, memory: [[0s, 1073741824], [20s, 3221225472], [25s, 1073741824]]}
  - {name: fat, arrive: 0s, run: 60s, memory: [[0s, 6442450944], [35s, 10200547328]]}
`)
	p := &scripted{start: 2}
	mustRun(t, tr, p)
	type sample struct {
		At          time.Duration
		Used        uint64
		Peaks       map[string]uint64
		OOMs, Alloc int
		Advertised  int
	}
	var got []sample
	for _, obs := range p.seen {
		s := obs.GPUs[0].Samples[len(obs.GPUs[0].Samples)-1]
		if !s.Time.Equal(obs.Now) || s.MemoryTotalBytes != 10*GiB {
			t.Fatalf("sample at %s, total %d; want at %s of 10 GiB", s.Time, s.MemoryTotalBytes, obs.Now)
		}
		got = append(got, sample{s.Time.Sub(Epoch), s.MemoryUsedBytes, s.ContainerPeaks, s.OOMEvents, s.ReplicasAllocated, s.ReplicasAdvertised})
	}
	want := []sample{
		{0, 0, map[string]uint64{}, 0, 0, 2}, // the tick comes before admission at the same instant
		{15 * time.Second, 7 * GiB, map[string]uint64{"spiky": GiB, "fat": 6 * GiB}, 0, 2, 2},
		// spiky's 3 GiB between 20 and 25 s shows as its peak, not in used
		{30 * time.Second, 7 * GiB, map[string]uint64{"spiky": 3 * GiB, "fat": 6 * GiB}, 0, 2, 2},
		// fat grows to 9.5 GiB at 35 s, past 10 GiB with spiky, and fails;
		// it still holds its replica, and its 9.5 GiB was never held
		{45 * time.Second, GiB, map[string]uint64{"spiky": GiB, "fat": 6 * GiB}, 1, 2, 2},
		// fat restarts at 65 s, after its end at 60 s
		{60 * time.Second, 0, map[string]uint64{"spiky": GiB}, 0, 0, 2},
		{75 * time.Second, 0, map[string]uint64{}, 0, 0, 2},
		{90 * time.Second, 0, map[string]uint64{}, 0, 0, 2},
		{105 * time.Second, 0, map[string]uint64{}, 0, 0, 2},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	// History() is one minute: the last observation holds 45..105 s.
	last := p.seen[len(p.seen)-1].GPUs[0].Samples
	if len(last) != 5 || last[0].Time.Sub(Epoch) != 45*time.Second {
		t.Errorf("last observation holds %d samples from %s, want 5 from 45s", len(last), last[0].Time.Sub(Epoch))
	}
}

func TestParsePolicy(t *testing.T) {
	bad := policy.DefaultConfig()
	bad.MaxReplicas = 0
	tests := []struct {
		spec string
		cfg  policy.Config
		name string
		err  error
	}{
		{"tuner", policy.DefaultConfig(), "tuner", nil},
		{"static:4", policy.DefaultConfig(), "static:4", nil},
		{"static:1", bad, "static:1", nil}, // the tuner's config does not matter to a static policy
		{"tuner", bad, "", policy.ErrInvalidConfig},
		{"static:0", policy.DefaultConfig(), "", ErrBadPolicy},
		{"static:four", policy.DefaultConfig(), "", ErrBadPolicy},
		{"static", policy.DefaultConfig(), "", ErrBadPolicy},
		{"dynamic", policy.DefaultConfig(), "", ErrBadPolicy},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			p, err := ParsePolicy(tc.spec, tc.cfg)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || p.Name() != tc.name {
				t.Fatalf("got %v, %v; want %s", p, err, tc.name)
			}
		})
	}
}

// An OOM counts against a raise only when the pods the raise let in made
// it: a pod that fails beside the pods the count before the raise allowed
// fails whatever the raise did, while one that fails for the room a pod
// let in by the raise took, or is itself such a pod, counts.
func TestRaiseOOMEvents(t *testing.T) {
	const header = "gpu: {memoryTotalBytes: 10737418240}\nduration: 10m\ninitialReplicas: 2\n"
	tests := []struct {
		name        string
		trace       string
		ooms, raise int
	}{
		{"a loop beside the pods before the raise is not the raise's", header + `pods:
  - {name: svc, arrive: 0s, run: 10m, memory: [[0s, 6442450944]]}
  - {name: loop, arrive: 0s, run: 10m, memory: [[0s, 1073741824], [1m, 5368709120]]}
  - {name: small, arrive: 30s, run: 10m, memory: [[0s, 536870912]]}
`, 6, 0}, // loop fails at 1m, 2m30s, 4m, ... (a restart and a minute apart): 6+5 > 10 with or without small
		{"a pod that fails for the room the raised-in pod took is", header + `pods:
  - {name: svc, arrive: 0s, run: 10m, memory: [[0s, 6442450944]]}
  - {name: grower, arrive: 0s, run: 10m, memory: [[0s, 1073741824], [1m, 3758096384]]}
  - {name: small, arrive: 30s, run: 10m, memory: [[0s, 1073741824]]}
`, 6, 6}, // 6+3.5 fits alone, 6+3.5+1 does not
		{"the raised-in pod's own OOM is", header + `pods:
  - {name: svc, arrive: 0s, run: 10m, memory: [[0s, 6442450944]]}
  - {name: job, arrive: 0s, run: 10m, memory: [[0s, 1073741824]]}
  - {name: big, arrive: 30s, run: 10m, memory: [[0s, 1073741824], [1m, 4294967296]]}
`, 6, 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRun(t, mustParse(t, tc.trace), &scripted{start: 2, at: map[time.Duration]int{30 * time.Second: 3}})
			if r.OOMEvents != tc.ooms || r.RaiseOOMEvents != tc.raise {
				t.Errorf("%d OOM events, %d after a raise; want %d, %d", r.OOMEvents, r.RaiseOOMEvents, tc.ooms, tc.raise)
			}
		})
	}
}

// Sizes near 2^64 are compared without wrapping: a pod past the GPU's
// total fails, however large the number, and a sum that would pass 2^64
// does not come round to a small one that fits.
func TestRunHugeMemory(t *testing.T) {
	const huge = "18446744072635809792" // 2^64 - 1 GiB
	tests := []struct {
		name   string
		trace  string
		policy Policy
		ooms   map[string]int
		raise  int
	}{
		{"a pod larger than the GPU", `gpu: {memoryTotalBytes: 10737418240}
initialReplicas: 2
duration: 100s
pods:
  - {name: a, arrive: 0s, run: 100s, memory: [[0s, 4294967296]]}
  - {name: b, arrive: 10s, run: 100s, memory: [[0s, ` + huge + `]]}
`, Static{2}, map[string]int{"b": 3}, 0}, // b fails at 10, 40 and 70 s
		{"two pods of the whole of a GPU of 2^64 - 1 bytes", `gpu: {memoryTotalBytes: 18446744073709551615}
initialReplicas: 2
duration: 50s
pods:
  - {name: a, arrive: 0s, run: 50s, memory: [[0s, 18446744073709551615]]}
  - {name: b, arrive: 0s, run: 50s, memory: [[0s, 18446744073709551615]]}
`, Static{2}, map[string]int{"b": 2}, 0}, // b fails at 0 and 30 s
		// loop fails beside svc alone, whatever the raise let in: not the
		// raise's, though svc, small and loop's bytes add up past 2^64.
		{"a loop after a raise", `gpu: {memoryTotalBytes: 10737418240}
initialReplicas: 2
duration: 100s
pods:
  - {name: svc, arrive: 0s, run: 100s, memory: [[0s, 6442450944]]}
  - {name: loop, arrive: 0s, run: 100s, memory: [[0s, 1073741824], [60s, ` + huge + `]]}
  - {name: small, arrive: 30s, run: 100s, memory: [[0s, 536870912]]}
`, &scripted{start: 2, at: map[time.Duration]int{30 * time.Second: 3}}, map[string]int{"loop": 1}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRun(t, mustParse(t, tc.trace), tc.policy)
			if diff := cmp.Diff(tc.ooms, r.OOMsPerContainer); diff != "" || r.RaiseOOMEvents != tc.raise {
				t.Errorf("OOMs per pod (-want +got):\n%s%d after a raise, want %d", diff, r.RaiseOOMEvents, tc.raise)
			}
		})
	}
}

// A run too long for a time.Duration to add to its start (2562047h47m16s
// is the most one holds) runs to the trace's end and does not complete.
func TestRunLongestRun(t *testing.T) {
	tr := mustParse(t, `gpu: {memoryTotalBytes: 10737418240}
initialReplicas: 1
duration: 300s
pods:
  - {name: z, arrive: 0s, run: 100s, memory: [[0s, 1]]}
  - {name: a, arrive: 1s, run: 2562047h47m16s, memory: [[0s, 1], [2562047h, 2]]}
`)
	r := mustRun(t, tr, Static{1})
	// a waits 1-100 s and holds its replica 100-300 s.
	if r.PodSecondsRunning != 300 || r.PodsCompleted != 1 || r.PodSecondsPending != 99 {
		t.Errorf("running %v pod-s, %d completed, pending %v; want 300, 1 (z), 99", r.PodSecondsRunning, r.PodsCompleted, r.PodSecondsPending)
	}
}

// evictAt evicts a container, and sets a count, at given instants.
type evictAt struct {
	start int
	at    map[time.Duration]policy.Decision
}

func (e evictAt) Name() string         { return "evict" }
func (e evictAt) Start(int) int        { return e.start }
func (evictAt) Tick() time.Duration    { return 15 * time.Second }
func (evictAt) History() time.Duration { return time.Minute }
func (e evictAt) Decide(obs policy.Observation) policy.Decision {
	if d, ok := e.at[obs.Now.Sub(Epoch)]; ok {
		return d
	}
	return policy.Decision{Replicas: obs.CurrentReplicas}
}

// podSecondsLost is work thrown away by OOMs plus the restart waits
// (docs/tuner-policy.md, "The replay"): an eviction in a restart wait ends
// that wait, and the time after it is pending, not lost; an eviction of a
// running attempt throws that attempt away. Lost time is always time the
// pod held its replica.
func TestLostWithEviction(t *testing.T) {
	// crash fails at 20 s (6 + 6 > 10 GiB), restarts at 50 s, fails again
	// at 70 s and would restart at 100 s.
	tr := mustParse(t, `gpu: {memoryTotalBytes: 10737418240}
initialReplicas: 2
duration: 600s
pods:
  - {name: svc, arrive: 0s, run: 600s, memory: [[0s, 6442450944]]}
  - {name: crash, arrive: 0s, run: 600s, memory: [[0s, 1073741824], [20s, 6442450944]]}
`)
	evict := func(at time.Duration) evictAt {
		// The count goes to 1 with the eviction, so crash waits to the end.
		return evictAt{start: 2, at: map[time.Duration]policy.Decision{at: {Replicas: 1, Reason: "Scripted",
			CrashLoops: []policy.CrashLoop{{Container: "crash", Evict: true}}}}}
	}
	tests := []struct {
		name                   string
		at                     time.Duration
		lost, running, pending float64
	}{
		// 20 + 30 for the first OOM, 20 for the second and 5 s of its wait.
		{"in the restart wait", 75 * time.Second, 20 + 30 + 20 + 5, 600 + 75, 600 - 75},
		// 20 + 30 for the first OOM, then the 10 s of the attempt from 50 s.
		{"while running", 60 * time.Second, 20 + 30 + 10, 600 + 60, 600 - 60},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRun(t, tr, evict(tc.at))
			got := []any{r.Evictions, r.PodSecondsLost, r.PodSecondsRunning, r.PodSecondsPending}
			want := []any{1, tc.lost, tc.running, tc.pending}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("[evictions lost running pending] (-want +got):\n%s", diff)
			}
		})
	}
}

// A change decided within its apply latency of the trace's end: its
// latency and blackout are charged up to the end only, and finalReplicas
// is the count it chose, as minReplicas and the changes say.
func TestChangeInFlightAtTheEnd(t *testing.T) {
	tr := mustParse(t, `gpu: {memoryTotalBytes: 10737418240}
initialReplicas: 2
duration: 65s
pods:
  - {name: a, arrive: 0s, run: 65s, memory: [[0s, 1073741824]]}
`)
	// restart mode: 11 s from the decision to the new count, all of it
	// blacked out; the trace ends 5 s after the decision at 60 s.
	r := mustRunIn(t, tr, &scripted{start: 2, at: map[time.Duration]int{60 * time.Second: 1}}, policy.ModeRestart)
	got := []any{r.ReplicaChanges, r.MinReplicas, r.FinalReplicas, r.ApplyLatencySeconds, r.BlackoutSeconds}
	want := []any{1, 1, 1, 5.0, 5.0}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("[changes min final latency blackout] (-want +got):\n%s", diff)
	}
}

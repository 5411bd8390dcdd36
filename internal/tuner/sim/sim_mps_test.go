package sim

import (
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/mps"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// script changes the count at given instants: a count takes effect at
// once (Run applies changes at once).
type script struct {
	start int
	at    map[time.Duration]int
	cur   *int
}

func (s script) Name() string         { return "script" }
func (s script) Start(int) int        { *s.cur = s.start; return s.start }
func (script) Tick() time.Duration    { return 15 * time.Second }
func (script) History() time.Duration { return time.Minute }
func (s script) Decide(obs policy.Observation) policy.Decision {
	if n, ok := s.at[obs.Now.Sub(Epoch)]; ok {
		*s.cur = n
	}
	return policy.Decision{Replicas: *s.cur, Reason: "Script"}
}

func mpsTrace(t *testing.T, body string) *Trace {
	t.Helper()
	tr, err := ParseTrace("mps.yaml", []byte("sharing: mps\ngpu: {memoryTotalBytes: 51539607552}\n"+body))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// A pod keeps the limit of the count at its start, across a change in
// either direction: a raise does not cap a pod started before it, a
// lowering does not save one started before it.
func TestMPSLimitFixedAtStart(t *testing.T) {
	// 48 GiB: 2 replicas give 24 GiB, 4 give 12 GiB.
	tr := mpsTrace(t, `initialReplicas: 2
duration: 2h
pods:
  - {name: early, arrive: 0s, run: 2h, memory: [[0s, 1073741824], [1h, 21474836480]]}
  - {name: late, arrive: 30m, run: 90m, memory: [[0s, 1073741824], [1h, 16106127360]]}
`)
	cur := 0
	// Raise to 4 at 15m: early (24 GiB) grows to 20 GiB at 1h and is not
	// capped; late starts at 30m under 4 (12 GiB) and runs out at 15 GiB.
	res, err := Run(tr, script{start: 2, at: map[time.Duration]int{15 * time.Minute: 4}, cur: &cur})
	if err != nil {
		t.Fatal(err)
	}
	if res.MPSResult == nil || res.CapOOMEvents == 0 || res.OOMsPerContainer["early"] != 0 || res.OOMsPerContainer["late"] == 0 {
		t.Errorf("raise: %+v, OOMs per pod %v", res.MPSResult, res.OOMsPerContainer)
	}
	if res.OOMEvents != res.CapOOMEvents {
		t.Errorf("raise: %d OOM events, %d at a pod's own limit: no pod may find the GPU full here", res.OOMEvents, res.CapOOMEvents)
	}

	// Start at 4 (12 GiB each), lower to 2 at 15m: early keeps 12 GiB
	// and runs out at 20 GiB; late, started after the lowering, has 24
	// GiB and does not.
	tr2 := mpsTrace(t, `initialReplicas: 4
duration: 2h
pods:
  - {name: early, arrive: 0s, run: 2h, memory: [[0s, 1073741824], [1h, 21474836480]]}
  - {name: late, arrive: 30m, run: 90m, memory: [[0s, 1073741824], [1h, 16106127360]]}
`)
	res, err = Run(tr2, script{start: 4, at: map[time.Duration]int{15 * time.Minute: 2}, cur: &cur})
	if err != nil {
		t.Fatal(err)
	}
	if res.OOMsPerContainer["early"] == 0 || res.OOMsPerContainer["late"] != 0 || res.OOMEvents != res.CapOOMEvents {
		t.Errorf("lowering: OOMs per pod %v, %d events, %d at a cap", res.OOMsPerContainer, res.OOMEvents, res.CapOOMEvents)
	}
	if res.StartsWithOtherLimits != 1 {
		t.Errorf("lowering: %d starts beside a pod of another limit, want 1 (late beside early)", res.StartsWithOtherLimits)
	}
}

// Neighbours are not hurt: a pod past its limit fails alone, while under
// time-slicing the same trace makes the pod that grows into a full GPU
// fail.
func TestMPSNoCrowding(t *testing.T) {
	body := `initialReplicas: 2
duration: 1h
pods:
  - {name: hog, arrive: 0s, run: 1h, memory: [[0s, 1073741824], [10m, 45097156608]]}
  - {name: small, arrive: 0s, run: 1h, memory: [[0s, 1073741824], [20m, 8589934592]]}
`
	res, err := Run(mpsTrace(t, body), Static{Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.OOMsPerContainer["small"] != 0 || res.OOMsPerContainer["hog"] == 0 || res.OOMEvents != res.CapOOMEvents {
		t.Errorf("MPS: OOMs per pod %v (%d events, %d at a cap)", res.OOMsPerContainer, res.OOMEvents, res.CapOOMEvents)
	}
	ts, err := ParseTrace("ts.yaml", []byte("gpu: {memoryTotalBytes: 51539607552}\n"+body))
	if err != nil {
		t.Fatal(err)
	}
	res, err = Run(ts, Static{Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.OOMsPerContainer["small"] == 0 || res.MPSResult != nil {
		t.Errorf("time-slicing: OOMs per pod %v: the small pod grows into a full GPU", res.OOMsPerContainer)
	}
}

// Limits add up to more than the GPU only after a raise, and only then
// can a pod find the GPU full.
func TestMPSOvercommitAfterRaise(t *testing.T) {
	tr := mpsTrace(t, `initialReplicas: 2
duration: 2h
pods:
  - {name: a, arrive: 0s, run: 2h, memory: [[0s, 1073741824], [1h, 23622320128]]}
  - {name: b, arrive: 0s, run: 2h, memory: [[0s, 1073741824], [1h, 23622320128]]}
  - {name: c, arrive: 20m, run: 100m, memory: [[0s, 10737418240]]}
`)
	cur := 0
	res, err := Run(tr, script{start: 2, at: map[time.Duration]int{15 * time.Minute: 4}, cur: &cur})
	if err != nil {
		t.Fatal(err)
	}
	if want := 2*mps.MemoryLimit(48*gib, 2) + mps.MemoryLimit(48*gib, 4); res.MaxCommittedBytes != want {
		t.Errorf("committed %d, want %d", res.MaxCommittedBytes, want)
	}
	if res.OOMEvents == res.CapOOMEvents {
		t.Errorf("a and b grow within their 24 GiB into a GPU c holds 10 GiB of: want a full-GPU OOM, got %d events, %d at a cap", res.OOMEvents, res.CapOOMEvents)
	}
}

func TestMPSTraceField(t *testing.T) {
	for body, want := range map[string]string{
		"sharing: time-slicing\n": "",
		"sharing: mps\n":          SharingMPS,
		"":                        "",
	} {
		tr, err := ParseTrace("t.yaml", []byte(body+"gpu: {memoryTotalBytes: 1000}\ninitialReplicas: 2\nduration: 1h\npods: [{name: a, arrive: 0s, run: 1h, memory: [[0s, 1]]}]\n"))
		if err != nil || tr.Sharing != want {
			t.Errorf("%q: %v, %q", body, err, tr.Sharing)
		}
	}
	for _, body := range []string{"sharing: mps\ninitialReplicas: 1\n", "sharing: mig\ninitialReplicas: 2\n"} {
		if _, err := ParseTrace("t.yaml", []byte(body+"gpu: {memoryTotalBytes: 1000}\nduration: 1h\npods: [{name: a, arrive: 0s, run: 1h, memory: [[0s, 1]]}]\n")); err == nil {
			t.Errorf("%q: accepted", body)
		}
	}
}

// The tuner on the shipped MPS trace (plugin mode): never below 2, no
// reversal, every pod completes, fewer OOMs and less waiting than the
// operator's count (4), and no fixed count in hindsight has as few OOMs
// and waits less. It does not meet every static count on both: static:3
// has no OOM (every fine-tune fits 16 GiB) and waits far more; the tuner
// caps the first fine-tune of each evening that comes to a spare replica
// (docs/tuner-policy.md, "MPS").
func TestMPSTunerOnTrace(t *testing.T) {
	tr, err := ReadTrace("../../../test/traces/mps-48g-two-days.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cost, _ := policy.ApplyCostOf(policy.ModePlugin)
	res, err := RunWith(tr, Tuner{Config: policy.DefaultConfig()}, Options{Apply: cost})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tuner: %d OOMs (%d at a cap), %.0f pod-s pending, %d/%d completed, %d changes, replicas %d-%d, committed at most %.1f GiB",
		res.OOMEvents, res.CapOOMEvents, res.PodSecondsPending, res.PodsCompleted, res.Pods, res.ReplicaChanges,
		res.MinReplicas, res.MaxReplicas, float64(res.MaxCommittedBytes)/float64(gib))
	if res.MinReplicas < 2 || res.Reversals > 0 || res.PodsCompleted != res.Pods {
		t.Errorf("tuner: min %d replicas, %d reversals, %d/%d completed", res.MinReplicas, res.Reversals, res.PodsCompleted, res.Pods)
	}
	for n := 2; n <= 16; n++ {
		st, err := RunWith(tr, Static{Replicas: n}, Options{Apply: cost})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("static:%d: %d OOMs, %.0f pod-s pending", n, st.OOMEvents, st.PodSecondsPending)
		if st.OOMEvents <= res.OOMEvents && st.PodSecondsPending < res.PodSecondsPending {
			t.Errorf("static:%d dominates: %d OOMs, %.0f pod-s pending against the tuner's %d and %.0f",
				n, st.OOMEvents, st.PodSecondsPending, res.OOMEvents, res.PodSecondsPending)
		}
		if n == tr.InitialReplicas && (st.OOMEvents <= res.OOMEvents || st.PodSecondsPending <= res.PodSecondsPending) {
			t.Errorf("the operator's count static:%d: %d OOMs, %.0f pod-s: the tuner should beat it on both", n, st.OOMEvents, st.PodSecondsPending)
		}
	}
}

// A pod fails at its own limit whoever runs beside it, and keeps the limit
// it was admitted with: its cap OOM is a raise's only when it was admitted
// since the raise (at the raised count's lower limit), not when it came in
// before and outgrew the limit of the count it came in at.
func TestMPSRaiseOOMEvents(t *testing.T) {
	// 48 GiB: 2 replicas give 24 GiB, 4 give 12 GiB. The count goes 2 -> 4
	// at 15m; s1 and s2 come in at 20m under it, so 3 pods hold replicas
	// where 2 did.
	const small = `
  - {name: s1, arrive: 20m, run: 100m, memory: [[0s, 1073741824]]}
  - {name: s2, arrive: 20m, run: 100m, memory: [[0s, 1073741824]]}
`
	tests := []struct {
		name        string
		pod         string
		ooms, raise int
	}{
		// early has 24 GiB and grows to 30 GiB an hour into each attempt:
		// it fails at 1h (its next growth, 2h0m30s, is past the end), as
		// it would under 2 with no one beside it.
		{"admitted before the raise", `  - {name: early, arrive: 0s, run: 2h, memory: [[0s, 1073741824], [1h, 32212254720]]}`, 1, 0},
		// late comes in at 30m under 4 (12 GiB) and grows to 16 GiB 30m
		// into each attempt, which the 24 GiB of the count before would
		// have held: it fails at 1h and 1h30m30s.
		{"admitted since the raise", `  - {name: early, arrive: 0s, run: 2h, memory: [[0s, 1073741824]]}
  - {name: late, arrive: 30m, run: 90m, memory: [[0s, 1073741824], [30m, 17179869184]]}`, 2, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := mpsTrace(t, "initialReplicas: 2\nduration: 2h\npods:\n"+tc.pod+small)
			cur := 0
			res, err := Run(tr, script{start: 2, at: map[time.Duration]int{15 * time.Minute: 4}, cur: &cur})
			if err != nil {
				t.Fatal(err)
			}
			if res.CapOOMEvents != tc.ooms || res.OOMEvents != tc.ooms || res.RaiseOOMEvents != tc.raise {
				t.Errorf("%d OOM events (%d at a cap), %d after a raise; want %d at a cap, %d after a raise (per pod %v)",
					res.OOMEvents, res.CapOOMEvents, res.RaiseOOMEvents, tc.ooms, tc.raise, res.OOMsPerContainer)
			}
		})
	}
}

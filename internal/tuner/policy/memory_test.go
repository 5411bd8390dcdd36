package policy

import (
	"testing"
	"time"
)

// A workload's record prices its pending pods, keeps its OOM count from
// being given again, and lets running pods grow to their remembered peaks.
func TestDecideWithMemory(t *testing.T) {
	def := DefaultConfig()
	full := history(10*time.Minute, steady(servicesUsed, 4, 4, servicePeaks))
	known := func(peak uint64) WorkloadMemory {
		return WorkloadMemory{PeakBytes: peak, Seen: time.Hour, LastSeen: now.Add(-time.Hour)}
	}
	obs := func(pending []PendingPod, mem map[string]WorkloadMemory) Observation {
		o := node(4, now.Add(-time.Minute), full)
		o.Pending, o.Memory = pending, Memory{Updated: now, Workloads: mem}
		return o
	}
	tests := []struct {
		name     string
		obs      Observation
		replicas int
		reason   string
	}{
		{"pending pods of known small workloads are raised for at once, several in one step",
			obs([]PendingPod{{"job/embed", 1}, {"job/embed", 1}, {"job/thumbs", 1}},
				map[string]WorkloadMemory{"job/embed": known(3 * GiB), "job/thumbs": known(2 * GiB)}), 7, ReasonSustainedHeadroom},
		{"a pending pod of unknown size waits out the cooldown",
			obs([]PendingPod{{"job/new", 1}}, nil), 4, ReasonCooldown},
		{"a known pod too large for the room is not raised for",
			obs([]PendingPod{{"job/finetune", 1}}, map[string]WorkloadMemory{"job/finetune": known(24 * GiB)}), 4, ReasonInsufficientHeadroom},
		{"a workload that OOMed at 5 pods is not given 5 again",
			obs([]PendingPod{{"job/embed", 1}}, map[string]WorkloadMemory{
				"job/embed": {PeakBytes: 3 * GiB, Seen: time.Hour, LastSeen: now, OOMAllocated: 5, LastOOM: now.Add(-24 * time.Hour)}}),
			4, ReasonRememberedOOM},
		{"an OOM older than remember is forgotten",
			obs([]PendingPod{{"job/embed", 1}}, map[string]WorkloadMemory{
				"job/embed": {PeakBytes: 3 * GiB, Seen: time.Hour, LastSeen: now, OOMAllocated: 5, LastOOM: now.Add(-def.Remember)}}),
			5, ReasonSustainedHeadroom},
		{"running services priced at their remembered afternoon peaks leave no room",
			obs([]PendingPod{{"job/embed", 1}}, map[string]WorkloadMemory{
				"job/embed": known(3 * GiB), "media/rife/rife": known(28 * GiB)}), 4, ReasonInsufficientHeadroom},
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
	}}
	got := Remember(cfg, old, obs)
	rife := got.Workloads["Deployment/ns/rife"]
	if rife.PeakBytes != 8*GiB || rife.Seen != time.Duration(len(ss))*cfg.SampleInterval || rife.OOMAllocated != 4 || !rife.LastOOM.Equal(now) {
		t.Errorf("rife = %+v, want 8 GiB peak over %d samples and an OOM at 4 pods now", rife, len(ss))
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
	if len(old.Workloads) != 2 {
		t.Errorf("Remember changed its input")
	}
}

// Base is the count the tuner found, lowered only by evidence: replicas it
// raised are its bets and may be withdrawn on a guess, the operator's are
// not.
func TestRoundBase(t *testing.T) {
	def := DefaultConfig()
	// Six free replicas on the seed services, none of them backed by 8 GiB
	// pods beyond two: the unbacked rule would go to 6.
	roomy := history(10*time.Minute, steady(servicesUsed, 4, 10, servicePeaks))
	tests := []struct {
		name     string
		base     int
		cur      int
		ss       []Sample
		replicas int
		wantBase int
	}{
		{"the first round takes the count it finds as the base", 0, 10, roomy, 10, 10},
		{"raised replicas above the base are withdrawn", 4, 10, roomy, 6, 4},
		{"withdrawal stops at the base", 8, 10, roomy, 8, 8},
		{"an OOM lowers the base with the count", 8, 8, with(history(10*time.Minute, steady(servicesUsed, 8, 8, servicePeaks)), last(1),
			func(s *Sample) { s.OOMEvents, s.MemoryUsedBytes = 1, 46*GiB }), 7, 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := node(tc.cur, time.Time{}, tc.ss)
			o.Memory = Memory{Base: tc.base}
			d, mem := Round(def, o)
			if d.Replicas != tc.replicas || mem.Base != tc.wantBase {
				t.Errorf("Round = %d replicas (%s: %s), base %d; want %d, base %d", d.Replicas, d.Reason, d.Message, mem.Base, tc.replicas, tc.wantBase)
			}
		})
	}
}

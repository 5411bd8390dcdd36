package policy

import (
	"testing"
	"time"
)

// TestMPSLoopEvictedOnlyWithRelief: under MPS a container that runs out at
// its own limit twice is a loop; with eviction on, it is marked for
// eviction only when the count in effect gives a new pod a larger limit
// than its own, since a pod evicted before would start at the same limit
// and loop again; with its limit unknown, never.
func TestMPSLoopEvictedOnlyWithRelief(t *testing.T) {
	const gib = 1 << 30
	now := time.Unix(1_800_000_000, 0)
	cfg := DefaultConfig()
	cfg.EvictCrashLoops = true
	const c = "ml/tune-0/main"
	obs := func(cur int, limit uint64) Observation {
		var ss []Sample
		for i := range 4 {
			s := Sample{Time: now.Add(time.Duration(i-4) * time.Minute), MemoryTotalBytes: 48 * gib, MemoryUsedBytes: 10 * gib,
				ContainerPeaks: map[string]uint64{c: 10 * gib}, ReplicasAdvertised: cur}
			if limit > 0 {
				s.ContainerLimits = map[string]uint64{c: limit}
			}
			if i%2 == 1 {
				s.OOMEvents, s.OOMs = 1, []OOM{{Container: c, Kind: OOMCap}}
			}
			ss = append(ss, s)
		}
		return Observation{Node: "n", Now: now, CurrentReplicas: cur, MPS: true,
			GPUs: []GPUObservation{{UUID: "GPU-a", Samples: ss}}}
	}
	for _, tc := range []struct {
		name  string
		cur   int
		limit uint64
		evict bool
	}{
		{"count in effect gives the same limit", 4, 12 * gib, false},
		{"count in effect gives more", 3, 12 * gib, true},
		{"limit unknown", 3, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(cfg, obs(tc.cur, tc.limit))
			if len(d.CrashLoops) != 1 || d.CrashLoops[0].Container != c {
				t.Fatalf("crash loops %+v, want %s's", d.CrashLoops, c)
			}
			if d.CrashLoops[0].Evict != tc.evict {
				t.Errorf("evict %v, want %v", d.CrashLoops[0].Evict, tc.evict)
			}
		})
	}
}

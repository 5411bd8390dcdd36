package policy

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRecommendMemoryRequests(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	cfg := DefaultConfig() // window 10m, target utilization 0.9
	sample := func(ago time.Duration, peaks map[string]uint64) Sample {
		return Sample{Time: now.Add(-ago), MemoryTotalBytes: 48 << 30, ContainerPeaks: peaks}
	}
	obs := Observation{Node: "n", Now: now, GPUs: []GPUObservation{
		{UUID: "GPU-b", Samples: []Sample{
			sample(20*time.Minute, map[string]uint64{"ml/old/c": 40 << 30}), // outside the window
			sample(5*time.Minute, map[string]uint64{"ml/infer/srv": 3 << 30, "ml/idle/c": 0}),
			sample(time.Minute, map[string]uint64{"ml/infer/srv": 9 << 29}), // 4.5 GiB
		}},
		{UUID: "GPU-a", Samples: []Sample{
			sample(time.Minute, map[string]uint64{"ml/infer/srv": 1 << 30, "ml/train/main": 18 << 30}),
		}},
	}}
	got := RecommendMemoryRequests(cfg, obs)
	// 4.5 GiB / 0.9 = 5 GiB exactly; 1 GiB / 0.9 = 1.11 GiB → 1.25 GiB;
	// 18 GiB / 0.9 = 20 GiB.
	want := []MemoryRequest{
		{Container: "ml/infer/srv", UUID: "GPU-a", PeakBytes: 1 << 30, RequestBytes: 5 << 28},
		{Container: "ml/infer/srv", UUID: "GPU-b", PeakBytes: 9 << 29, RequestBytes: 5 << 30},
		{Container: "ml/train/main", UUID: "GPU-a", PeakBytes: 18 << 30, RequestBytes: 20 << 30},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("RecommendMemoryRequests (-want +got):\n%s", diff)
	}
	if got := RecommendMemoryRequests(cfg, Observation{Now: now}); len(got) != 0 {
		t.Errorf("no samples: %v, want none", got)
	}
}

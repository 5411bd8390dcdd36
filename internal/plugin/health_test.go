package plugin

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
)

func TestCriticalXid(t *testing.T) {
	for _, x := range []uint64{13, 31, 43, 45, 68, 109} {
		if CriticalXid(x) {
			t.Errorf("Xid %d is an application error, not critical", x)
		}
	}
	for _, x := range []uint64{48, 63, 64, 74, 79, 92, 94, 95, 119} {
		if !CriticalXid(x) {
			t.Errorf("Xid %d should be critical", x)
		}
	}
}

func TestHealthTracker(t *testing.T) {
	const recovery = time.Minute
	t0 := time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)
	a, b := gputest.GPU(uuid0, 48<<30), gputest.GPU(uuid1, 48<<30)
	type step struct {
		at      time.Duration
		gpus    []gputest.GPUSpec
		snapErr error
		want    string // health of GPU 0 and 1: "HH", "UH", …; "-" for unknown
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"healthy GPUs", []step{{0, []gputest.GPUSpec{a, b}, nil, "HH"}}},
		{"critical Xid, then recovery after the interval", []step{
			{0, []gputest.GPUSpec{a, b}, nil, "HH"},
			{time.Second, []gputest.GPUSpec{a.WithXids(79), b}, nil, "UH"},
			{30 * time.Second, []gputest.GPUSpec{a.WithXids(79), b}, nil, "UH"},
			{61 * time.Second, []gputest.GPUSpec{a.WithXids(79), b}, nil, "HH"},
		}},
		{"the same Xid count again is not a new event", []step{
			{0, []gputest.GPUSpec{a.WithXids(79), b}, nil, "UH"},
			{2 * time.Minute, []gputest.GPUSpec{a.WithXids(79), b}, nil, "HH"},
			{3 * time.Minute, []gputest.GPUSpec{a.WithXids(79, 79), b}, nil, "UH"},
		}},
		{"application Xids keep the GPU healthy", []step{
			{0, []gputest.GPUSpec{a.WithXids(13, 31, 43, 45, 68, 109), b}, nil, "HH"},
		}},
		{"failed reading, then answering again", []step{
			{0, []gputest.GPUSpec{a, b}, nil, "HH"},
			{time.Second, []gputest.GPUSpec{a, b.WithError("GPU is lost")}, nil, "HU"},
			{2 * time.Second, []gputest.GPUSpec{a, b}, nil, "HU"},
			{62 * time.Second, []gputest.GPUSpec{a, b}, nil, "HH"},
		}},
		{"missing from a reading", []step{
			{0, []gputest.GPUSpec{a, b}, nil, "HH"},
			{time.Second, []gputest.GPUSpec{a}, nil, "HU"},
		}},
		{"backend unavailable: every GPU", []step{
			{0, []gputest.GPUSpec{a, b}, nil, "HH"},
			{time.Second, nil, fmt.Errorf("%w: no NVML", gpu.ErrUnavailable), "UU"},
			{2 * time.Minute, []gputest.GPUSpec{a, b}, nil, "HH"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHealthTracker(recovery, slog.New(slog.DiscardHandler))
			for i, s := range tc.steps {
				h.observe(t0.Add(s.at), gputest.Snapshot(s.gpus...), s.snapErr, gputest.Xids(s.gpus...))
				got := ""
				for _, g := range h.gpus() {
					if g.Healthy {
						got += "H"
					} else {
						got += "U"
					}
				}
				if got != s.want {
					t.Errorf("step %d (+%v): health %s, want %s", i, s.at, got, s.want)
				}
			}
		})
	}
}

// A GPU's MIG mode reaches the plan, and a change of it is a change.
func TestHealthTrackerMIGMode(t *testing.T) {
	h := newHealthTracker(time.Minute, slog.New(slog.DiscardHandler))
	t0 := time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)
	a, b := gputest.GPU(uuid0, 48<<30), gputest.GPU(uuid1, 48<<30)
	h.observe(t0, gputest.Snapshot(a, b), nil, nil)
	if h.observe(t0.Add(time.Second), gputest.Snapshot(a, b), nil, nil) {
		t.Error("the same reading again is a change")
	}
	if !h.observe(t0.Add(2*time.Second), gputest.Snapshot(a, b.WithMIG()), nil, nil) {
		t.Error("MIG mode turned on is not a change")
	}
	if g := h.gpus(); g[0].MIGEnabled || !g[1].MIGEnabled {
		t.Errorf("MIG modes %v, %v; want false, true", g[0].MIGEnabled, g[1].MIGEnabled)
	}
}

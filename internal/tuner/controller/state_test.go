package controller

import (
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

func TestExpectedAllocatable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		doc   string
		gpus  int
		res   string
		count int64
	}{
		{"no sharing", "version: v1\n", 2, "nvidia.com/gpu", 2},
		{"all GPUs shared", "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}\n", 2, "nvidia.com/gpu", 8},
		{"renamed by default", "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: nvidia.com/gpu, replicas: 4}]}}\n", 2, "nvidia.com/gpu.shared", 8},
		{"explicit rename", "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, rename: gpu-shared, replicas: 3}]}}\n", 1, "nvidia.com/gpu-shared", 3},
		{"the first GPU of two shared", "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, devices: 1, replicas: 4}]}}\n", 2, "nvidia.com/gpu", 5},
		{"a list, renamed: the rest elsewhere", "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: nvidia.com/gpu, devices: ['0'], replicas: 4}]}}\n", 3, "nvidia.com/gpu.shared", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := dpconfig.Parse([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			res, n := expectedAllocatable(f.Config(), tc.gpus)
			if res != tc.res || n != tc.count {
				t.Errorf("got %d %s, want %d %s", n, res, tc.count, tc.res)
			}
		})
	}
}

// TestExpectDraining: after a lowering, IDs held above the new count may
// still be advertised (gpuslice-plugin drains them) or not (NVIDIA's plugin).
func TestExpectDraining(t *testing.T) {
	now := time.Unix(1000, 0)
	gpu := func(uuid string, allocated int, at time.Time) policy.GPUObservation {
		return policy.GPUObservation{UUID: uuid, Samples: []policy.Sample{{Time: at, ReplicasAllocated: allocated}}}
	}
	f, err := dpconfig.Parse([]byte("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 3}]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	c := &Controller{}
	c.cfg.Policy.SampleInterval = 10 * time.Second
	w := &work{st: &nodeState{}, gpus: []policy.GPUObservation{
		gpu("GPU-a", 5, now), gpu("GPU-b", 2, now),
		gpu("GPU-gone", 6, now.Add(-time.Minute)), // removed: neither counted nor draining
	}}
	c.expect(w, f.Config(), 3, now)
	p := w.st.pending
	if p.gpus != 2 || p.want != 6 || p.draining != 2 {
		t.Fatalf("expectation %+v, want 2 GPUs, 6 replicas, up to 2 draining", p)
	}
	for got, ok := range map[int64]bool{5: false, 6: true, 7: true, 8: true, 9: false} {
		if p.met(got) != ok {
			t.Errorf("met(%d) = %v", got, !ok)
		}
	}
}

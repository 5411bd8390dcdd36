package controller

import (
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// TestExpectedAllocatable reads a config as each plugin does: gpuslice-plugin
// follows `rename` and `devices`; NVIDIA's (v0.19.0) ignores both with a
// warning, so expecting them in NVIDIA modes failed verification and held
// the node for an hour.
func TestExpectedAllocatable(t *testing.T) {
	for _, tc := range []struct {
		name               string
		doc                string
		gpus               int
		res, nvidiaRes     string
		count, nvidiaCount int64
	}{
		{"no sharing", "version: v1\n", 2, "nvidia.com/gpu", "nvidia.com/gpu", 2, 2},
		{"all GPUs shared", "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}\n", 2, "nvidia.com/gpu", "nvidia.com/gpu", 8, 8},
		{"renamed by default", "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: nvidia.com/gpu, replicas: 4}]}}\n", 2,
			"nvidia.com/gpu.shared", "nvidia.com/gpu.shared", 8, 8},
		{"explicit rename", "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, rename: gpu-shared, replicas: 3}]}}\n", 1,
			"nvidia.com/gpu-shared", "nvidia.com/gpu", 3, 3},
		{"the first GPU of two shared", "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, devices: 1, replicas: 4}]}}\n", 2,
			"nvidia.com/gpu", "nvidia.com/gpu", 5, 8},
		{"a list, renamed: the rest elsewhere", "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: nvidia.com/gpu, devices: ['0'], replicas: 4}]}}\n", 3,
			"nvidia.com/gpu.shared", "nvidia.com/gpu.shared", 4, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := dpconfig.Parse([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			if res, n := (semantics{}).expected(f.Config(), tc.gpus); res != tc.res || n != tc.count {
				t.Errorf("gpuslice-plugin: got %d %s, want %d %s", n, res, tc.count, tc.res)
			}
			if res, n := (semantics{nvidia: true}).expected(f.Config(), tc.gpus); res != tc.nvidiaRes || n != tc.nvidiaCount {
				t.Errorf("NVIDIA: got %d %s, want %d %s", n, res, tc.nvidiaCount, tc.nvidiaRes)
			}
		})
	}
}

// A config that renames the shared resource may not go to 1 replica: that
// advertises plain nvidia.com/gpu, and pods asking for the shared name
// never run again.
func TestFloor(t *testing.T) {
	for _, tc := range []struct {
		doc          string
		plugin, nvml int
	}{
		{"sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}\n", 0, 0},
		{"sharing: {timeSlicing: {renameByDefault: true, resources: [{name: nvidia.com/gpu, replicas: 4}]}}\n", 2, 2},
		{"sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, rename: gpu-shared, replicas: 4}]}}\n", 2, 0},
		{"version: v1\n", 0, 0},
	} {
		f, err := dpconfig.Parse([]byte(tc.doc))
		if err != nil {
			t.Fatal(err)
		}
		if got := (semantics{}).floor(f.Config()); got != tc.plugin {
			t.Errorf("gpuslice-plugin floor of %q = %d, want %d", tc.doc, got, tc.plugin)
		}
		if got := (semantics{nvidia: true}).floor(f.Config()); got != tc.nvml {
			t.Errorf("NVIDIA floor of %q = %d, want %d", tc.doc, got, tc.nvml)
		}
	}
}

func TestMarkExclusive(t *testing.T) {
	gpu := func(uuid, index string) policy.GPUObservation {
		return policy.GPUObservation{UUID: uuid, Samples: []policy.Sample{{GPU: index}}}
	}
	gpus := []policy.GPUObservation{gpu("GPU-a", "0"), gpu("GPU-bbbbbbbb-0000-4000-8000-000000000000", "1"), gpu("GPU-c", "")}
	for _, tc := range []struct {
		devices string
		nvidia  bool
		want    []bool
	}{
		{"all", false, []bool{false, false, false}},
		{"1", false, []bool{false, true, false}}, // GPU-c: index unknown, taken as shared
		{"['1']", false, []bool{true, false, false}},
		{"['GPU-bbbbbbbb-0000-4000-8000-000000000000']", false, []bool{true, false, true}},
		{"['1']", true, []bool{false, false, false}}, // NVIDIA slices every GPU
	} {
		f, err := dpconfig.Parse([]byte("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, devices: " + tc.devices + ", replicas: 4}]}}\n"))
		if err != nil {
			t.Fatal(err)
		}
		out := semantics{nvidia: tc.nvidia}.markExclusive(f.Config(), gpus)
		if len(out) != len(tc.want) {
			t.Fatalf("devices %s (nvidia %v): %d GPUs out of %d", tc.devices, tc.nvidia, len(out), len(gpus))
		}
		for i, g := range out {
			if g.Exclusive != tc.want[i] {
				t.Errorf("devices %s (nvidia %v): %s exclusive = %v, want %v", tc.devices, tc.nvidia, g.UUID, g.Exclusive, tc.want[i])
			}
		}
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

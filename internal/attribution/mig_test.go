package attribution

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/pods"
)

// MIG device UUIDs as NVML prints them from driver R470 on, and one in the
// form of R450/R460, which names its GPU.
const (
	migA1  = "MIG-4ec5b3ae-5a4c-5c4f-a8a5-9d0f3e8e6b11" // gpuA, GI 1 CI 0
	migA2  = "MIG-c6d4f1f9-1ba4-5a9e-8e1f-6b3a7e9d2c22" // gpuA, GI 2 CI 0
	migB1  = "MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c44" // gpuB, known from an earlier reading only
	migOld = "MIG-" + gpuB + "/13/0"
	migX   = "MIG-99999999-8888-7777-6666-555555555555" // on no GPU ever read
)

// migGPU is gpuA with MIG on and two MIG devices.
func migGPU(procs ...gpu.Process) gpu.Device {
	return gpu.Device{Index: 0, UUID: gpuA, MIGEnabled: true, Processes: procs, MIGDevices: []gpu.MIGDevice{
		{Index: 0, UUID: migA1, GPUInstanceID: 1, ComputeInstanceID: 0, MemoryTotalBytes: 20 * gib, HasMemory: true},
		{Index: 1, UUID: migA2, GPUInstanceID: 2, ComputeInstanceID: 0, MemoryTotalBytes: 10 * gib, HasMemory: true},
	}}
}

func migProc(pid int, mem uint64, gi, ci int) gpu.Process {
	return gpu.Process{PID: pid, UsedMemoryBytes: mem, InMIG: true, GPUInstanceID: gi, ComputeInstanceID: ci}
}

func TestJoinMIG(t *testing.T) {
	source := pods.NewStatic([]*corev1.Pod{
		mkPod("ml", "small", "u-small", "main"),
		mkPod("ml", "big", "u-big", "main"),
		mkPod("ml", "two", "u-two", "a", "b"),
	})
	const (
		res1g = "nvidia.com/mig-1g.10gb"
		res2g = "nvidia.com/mig-2g.20gb"
		resG  = "nvidia.com/gpu"
	)
	tests := []struct {
		name     string
		in       Input
		usage    []Usage
		migUsage []MIGUsage
		hold     []Holding
		migHold  []MIGHolding
		alloc    map[ResourceGPU]int
		replicas map[ResourceGPU]int
	}{{
		name: "mixed strategy: each pod's MIG device counts on its GPU, memory per instance",
		in: Input{
			Devices: []gpu.Device{migGPU(migProc(10, 3*gib, 1, 0), migProc(20, 1*gib, 2, 0), migProc(21, 2*gib, 2, 0))},
			Refs:    map[int]ProcessRef{10: ref("u-big", "main"), 20: ref("u-small", "main"), 21: ref("u-small", "main")},
			Allocations: []podresources.Allocation{
				alloc("ml", "big", "main", res2g, migA1),
				alloc("ml", "small", "main", res1g, migA2),
			},
			Allocatable: []podresources.Allocatable{
				{Resource: res2g, DeviceIDs: []string{migA1}},
				{Resource: res1g, DeviceIDs: []string{migA2}},
			},
		},
		usage: []Usage{
			{Container: ctr("ml", "big", "main", "u-big"), UUID: gpuA, MemoryBytes: 3 * gib, Processes: 1},
			{Container: ctr("ml", "small", "main", "u-small"), UUID: gpuA, MemoryBytes: 3 * gib, Processes: 2},
		},
		migUsage: []MIGUsage{
			{Container: ctr("ml", "big", "main", "u-big"), UUID: gpuA, MIGUUID: migA1, MemoryBytes: 3 * gib, Processes: 1},
			{Container: ctr("ml", "small", "main", "u-small"), UUID: gpuA, MIGUUID: migA2, MemoryBytes: 3 * gib, Processes: 2},
		},
		hold: []Holding{
			{Container: ctr("ml", "big", "main", ""), UUID: gpuA, Resource: res2g, IDs: 1},
			{Container: ctr("ml", "small", "main", ""), UUID: gpuA, Resource: res1g, IDs: 1},
		},
		migHold: []MIGHolding{
			{Container: ctr("ml", "big", "main", ""), UUID: gpuA, MIGUUID: migA1, IDs: 1},
			{Container: ctr("ml", "small", "main", ""), UUID: gpuA, MIGUUID: migA2, IDs: 1},
		},
		alloc:    map[ResourceGPU]int{{gpuA, res2g}: 1, {gpuA, res1g}: 1},
		replicas: map[ResourceGPU]int{{gpuA, res2g}: 1, {gpuA, res1g}: 1},
	}, {
		name: "single strategy with time-slicing: replicas of a MIG device; unknown compute instance; a process in no listed instance",
		in: Input{
			// PID 31's compute instance is unknown, and GI 2 has one MIG
			// device; PID 32 is in a GI that NVML gave no MIG device for.
			Devices: []gpu.Device{migGPU(migProc(30, 2*gib, 1, 0), migProc(31, 1*gib, 2, -1), migProc(32, 1*gib, 9, 0))},
			Refs:    map[int]ProcessRef{30: ref("u-big", "main"), 31: ref("u-big", "main"), 32: ref("u-big", "main")},
			Allocations: []podresources.Allocation{
				alloc("ml", "big", "main", resG, migA1+"::0", migA1+"::3", migA2+"::1"),
			},
			Allocatable: []podresources.Allocatable{{Resource: resG, DeviceIDs: []string{
				migA1 + "::0", migA1 + "::1", migA1 + "::2", migA1 + "::3", migA2 + "::0", migA2 + "::1",
			}}},
		},
		usage: []Usage{{Container: ctr("ml", "big", "main", "u-big"), UUID: gpuA, MemoryBytes: 4 * gib, Processes: 3}},
		migUsage: []MIGUsage{
			{Container: ctr("ml", "big", "main", "u-big"), UUID: gpuA, MIGUUID: migA1, MemoryBytes: 2 * gib, Processes: 1},
			{Container: ctr("ml", "big", "main", "u-big"), UUID: gpuA, MIGUUID: migA2, MemoryBytes: 1 * gib, Processes: 1},
		},
		hold: []Holding{{Container: ctr("ml", "big", "main", ""), UUID: gpuA, Resource: resG, IDs: 3}},
		migHold: []MIGHolding{
			{Container: ctr("ml", "big", "main", ""), UUID: gpuA, MIGUUID: migA1, IDs: 2},
			{Container: ctr("ml", "big", "main", ""), UUID: gpuA, MIGUUID: migA2, IDs: 1},
		},
		alloc:    map[ResourceGPU]int{{gpuA, resG}: 3},
		replicas: map[ResourceGPU]int{{gpuA, resG}: 6},
	}, {
		name: "GPU not read now: old-form IDs name their GPU, new-form ones come from earlier readings, others are not counted",
		in: Input{
			// gpuA is read, with MIG devices of its own; gpuB is not.
			Devices:    []gpu.Device{migGPU()},
			MIGParents: map[string]string{migB1: gpuB},
			Allocations: []podresources.Allocation{
				alloc("ml", "small", "main", res1g, migOld, migB1, migX),
			},
			Allocatable: []podresources.Allocatable{{Resource: res1g, DeviceIDs: []string{migOld, migB1, migX}}},
		},
		hold: []Holding{{Container: ctr("ml", "small", "main", ""), UUID: gpuB, Resource: res1g, IDs: 2}},
		migHold: []MIGHolding{
			{Container: ctr("ml", "small", "main", ""), UUID: gpuB, MIGUUID: migB1, IDs: 1},
			{Container: ctr("ml", "small", "main", ""), UUID: gpuB, MIGUUID: migOld, IDs: 1},
		},
		alloc:    map[ResourceGPU]int{{gpuB, res1g}: 2},
		replicas: map[ResourceGPU]int{{gpuB, res1g}: 2},
	}, {
		name: "one container holding two MIG profiles of one GPU: a holding per resource; its process not in status yet still found",
		in: Input{
			Devices: []gpu.Device{migGPU(migProc(40, 1*gib, 1, 0))},
			Refs:    map[int]ProcessRef{40: {PodUID: "u-two", ContainerID: "not-yet-in-status"}},
			Allocations: []podresources.Allocation{
				alloc("ml", "two", "a", res2g, migA1),
				alloc("ml", "two", "a", res1g, migA2),
			},
		},
		usage:    []Usage{{Container: ctr("ml", "two", "a", "u-two"), UUID: gpuA, MemoryBytes: 1 * gib, Processes: 1}},
		migUsage: []MIGUsage{{Container: ctr("ml", "two", "a", "u-two"), UUID: gpuA, MIGUUID: migA1, MemoryBytes: 1 * gib, Processes: 1}},
		hold: []Holding{
			{Container: ctr("ml", "two", "a", ""), UUID: gpuA, Resource: res1g, IDs: 1},
			{Container: ctr("ml", "two", "a", ""), UUID: gpuA, Resource: res2g, IDs: 1},
		},
		migHold: []MIGHolding{
			{Container: ctr("ml", "two", "a", ""), UUID: gpuA, MIGUUID: migA1, IDs: 1},
			{Container: ctr("ml", "two", "a", ""), UUID: gpuA, MIGUUID: migA2, IDs: 1},
		},
		alloc: map[ResourceGPU]int{{gpuA, res2g}: 1, {gpuA, res1g}: 1},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Pods = source
			got := Join(tc.in)
			for _, c := range []struct {
				what      string
				want, got any
			}{
				{"usage", tc.usage, got.Usage},
				{"MIG usage", tc.migUsage, got.MIGUsage},
				{"holdings", tc.hold, got.Holdings},
				{"MIG holdings", tc.migHold, got.MIGHoldings},
				{"allocated", orEmpty(tc.alloc), got.Allocated},
				{"replicas", orEmpty(tc.replicas), got.Replicas},
			} {
				if diff := cmp.Diff(c.want, c.got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", c.what, diff)
				}
			}
		})
	}
}

func orEmpty(m map[ResourceGPU]int) map[ResourceGPU]int {
	if m == nil {
		return map[ResourceGPU]int{}
	}
	return m
}

// TestJoinMemoryNotAvailable: a process whose memory the driver does not
// give makes its container's figures, on its GPU and its MIG device, and
// its GPU's unattributed figure, lower bounds (MemoryUnknown); a
// container beside it keeps its own.
func TestJoinMemoryNotAvailable(t *testing.T) {
	source := pods.NewStatic([]*corev1.Pod{mkPod("ml", "big", "u-big", "main"), mkPod("ml", "small", "u-small", "main")})
	na := migProc(11, 0, 1, 0)
	na.MemoryUnknown = true
	host := migProc(30, 0, 2, 0)
	host.MemoryUnknown = true
	res := Join(Input{
		Devices: []gpu.Device{migGPU(migProc(10, 3*gib, 1, 0), na, migProc(20, gib, 2, 0), host)},
		Refs:    map[int]ProcessRef{10: ref("u-big", "main"), 11: ref("u-big", "main"), 20: ref("u-small", "main")},
		Pods:    source,
	})
	unknown := map[string]bool{}
	for _, u := range res.Usage {
		unknown[u.Pod] = u.MemoryUnknown
	}
	for _, u := range res.MIGUsage {
		unknown[u.Pod+" "+u.MIGUUID] = u.MemoryUnknown
	}
	want := map[string]bool{"big": true, "small": false, "big " + migA1: true, "small " + migA2: false}
	if diff := cmp.Diff(want, unknown); diff != "" {
		t.Errorf("MemoryUnknown by container (-want +got):\n%s", diff)
	}
	if !res.UnattributedUnknown[gpuA] {
		t.Errorf("unattributed memory of %s not marked a lower bound: %v", gpuA, res.UnattributedUnknown)
	}
}

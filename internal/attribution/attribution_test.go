package attribution

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/pods"
)

const (
	gpuA = "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348"
	gpuB = "GPU-f1111111-2222-3333-4444-555555555555"
	gib  = uint64(1) << 30
)

func mkPod(ns, name, uid string, containers ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
	for _, c := range containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: c, ContainerID: "containerd://" + uid + "-" + c})
	}
	return p
}

func proc(pid int, mem uint64, sm float64) gpu.Process {
	return gpu.Process{PID: pid, UsedMemoryBytes: mem, SMUtilization: sm, HasSMUtilization: sm >= 0}
}

func ref(uid, c string) ProcessRef { return ProcessRef{PodUID: uid, ContainerID: uid + "-" + c} }

func alloc(ns, pod, c, res string, ids ...string) podresources.Allocation {
	return podresources.Allocation{Namespace: ns, Pod: pod, Container: c, Resource: res, DeviceIDs: ids}
}

func ctr(ns, pod, c, uid string) Container {
	return Container{Namespace: ns, Pod: pod, Container: c, PodUID: uid}
}

func TestJoin(t *testing.T) {
	source := pods.NewStatic([]*corev1.Pod{
		mkPod("ml", "yolo", "u-yolo", "detector"),
		mkPod("ml", "rife", "u-rife", "interp", "sidecar"),
		mkPod("ml", "wide", "u-wide", "train"),
		mkPod("ml", "fresh", "u-fresh", "main", "logger"),
	})
	const res = "nvidia.com/gpu"
	tests := []struct {
		name  string
		in    Input
		usage []Usage
		unatt map[string]uint64
		hold  []Holding
		alloc map[ResourceGPU]int
	}{
		{
			name: "two pods share one GPU holding two replica IDs each: memory counted once per container",
			in: Input{
				Devices: []gpu.Device{{Index: 0, UUID: gpuA, Processes: []gpu.Process{proc(10, 4*gib, 0.3), proc(20, 6*gib, 0.2)}}},
				Refs:    map[int]ProcessRef{10: ref("u-yolo", "detector"), 20: ref("u-rife", "interp")},
				Allocations: []podresources.Allocation{
					alloc("ml", "yolo", "detector", res, gpuA+"::0", gpuA+"::1"),
					alloc("ml", "rife", "interp", res, gpuA+"::2", gpuA+"::3"),
				},
				Allocatable: []podresources.Allocatable{{Resource: res, DeviceIDs: []string{gpuA + "::0", gpuA + "::1", gpuA + "::2", gpuA + "::3", gpuA + "::4", gpuA + "::5"}}},
			},
			usage: []Usage{
				{Container: ctr("ml", "rife", "interp", "u-rife"), UUID: gpuA, MemoryBytes: 6 * gib, SMUtilization: 0.2, HasSM: true, Processes: 1},
				{Container: ctr("ml", "yolo", "detector", "u-yolo"), UUID: gpuA, MemoryBytes: 4 * gib, SMUtilization: 0.3, HasSM: true, Processes: 1},
			},
			unatt: map[string]uint64{gpuA: 0},
			hold: []Holding{
				{Container: ctr("ml", "rife", "interp", ""), UUID: gpuA, Resource: res, IDs: 2},
				{Container: ctr("ml", "yolo", "detector", ""), UUID: gpuA, Resource: res, IDs: 2},
			},
			alloc: map[ResourceGPU]int{{gpuA, res}: 4},
		},
		{
			name: "one container with two processes sums them; SM capped at 1; host process unattributed",
			in: Input{
				Devices: []gpu.Device{{Index: 0, UUID: gpuA, Processes: []gpu.Process{proc(10, 1*gib, 0.7), proc(11, 2*gib, 0.6), proc(99, 3*gib, -1)}}},
				Refs:    map[int]ProcessRef{10: ref("u-yolo", "detector"), 11: ref("u-yolo", "detector")},
			},
			usage: []Usage{{Container: ctr("ml", "yolo", "detector", "u-yolo"), UUID: gpuA, MemoryBytes: 3 * gib, SMUtilization: 1, HasSM: true, Processes: 2}},
			unatt: map[string]uint64{gpuA: 3 * gib},
		},
		{
			name: "a pod on two GPUs gets a series per GPU",
			in: Input{
				Devices: []gpu.Device{
					{Index: 0, UUID: gpuA, Processes: []gpu.Process{proc(30, 5*gib, -1)}},
					{Index: 1, UUID: gpuB, Processes: []gpu.Process{proc(30, 7*gib, -1)}},
				},
				Refs:        map[int]ProcessRef{30: ref("u-wide", "train")},
				Allocations: []podresources.Allocation{alloc("ml", "wide", "train", res, gpuA, gpuB)},
			},
			usage: []Usage{
				{Container: ctr("ml", "wide", "train", "u-wide"), UUID: gpuA, MemoryBytes: 5 * gib, Processes: 1},
				{Container: ctr("ml", "wide", "train", "u-wide"), GPUIndex: 1, UUID: gpuB, MemoryBytes: 7 * gib, Processes: 1},
			},
			unatt: map[string]uint64{gpuA: 0, gpuB: 0},
			hold: []Holding{
				{Container: ctr("ml", "wide", "train", ""), UUID: gpuA, Resource: res, IDs: 1},
				{Container: ctr("ml", "wide", "train", ""), UUID: gpuB, Resource: res, IDs: 1},
			},
			alloc: map[ResourceGPU]int{{gpuA, res}: 1, {gpuB, res}: 1},
		},
		{
			name: "a process whose /proc entry vanished and an unknown pod UID are both unattributed",
			in: Input{
				Devices: []gpu.Device{{Index: 0, UUID: gpuA, Processes: []gpu.Process{proc(40, 1*gib, -1), proc(41, 2*gib, -1)}}},
				Refs:    map[int]ProcessRef{41: {PodUID: "u-unknown", ContainerID: "x"}},
				Gone:    map[int]bool{40: true},
			},
			// The GPU reading listed PID 40's memory and counted it in the
			// device's used memory: it stays in the sum.
			unatt: map[string]uint64{gpuA: 3 * gib},
		},
		{
			name: "container ID not in status yet: the pod's only GPU holder gets it",
			in: Input{
				Devices:     []gpu.Device{{Index: 0, UUID: gpuA, Processes: []gpu.Process{proc(50, 1*gib, -1)}}},
				Refs:        map[int]ProcessRef{50: {PodUID: "u-fresh", ContainerID: "not-yet-in-status"}},
				Allocations: []podresources.Allocation{alloc("ml", "fresh", "main", "nvidia.com/gpu.shared", gpuA+"::7"), alloc("ml", "fresh", "logger", "cpu", "3")},
			},
			usage: []Usage{{Container: ctr("ml", "fresh", "main", "u-fresh"), UUID: gpuA, MemoryBytes: 1 * gib, Processes: 1}},
			unatt: map[string]uint64{gpuA: 0},
			hold:  []Holding{{Container: ctr("ml", "fresh", "main", ""), UUID: gpuA, Resource: "nvidia.com/gpu.shared", IDs: 1}},
			alloc: map[ResourceGPU]int{{gpuA, "nvidia.com/gpu.shared"}: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Pods = source
			got := Join(tc.in)
			if diff := cmp.Diff(tc.usage, got.Usage); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.unatt, got.Unattributed); diff != "" {
				t.Errorf("unattributed (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.hold, got.Holdings); diff != "" {
				t.Errorf("holdings (-want +got):\n%s", diff)
			}
			if tc.alloc == nil {
				tc.alloc = map[ResourceGPU]int{}
			}
			if diff := cmp.Diff(tc.alloc, got.Allocated); diff != "" {
				t.Errorf("allocated (-want +got):\n%s", diff)
			}
		})
	}
}

func TestJoinReplicas(t *testing.T) {
	got := Join(Input{Allocatable: []podresources.Allocatable{
		{Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuA + "::0", gpuA + "::1", gpuB}},
		{Resource: "example.com/fpga", DeviceIDs: []string{"fpga0"}},
	}})
	want := map[ResourceGPU]int{{gpuA, "nvidia.com/gpu"}: 2, {gpuB, "nvidia.com/gpu"}: 1}
	if diff := cmp.Diff(want, got.Replicas); diff != "" {
		t.Errorf("replicas (-want +got):\n%s", diff)
	}
}

package gputest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
)

func TestSnapshot(t *testing.T) {
	got := gputest.Snapshot(
		gputest.GPU("GPU-a", 100, gputest.Proc(1, 10, 0.5), gputest.ProcNoSample(2, 20)),
		gputest.GPU("GPU-b", 100).WithError("lost"),
		gputest.GPU("GPU-c", 100, gputest.Proc(3, 10, 0)).WithMemoryUsed(50).WithUtilization(0.25),
	)
	want := gpu.Snapshot{
		DriverVersion: "sim",
		Devices: []gpu.Device{
			{Index: 0, UUID: "GPU-a", Name: gputest.DefaultName, MemoryTotalBytes: 100, MemoryUsedBytes: 30, Processes: []gpu.Process{
				{PID: 1, UsedMemoryBytes: 10, SMUtilization: 0.5, HasSMUtilization: true},
				{PID: 2, UsedMemoryBytes: 20},
			}},
			{Index: 2, UUID: "GPU-c", Name: gputest.DefaultName, MemoryTotalBytes: 100, MemoryUsedBytes: 50, Utilization: 0.25, Processes: []gpu.Process{
				{PID: 3, UsedMemoryBytes: 10, HasSMUtilization: true},
			}},
		},
		Failed: []gpu.DeviceError{{Index: 1, UUID: "GPU-b", Err: errors.New("lost")}},
	}
	byMessage := cmp.Comparer(func(a, b error) bool { return a.Error() == b.Error() })
	if diff := cmp.Diff(want, got, byMessage); diff != "" {
		t.Errorf("Snapshot (-want +got):\n%s", diff)
	}
}

func TestXids(t *testing.T) {
	got := gputest.Xids(
		gputest.GPU("GPU-b", 1).WithXids(79, 13, 79),
		gputest.GPU("GPU-a", 1).WithXids(48),
	)
	want := []gpu.XidCount{
		{UUID: "GPU-a", Index: 1, Xid: 48, Count: 1},
		{UUID: "GPU-b", Index: 0, Xid: 13, Count: 1},
		{UUID: "GPU-b", Index: 0, Xid: 79, Count: 2},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Xids (-want +got):\n%s", diff)
	}
}

func TestWithXidsDoesNotShare(t *testing.T) {
	base := gputest.GPU("GPU-a", 1).WithXids(1)
	a, b := base.WithXids(2), base.WithXids(3)
	if fmt.Sprint(a.Xids, b.Xids, base.Xids) != "[1 2] [1 3] [1]" {
		t.Errorf("WithXids shares its slice: %v %v %v", a.Xids, b.Xids, base.Xids)
	}
}

func TestNode(t *testing.T) {
	gpus := gputest.Node(8, 64)
	pids := map[int]bool{}
	for i, g := range gpus {
		if g.UUID != gputest.UUID(i) || len(g.Processes) != 64 {
			t.Fatalf("gpu %d: %s with %d processes", i, g.UUID, len(g.Processes))
		}
		for _, p := range g.Processes {
			if pids[p.PID] {
				t.Fatalf("pid %d twice on the node", p.PID)
			}
			pids[p.PID] = true
		}
	}
	// The scenario must be one the sim backend accepts.
	b, _ := gputest.NewSim(t, gpus...)
	s, err := b.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Devices) != 8 {
		t.Errorf("sim read %d GPUs", len(s.Devices))
	}
}

func TestFake(t *testing.T) {
	ctx := context.Background()
	f := gputest.NewFake(gputest.GPU("GPU-a", 100, gputest.Proc(1, 10, 0.5)).WithXids(79))

	s, err := f.Snapshot(ctx)
	if err != nil || len(s.Devices) != 1 || s.Devices[0].MemoryUsedBytes != 10 {
		t.Fatalf("Snapshot: %+v, %v", s, err)
	}
	// What the caller does to its copy does not reach the Fake.
	s.Devices[0].Processes[0].PID = 99
	if s2, _ := f.Snapshot(ctx); s2.Devices[0].Processes[0].PID != 1 {
		t.Errorf("Snapshot shares memory with its caller")
	}
	if diff := cmp.Diff([]gpu.XidCount{{UUID: "GPU-a", Xid: 79, Count: 1}}, f.Xids()); diff != "" {
		t.Errorf("Xids (-want +got):\n%s", diff)
	}

	f.SetError(fmt.Errorf("%w: test", gpu.ErrUnavailable))
	if _, err := f.Snapshot(ctx); !errors.Is(err, gpu.ErrUnavailable) {
		t.Errorf("Snapshot after SetError: %v", err)
	}
	f.Set(gputest.GPU("GPU-b", 1), gputest.GPU("GPU-c", 1))
	if s, err := f.Snapshot(ctx); err != nil || len(s.Devices) != 2 {
		t.Errorf("Snapshot after Set: %+v, %v", s, err)
	}
	f.SetXids(gpu.XidCount{UUID: "z", Xid: 1, Count: 1}, gpu.XidCount{UUID: "a", Xid: 2, Count: 5})
	if x := f.Xids(); len(x) != 2 || x[0].UUID != "a" {
		t.Errorf("SetXids not sorted: %v", x)
	}
	if got := f.Snapshots(); got != 4 {
		t.Errorf("Snapshots() = %d, want 4", got)
	}
	if f.Closed() {
		t.Error("Closed before Close")
	}
	f.Close()
	if !f.Closed() {
		t.Error("not Closed after Close")
	}
}

// TestMIGThroughSimFile: a MIG scenario reads back from the sim backend as
// Snapshot describes it.
func TestMIGThroughSimFile(t *testing.T) {
	g := gputest.GPU(gputest.UUID(0), 40<<30,
		gpu.Process{PID: 10, UsedMemoryBytes: 3 << 30, InMIG: true, GPUInstanceID: 1, ComputeInstanceID: 0},
		gpu.Process{PID: 20, UsedMemoryBytes: 1 << 30, InMIG: true, GPUInstanceID: 2, ComputeInstanceID: 0},
	).WithMIG(
		gpu.MIGDevice{Index: 0, UUID: "MIG-4ec5b3ae-5a4c-5c4f-a8a5-9d0f3e8e6b11", Name: "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
			GPUInstanceID: 1, MemoryTotalBytes: 20 << 30, MemoryUsedBytes: 3 << 30, HasMemory: true},
		gpu.MIGDevice{Index: 1, UUID: "MIG-c6d4f1f9-1ba4-5a9e-8e1f-6b3a7e9d2c22", GPUInstanceID: 2,
			MemoryTotalBytes: 10 << 30, MemoryUsedBytes: 2 << 30, HasMemory: true},
	)
	b, _ := gputest.NewSim(t, g)
	got, err := b.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(gputest.Snapshot(g), got); diff != "" {
		t.Errorf("sim snapshot (-want +got):\n%s", diff)
	}
}

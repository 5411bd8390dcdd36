package nvmlbackend_test

import (
	"errors"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	mockserver "github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/internal/gpu"
	nvmlbackend "github.com/gpuslice/gpuslice/internal/gpu/nvml"
)

// migSlot is one MIG device of a mocked MIG-enabled GPU, or an empty slot
// (nil) where NVML answers ERROR_NOT_FOUND.
type migSlot struct {
	uuid     string
	gi, ci   int
	name     string
	total    uint64
	used     uint64
	memRet   nvml.Return // of GetMemoryInfo; SUCCESS when zero
	uuidRet  nvml.Return // of GetUUID; SUCCESS when zero
	handleOK bool        // false: GetMigDeviceHandleByIndex fails with ERROR_UNKNOWN
	// procs is what the MIG handle lists; NVML fills the instance IDs
	// there too.
	procs []nvml.ProcessInfo
}

func orSuccess(r nvml.Return) nvml.Return {
	if r == 0 {
		return nvml.SUCCESS
	}
	return r
}

// enableMIG turns MIG on for g, with these MIG device slots. Every call the
// backend may make on a MIG handle is set; any other call panics, as
// go-nvml's mocks do.
func enableMIG(g *mockserver.Device, slots []*migSlot) {
	g.MigMode = nvml.DEVICE_MIG_ENABLE
	g.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return len(slots), nvml.SUCCESS }
	g.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < 0 || i >= len(slots) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		s := slots[i]
		if s == nil {
			return nil, nvml.ERROR_NOT_FOUND
		}
		if !s.handleOK {
			return nil, nvml.ERROR_UNKNOWN
		}
		return &mock.Device{
			GetUUIDFunc:              func() (string, nvml.Return) { return s.uuid, orSuccess(s.uuidRet) },
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return s.gi, nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return s.ci, nvml.SUCCESS },
			GetNameFunc:              func() (string, nvml.Return) { return s.name, nvml.SUCCESS },
			GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
				return s.procs, nvml.SUCCESS
			},
			GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
				return nvml.Memory{Total: s.total, Used: s.used, Free: s.total - s.used}, orSuccess(s.memRet)
			},
		}, nvml.SUCCESS
	}
	// NVML answers NOT_SUPPORTED for device and process utilization with
	// MIG on.
	g.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED }
	g.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
}

const (
	mig1 = "MIG-4ec5b3ae-5a4c-5c4f-a8a5-9d0f3e8e6b11"
	mig2 = "MIG-c6d4f1f9-1ba4-5a9e-8e1f-6b3a7e9d2c22"
	// The form of drivers R450 and R460.
	migOld = "MIG-GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5/13/0"
)

func TestMIG(t *testing.T) {
	tests := []struct {
		name  string
		slots []*migSlot
		procs []nvml.ProcessInfo
		// procsRet is the return of the GPU's own process list.
		procsRet nvml.Return
		want     []gpu.MIGDevice
		// wantProcs are the processes' instance fields, by PID order.
		wantProcs []gpu.Process
	}{{
		name: "two instances, one empty slot, processes in each",
		slots: []*migSlot{
			{uuid: mig1, gi: 1, ci: 0, name: "NVIDIA A100-SXM4-40GB MIG 3g.20gb", total: 20 * gib, used: 3 * gib, handleOK: true},
			nil,
			{uuid: mig2, gi: 2, ci: 0, name: "NVIDIA A100-SXM4-40GB MIG 2g.10gb", total: 10 * gib, used: 1 * gib, handleOK: true},
		},
		procs: []nvml.ProcessInfo{
			{Pid: 20, UsedGpuMemory: 1 * gib, GpuInstanceId: 2, ComputeInstanceId: 0},
			{Pid: 10, UsedGpuMemory: 3 * gib, GpuInstanceId: 1, ComputeInstanceId: 0},
			// A driver that gives the GPU instance but not the compute one.
			{Pid: 30, UsedGpuMemory: 0, GpuInstanceId: 1, ComputeInstanceId: 0xFFFFFFFF},
			// Outside any instance (the driver says so with 0xFFFFFFFF).
			{Pid: 40, UsedGpuMemory: 0, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF},
		},
		want: []gpu.MIGDevice{
			{Index: 0, UUID: mig1, Name: "NVIDIA A100-SXM4-40GB MIG 3g.20gb", GPUInstanceID: 1, ComputeInstanceID: 0,
				MemoryTotalBytes: 20 * gib, MemoryUsedBytes: 3 * gib, HasMemory: true},
			{Index: 2, UUID: mig2, Name: "NVIDIA A100-SXM4-40GB MIG 2g.10gb", GPUInstanceID: 2, ComputeInstanceID: 0,
				MemoryTotalBytes: 10 * gib, MemoryUsedBytes: 1 * gib, HasMemory: true},
		},
		wantProcs: []gpu.Process{
			{PID: 10, UsedMemoryBytes: 3 * gib, InMIG: true, GPUInstanceID: 1, ComputeInstanceID: 0},
			{PID: 20, UsedMemoryBytes: 1 * gib, InMIG: true, GPUInstanceID: 2, ComputeInstanceID: 0},
			{PID: 30, InMIG: true, GPUInstanceID: 1, ComputeInstanceID: -1},
			{PID: 40},
		},
	}, {
		name: "old UUID form, memory not readable, one handle and one UUID failing",
		slots: []*migSlot{
			{uuid: migOld, gi: 13, ci: 0, name: "NVIDIA A100-SXM4-40GB MIG 1g.5gb", memRet: nvml.ERROR_NOT_SUPPORTED, handleOK: true},
			{uuid: mig1, gi: 5, ci: 0, handleOK: false},
			{uuid: mig2, gi: 6, ci: 0, uuidRet: nvml.ERROR_UNKNOWN, handleOK: true},
		},
		want: []gpu.MIGDevice{
			{Index: 0, UUID: migOld, Name: "NVIDIA A100-SXM4-40GB MIG 1g.5gb", GPUInstanceID: 13, ComputeInstanceID: 0},
		},
	}, {
		// Without the privileges for the whole GPU's list, NVML answers
		// NO_PERMISSION there; each MIG handle still lists its own.
		name:     "unprivileged: processes come from the MIG devices' lists",
		procsRet: nvml.ERROR_NO_PERMISSION,
		slots: []*migSlot{
			{uuid: mig1, gi: 1, ci: 0, total: 20 * gib, used: 3 * gib, handleOK: true,
				procs: []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 3 * gib, GpuInstanceId: 1, ComputeInstanceId: 0}}},
			{uuid: mig2, gi: 2, ci: 0, total: 10 * gib, used: 1 * gib, handleOK: true,
				procs: []nvml.ProcessInfo{{Pid: 20, UsedGpuMemory: 1 * gib, GpuInstanceId: 2, ComputeInstanceId: 0}}},
		},
		want: []gpu.MIGDevice{
			{Index: 0, UUID: mig1, GPUInstanceID: 1, ComputeInstanceID: 0, MemoryTotalBytes: 20 * gib, MemoryUsedBytes: 3 * gib, HasMemory: true},
			{Index: 1, UUID: mig2, GPUInstanceID: 2, ComputeInstanceID: 0, MemoryTotalBytes: 10 * gib, MemoryUsedBytes: 1 * gib, HasMemory: true},
		},
		wantProcs: []gpu.Process{
			{PID: 10, UsedMemoryBytes: 3 * gib, InMIG: true, GPUInstanceID: 1, ComputeInstanceID: 0},
			{PID: 20, UsedMemoryBytes: 1 * gib, InMIG: true, GPUInstanceID: 2, ComputeInstanceID: 0},
		},
	}, {
		name: "the GPU's list gives no instance; the MIG device's list places the process, counted once",
		slots: []*migSlot{
			{uuid: mig1, gi: 1, ci: 0, total: 20 * gib, used: 2 * gib, handleOK: true,
				procs: []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 2 * gib, GpuInstanceId: 1, ComputeInstanceId: 0}}},
		},
		procs: []nvml.ProcessInfo{
			{Pid: 10, UsedGpuMemory: 2 * gib, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF},
		},
		want: []gpu.MIGDevice{
			{Index: 0, UUID: mig1, GPUInstanceID: 1, ComputeInstanceID: 0, MemoryTotalBytes: 20 * gib, MemoryUsedBytes: 2 * gib, HasMemory: true},
		},
		wantProcs: []gpu.Process{{PID: 10, UsedMemoryBytes: 2 * gib, InMIG: true, GPUInstanceID: 1, ComputeInstanceID: 0}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			g := n.gpus[2]
			enableMIG(g, tc.slots)
			g.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return tc.procs, orSuccess(tc.procsRet) }
			s := snapshot(t, n.open(t))
			if len(s.Failed) != 0 || len(s.Devices) != 8 {
				t.Fatalf("Failed %v, %d devices; want 8 read", s.Failed, len(s.Devices))
			}
			d := s.Devices[2]
			if !d.MIGEnabled {
				t.Errorf("GPU 2 MIGEnabled false, want true")
			}
			if !d.Missing.Has(gpu.ReadingUtilization) {
				t.Errorf("GPU 2 utilization not missing with MIG on")
			}
			if diff := cmp.Diff(tc.want, d.MIGDevices); diff != "" {
				t.Errorf("MIG devices (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantProcs, d.Processes); diff != "" {
				t.Errorf("processes (-want +got):\n%s", diff)
			}
			// MIG off elsewhere: no MIG device is asked for.
			if s.Devices[1].MIGEnabled || s.Devices[1].MIGDevices != nil {
				t.Errorf("GPU 1 without MIG: %+v", s.Devices[1].MIGDevices)
			}
		})
	}
}

// TestMIGModeReading: a GPU that does not support MIG is a GPU without MIG;
// one whose MIG reading says the GPU is gone fails.
func TestMIGModeReading(t *testing.T) {
	for _, tc := range []struct {
		ret    nvml.Return
		failed bool
	}{
		{nvml.ERROR_NOT_SUPPORTED, false},
		{nvml.ERROR_UNKNOWN, false},
		{nvml.ERROR_GPU_IS_LOST, true},
	} {
		t.Run(tc.ret.Error(), func(t *testing.T) {
			n := newNode(t)
			n.gpus[4].GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, tc.ret }
			b, logs := n.openLogged(t)
			s := snapshot(t, b)
			// No MIG is no news; a failing MIG reading is.
			if got, want := logs.count(n.gpus[4].UUID, "get MIG mode"), map[bool]int{true: 1}[tc.ret == nvml.ERROR_UNKNOWN]; got != want {
				t.Errorf("%d log lines about the MIG mode, want %d\n%s", got, want, logs.String())
			}
			if tc.failed {
				if len(s.Failed) != 1 || !errors.Is(&s.Failed[0], tc.ret) {
					t.Fatalf("Failed = %v; want GPU 4 failed with %v", s.Failed, tc.ret)
				}
				return
			}
			if len(s.Failed) != 0 || s.Devices[4].MIGEnabled {
				t.Fatalf("Failed = %v, MIGEnabled %v; want GPU 4 read without MIG", s.Failed, s.Devices[4].MIGEnabled)
			}
		})
	}
}

// TestMIGFailureLoggedOnce: one MIG device failing a reading while another
// answers is one lasting failure, logged once, not a reading that flaps.
func TestMIGFailureLoggedOnce(t *testing.T) {
	n := newNode(t)
	b, logs := n.openLogged(t)
	enableMIG(n.gpus[2], []*migSlot{
		{uuid: mig1, gi: 1, ci: 0, total: gib, handleOK: true},
		{uuid: mig2, gi: 2, ci: 0, total: gib, memRet: nvml.ERROR_UNKNOWN, handleOK: true},
	})
	for range 3 {
		s := snapshot(t, b)
		if got := len(s.Devices[2].MIGDevices); got != 2 {
			t.Fatalf("%d MIG devices, want both (memory is optional)", got)
		}
	}
	if w := logs.count("level=WARN", "get MIG device memory info (MIG device 1)"); w != 1 {
		t.Errorf("MIG device 1 memory failing: %d warnings, want 1\n%s", w, logs.String())
	}
	if c := logs.count("MIG device 0"); c != 0 {
		t.Errorf("MIG device 0, answering all along, logged %d times\n%s", c, logs.String())
	}
}

// TestMIGModeAskedAgainAfterRecheck: a GPU that says MIG is off is not
// asked its MIG mode again for 30 s, then is, and a MIG turned on in
// between shows then; a GPU without MIG support is asked once.
func TestMIGModeAskedAgainAfterRecheck(t *testing.T) {
	n := newNode(t)
	clk := newClock()
	asked := map[int]int{}
	for i, g := range n.gpus[:2] {
		ret := []nvml.Return{nvml.SUCCESS, nvml.ERROR_NOT_SUPPORTED}[i]
		g.GetMigModeFunc = func() (int, int, nvml.Return) {
			asked[i]++
			return g.MigMode, g.MigMode, ret
		}
	}
	b, err := nvmlbackend.New(n, nvmlbackend.Options{XidPollTimeout: 5 * time.Millisecond, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	for range 3 {
		snapshot(t, b)
		clk.advance(9 * time.Second)
	}
	if asked[0] != 1 || asked[1] != 1 {
		t.Fatalf("MIG mode asked %v times within 27 s, want once each", asked)
	}
	enableMIG(n.gpus[0], []*migSlot{{uuid: mig1, gi: 1, ci: 0, total: gib, handleOK: true}})
	if s := snapshot(t, b); s.Devices[0].MIGEnabled {
		t.Fatal("MIG seen on before the recheck")
	}
	clk.advance(4 * time.Second)
	s := snapshot(t, b)
	if !s.Devices[0].MIGEnabled || len(s.Devices[0].MIGDevices) != 1 || asked[0] != 2 || asked[1] != 1 {
		t.Fatalf("after 31 s: MIG enabled %v with %d devices, asked %v; want on, 1 device, asked twice and once",
			s.Devices[0].MIGEnabled, len(s.Devices[0].MIGDevices), asked)
	}
}

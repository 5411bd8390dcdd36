package nvmlbackend_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	mockserver "github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/internal/xidcount"
	nvmlbackend "github.com/gpuslice/gpuslice/internal/gpu/nvml"
)

const gib = 1 << 30

// approx compares utilization ratios computed by division.
var approx = cmpopts.EquateApprox(0, 1e-12)

// node is a DGX A100 from go-nvml's mock with the calls dgxa100 leaves
// unset filled in: every GPU idle, supported, with no process.
type node struct {
	*mockserver.Server
	gpus   []*mockserver.Device
	events chan nvml.EventData
	set    *mock.EventSet

	mu sync.Mutex
	// waiting counts goroutines inside the set's Wait; freedWhileWaiting
	// records a Free made while one was (NVML forbids it).
	waiting           int
	freedWhileWaiting bool
}

func newNode(t testing.TB) *node {
	t.Helper()
	n := &node{Server: dgxa100.New(), events: make(chan nvml.EventData, 16)}
	for i, d := range n.Devices {
		g := d.(*mockserver.Device)
		g.MemoryInfo.Used = uint64(i) * gib
		g.MemoryInfo.Free = g.MemoryInfo.Total - g.MemoryInfo.Used
		g.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: uint32(10 * i), Memory: 5}, nvml.SUCCESS
		}
		g.GetTemperatureFunc = func(s nvml.TemperatureSensors) (uint32, nvml.Return) {
			if s != nvml.TEMPERATURE_GPU {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return uint32(40 + i), nvml.SUCCESS
		}
		g.GetPowerUsageFunc = func() (uint32, nvml.Return) { return uint32(100000 + 250*i), nvml.SUCCESS }
		g.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		g.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		g.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		// No utilization sample since the last reading: the GPU's figure
		// is GetUtilizationRates's. Tests of the samples set their own.
		g.GetSamplesFunc = func(nvml.SamplingType, uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
			return nvml.VALUE_TYPE_UNSIGNED_INT, nil, nvml.ERROR_NOT_FOUND
		}
		g.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeAll, nvml.SUCCESS }
		g.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
		n.gpus = append(n.gpus, g)
	}
	// An event set that delivers what the test sends, and otherwise times
	// out as NVML does.
	n.set = &mock.EventSet{
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			defer n.enterWait()()
			select {
			case e := <-n.events:
				return e, nvml.SUCCESS
			case <-time.After(time.Duration(ms) * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() nvml.Return {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.waiting > 0 {
				n.freedWhileWaiting = true
			}
			return nvml.SUCCESS
		},
	}
	n.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return n.set, nvml.SUCCESS }
	return n
}

// enterWait marks a goroutine inside Wait until the returned func runs.
func (n *node) enterWait() func() {
	n.mu.Lock()
	n.waiting++
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		n.waiting--
		n.mu.Unlock()
	}
}

func (n *node) open(t testing.TB) *nvmlbackend.Backend {
	t.Helper()
	b, err := nvmlbackend.New(n, nvmlbackend.Options{
		Logger:         slog.New(slog.NewTextHandler(t.Output(), nil)),
		XidPollTimeout: 5 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func snapshot(t *testing.T, b *nvmlbackend.Backend) gpu.Snapshot {
	t.Helper()
	s, err := b.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	return s
}

// TestSnapshot reads a node where GPU 0 runs compute and graphics
// processes, and checks every conversion NVML needs.
func TestSnapshot(t *testing.T) {
	n := newNode(t)
	g0 := n.gpus[0]
	g0.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{
			{Pid: 300, UsedGpuMemory: 1 * gib},
			{Pid: 100, UsedGpuMemory: 3 * gib},
			// Drivers without per-process accounting say "not available".
			{Pid: 200, UsedGpuMemory: ^uint64(0)},
			// Not available here, a figure in the graphics list.
			{Pid: 500, UsedGpuMemory: ^uint64(0)},
		}, nvml.SUCCESS
	}
	g0.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{
			{Pid: 300, UsedGpuMemory: 2 * gib}, // also compute: counted once, larger figure
			{Pid: 400, UsedGpuMemory: gib / 2}, // graphics only
			{Pid: 100, UsedGpuMemory: gib},     // also compute, which has more
			{Pid: 500, UsedGpuMemory: gib / 4},
		}, nvml.SUCCESS
	}
	// Samples are timestamped in microseconds; PID 100 has two since the
	// start, 100 ms apart, PID 300 one; PID 200 and 400 ran no kernel, so
	// NVML gives no sample for them.
	g0.GetProcessUtilizationFunc = func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		if lastSeen >= 300_000 {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return []nvml.ProcessUtilizationSample{
			{Pid: 100, TimeStamp: 200_000, SmUtil: 35},
			{Pid: 100, TimeStamp: 100_000, SmUtil: 20}, // older sample of the same process
			{Pid: 300, TimeStamp: 200_000, SmUtil: 5},
			{Pid: 999, TimeStamp: 300_000, SmUtil: 50}, // exited since: not listed
		}, nvml.SUCCESS
	}
	b := n.open(t)

	got := snapshot(t, b)
	if got.DriverVersion != "550.54.15" || len(got.Devices) != 8 || len(got.Failed) != 0 {
		t.Fatalf("Snapshot: driver %q, %d devices, failed %v", got.DriverVersion, len(got.Devices), got.Failed)
	}
	want0 := gpu.Device{
		Index:              0,
		UUID:               g0.UUID,
		Name:               g0.Config.Name,
		MemoryTotalBytes:   40 * gib,
		MemoryUsedBytes:    0,
		Utilization:        0,
		TemperatureCelsius: 40,
		PowerWatts:         100,
		// Each process's own samples, weighed by the time each stands
		// for; a listed process without a sample ran no kernel.
		Processes: []gpu.Process{
			{PID: 100, UsedMemoryBytes: 3 * gib, SMUtilization: (0.20 + 0.35) / 2, HasSMUtilization: true},
			{PID: 200, UsedMemoryBytes: 0, MemoryUnknown: true, HasSMUtilization: true},
			{PID: 300, UsedMemoryBytes: 2 * gib, SMUtilization: 0.05, HasSMUtilization: true},
			{PID: 400, UsedMemoryBytes: gib / 2, HasSMUtilization: true},
			{PID: 500, UsedMemoryBytes: gib / 4, HasSMUtilization: true},
		},
	}
	if diff := cmp.Diff(want0, got.Devices[0], approx); diff != "" {
		t.Errorf("GPU 0 (-want +got):\n%s", diff)
	}
	want5 := gpu.Device{
		Index: 5, UUID: n.gpus[5].UUID, Name: n.gpus[5].Config.Name,
		MemoryTotalBytes: 40 * gib, MemoryUsedBytes: 5 * gib,
		Utilization: 0.5, TemperatureCelsius: 45, PowerWatts: 101.25,
	}
	if diff := cmp.Diff(want5, got.Devices[5]); diff != "" {
		t.Errorf("GPU 5 (-want +got):\n%s", diff)
	}

	// The next reading asks for samples newer than the newest one seen;
	// with none (ERROR_NOT_FOUND), no process ran a kernel since: every
	// process reads 0, which is a figure, not a missing one.
	got = snapshot(t, b)
	calls := g0.GetProcessUtilizationCalls()
	if len(calls) != 2 || calls[0].V != 0 || calls[1].V != 300_000 {
		t.Errorf("GetProcessUtilization calls %+v, want lastSeen 0 then 300000", calls)
	}
	wantIdle := []gpu.Process{
		{PID: 100, UsedMemoryBytes: 3 * gib, HasSMUtilization: true},
		{PID: 200, UsedMemoryBytes: 0, MemoryUnknown: true, HasSMUtilization: true},
		{PID: 300, UsedMemoryBytes: 2 * gib, HasSMUtilization: true},
		{PID: 400, UsedMemoryBytes: gib / 2, HasSMUtilization: true},
		{PID: 500, UsedMemoryBytes: gib / 4, HasSMUtilization: true},
	}
	if diff := cmp.Diff(wantIdle, got.Devices[0].Processes); diff != "" {
		t.Errorf("second reading, no samples since the first (-want +got):\n%s", diff)
	}
	// GPUs without processes are not asked for process utilization.
	if c := n.gpus[1].GetProcessUtilizationCalls(); len(c) != 0 {
		t.Errorf("GPU 1 without processes: %d GetProcessUtilization calls", len(c))
	}
}

// TestOneGPUFails checks that a GPU failing a call loses only its own
// reading, and that optional readings a GPU does not support are zero.
func TestOneGPUFails(t *testing.T) {
	tests := []struct {
		name    string
		breakIt func(n *node, g *mockserver.Device)
		// wantErr is the NVML return the failure wraps; SUCCESS when the
		// GPU must not fail.
		wantErr  nvml.Return
		wantUUID bool // the failure names the GPU's UUID
		check    func(t *testing.T, d gpu.Device)
	}{
		{
			name: "memory info fails",
			breakIt: func(_ *node, g *mockserver.Device) {
				g.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
			},
			wantErr: nvml.ERROR_GPU_IS_LOST, wantUUID: true,
		},
		{
			name: "uuid fails",
			breakIt: func(_ *node, g *mockserver.Device) {
				g.GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
			},
			wantErr: nvml.ERROR_UNKNOWN,
		},
		{
			name: "handle fails",
			breakIt: func(n *node, g *mockserver.Device) {
				n.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
					if i == g.Index {
						return nil, nvml.ERROR_GPU_IS_LOST
					}
					return n.Devices[i], nvml.SUCCESS
				}
			},
			wantErr: nvml.ERROR_GPU_IS_LOST,
		},
		{
			name: "temperature: GPU lost",
			breakIt: func(_ *node, g *mockserver.Device) {
				g.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST }
			},
			wantErr: nvml.ERROR_GPU_IS_LOST, wantUUID: true,
		},
		{
			name: "temperature fails otherwise than unsupported: kept, no temperature",
			breakIt: func(_ *node, g *mockserver.Device) {
				g.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			check: func(t *testing.T, d gpu.Device) {
				if d.TemperatureCelsius != 0 || d.PowerWatts != 100.75 || d.MemoryUsedBytes != 3*gib {
					t.Errorf("GPU 3 = %+v; want temperature 0 and the other readings intact", d)
				}
			},
		},
		{
			name: "process utilization: GPU lost",
			breakIt: func(_ *node, g *mockserver.Device) {
				g.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
					return []nvml.ProcessInfo{{Pid: 1, UsedGpuMemory: 1}}, nvml.SUCCESS
				}
				g.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
					return nil, nvml.ERROR_GPU_IS_LOST
				}
			},
			wantErr: nvml.ERROR_GPU_IS_LOST, wantUUID: true,
		},
		{
			name: "optional readings unsupported",
			breakIt: func(_ *node, g *mockserver.Device) {
				g.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED }
				g.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
				g.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
				g.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
				g.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
					return []nvml.ProcessInfo{{Pid: 7, UsedGpuMemory: gib}}, nvml.SUCCESS
				}
				g.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
					return nil, nvml.ERROR_NOT_SUPPORTED
				}
			},
			check: func(t *testing.T, d gpu.Device) {
				// No series for what the GPU cannot tell: Missing, not 0.
				want := gpu.Device{
					Index: 3, UUID: d.UUID, Name: d.Name, MemoryTotalBytes: 40 * gib, MemoryUsedBytes: 3 * gib,
					Missing:   gpu.ReadingUtilization | gpu.ReadingTemperature | gpu.ReadingPower,
					Processes: []gpu.Process{{PID: 7, UsedMemoryBytes: gib}},
				}
				if diff := cmp.Diff(want, d); diff != "" {
					t.Errorf("GPU 3 (-want +got):\n%s", diff)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			broken := n.gpus[3]
			tc.breakIt(n, broken)
			b := n.open(t)
			s := snapshot(t, b)

			if tc.wantErr == nvml.SUCCESS {
				if len(s.Failed) != 0 || len(s.Devices) != 8 {
					t.Fatalf("got %d devices, failed %v; want all 8", len(s.Devices), s.Failed)
				}
				tc.check(t, s.Devices[3])
				return
			}
			if len(s.Failed) != 1 {
				t.Fatalf("Failed = %v, want GPU 3 only", s.Failed)
			}
			f := s.Failed[0]
			if f.Index != 3 || !errors.Is(&f, tc.wantErr) {
				t.Errorf("Failed[0] = index %d, %v; want index 3 wrapping %v", f.Index, f.Err, tc.wantErr)
			}
			if wantUUID := map[bool]string{true: broken.UUID}[tc.wantUUID]; f.UUID != wantUUID {
				t.Errorf("Failed[0].UUID = %q, want %q", f.UUID, wantUUID)
			}
			if len(s.Devices) != 7 {
				t.Fatalf("got %d devices, want the 7 others", len(s.Devices))
			}
			for j, d := range s.Devices {
				want := j
				if j >= 3 {
					want = j + 1
				}
				if d.Index != want || d.UUID != n.gpus[want].UUID || d.MemoryUsedBytes != uint64(want)*gib {
					t.Errorf("Devices[%d] = index %d %s used %d; want GPU %d intact", j, d.Index, d.UUID, d.MemoryUsedBytes, want)
				}
			}
		})
	}
}

// reading is one optional NVML reading of a GPU: how to make it return
// ret, and what the GPU reads when that reading gives nothing.
type reading struct {
	name  string // the call name the backend logs
	fail  func(g *mockserver.Device, ret nvml.Return)
	blank func(d *gpu.Device)
}

// optionalReadings are the readings a GPU comes back without. GPU 3 of
// busyNode runs PID 7 (compute, with an SM sample) and PID 8 (graphics).
var optionalReadings = []reading{
	{"get name", func(g *mockserver.Device, ret nvml.Return) {
		g.GetNameFunc = func() (string, nvml.Return) { return "", ret }
	}, func(d *gpu.Device) { d.Name = "" }},
	{"get utilization", func(g *mockserver.Device, ret nvml.Return) {
		g.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, ret }
	}, func(d *gpu.Device) { d.Utilization, d.Missing = 0, d.Missing|gpu.ReadingUtilization }},
	// Without its samples the GPU still reads GetUtilizationRates.
	{"get utilization samples", func(g *mockserver.Device, ret nvml.Return) {
		g.GetSamplesFunc = func(nvml.SamplingType, uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) { return 0, nil, ret }
	}, func(*gpu.Device) {}},
	{"get temperature", func(g *mockserver.Device, ret nvml.Return) {
		g.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, ret }
	}, func(d *gpu.Device) { d.TemperatureCelsius, d.Missing = 0, d.Missing|gpu.ReadingTemperature }},
	{"get power usage", func(g *mockserver.Device, ret nvml.Return) {
		g.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, ret }
	}, func(d *gpu.Device) { d.PowerWatts, d.Missing = 0, d.Missing|gpu.ReadingPower }},
	{"get compute processes", func(g *mockserver.Device, ret nvml.Return) {
		g.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, ret }
	}, func(d *gpu.Device) {
		d.Processes = []gpu.Process{{PID: 8, UsedMemoryBytes: gib, HasSMUtilization: true}}
	}},
	{"get graphics processes", func(g *mockserver.Device, ret nvml.Return) {
		g.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, ret }
	}, func(d *gpu.Device) { d.Processes = d.Processes[:1] }},
	{"get process utilization", func(g *mockserver.Device, ret nvml.Return) {
		g.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) { return nil, ret }
	}, func(d *gpu.Device) {
		d.Processes[0].SMUtilization, d.Processes[0].HasSMUtilization = 0, false
		d.Processes[1].HasSMUtilization = false
	}},
}

// busyNode is newNode with processes on GPU 3, so that every optional
// reading of it has something to give.
func busyNode(t testing.TB) (*node, gpu.Device) {
	n := newNode(t)
	g := n.gpus[3]
	g.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 7, UsedGpuMemory: 2 * gib}}, nvml.SUCCESS
	}
	g.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 8, UsedGpuMemory: gib}}, nvml.SUCCESS
	}
	g.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return []nvml.ProcessUtilizationSample{{Pid: 7, TimeStamp: 10, SmUtil: 60}}, nvml.SUCCESS
	}
	return n, gpu.Device{
		Index: 3, UUID: g.UUID, Name: g.Config.Name, MemoryTotalBytes: 40 * gib, MemoryUsedBytes: 3 * gib,
		Utilization: 0.3, TemperatureCelsius: 43, PowerWatts: 100.75,
		Processes: []gpu.Process{
			{PID: 7, UsedMemoryBytes: 2 * gib, SMUtilization: 0.6, HasSMUtilization: true},
			{PID: 8, UsedMemoryBytes: gib, HasSMUtilization: true}, // listed, no sample: idle
		},
	}
}

// TestOptionalReadingFails: an optional reading that errors leaves only
// that reading empty and keeps the GPU (the device plugin would otherwise
// mark it unhealthy for as long as, say, its power sensor misbehaves);
// a return saying the GPU is gone fails the GPU from any call.
func TestOptionalReadingFails(t *testing.T) {
	for _, r := range optionalReadings {
		for _, ret := range []nvml.Return{nvml.ERROR_UNKNOWN, nvml.ERROR_NO_PERMISSION, nvml.ERROR_TIMEOUT, nvml.ERROR_GPU_IS_LOST, nvml.ERROR_GPU_NOT_FOUND} {
			fatal := ret == nvml.ERROR_GPU_IS_LOST || ret == nvml.ERROR_GPU_NOT_FOUND
			t.Run(r.name+"/"+ret.Error(), func(t *testing.T) {
				n, want := busyNode(t)
				r.fail(n.gpus[3], ret)
				s := snapshot(t, n.open(t))
				if fatal {
					if len(s.Failed) != 1 || s.Failed[0].Index != 3 || !errors.Is(&s.Failed[0], ret) || len(s.Devices) != 7 {
						t.Fatalf("Failed = %v with %d devices; want GPU 3 failed wrapping %v", s.Failed, len(s.Devices), ret)
					}
					if !strings.Contains(s.Failed[0].Error(), r.name) {
						t.Errorf("failure %q does not name the call %q", s.Failed[0].Error(), r.name)
					}
					return
				}
				if len(s.Failed) != 0 || len(s.Devices) != 8 {
					t.Fatalf("Failed = %v with %d devices; want all 8 kept", s.Failed, len(s.Devices))
				}
				r.blank(&want)
				if diff := cmp.Diff(want, s.Devices[3]); diff != "" {
					t.Errorf("GPU 3 (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// syncBuffer is a log destination read while the backend may write.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// count returns how many log lines contain every one of parts.
func (b *syncBuffer) count(parts ...string) int {
	n := 0
	for _, line := range strings.Split(b.String(), "\n") {
		match := true
		for _, p := range parts {
			match = match && strings.Contains(line, p)
		}
		if match && line != "" {
			n++
		}
	}
	return n
}

// openLogged is open with the backend's log kept for the test to read.
func (n *node) openLogged(t *testing.T) (*nvmlbackend.Backend, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	b, err := nvmlbackend.New(n, nvmlbackend.Options{Logger: slog.New(slog.NewTextHandler(logs, nil)), XidPollTimeout: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, logs
}

// TestOptionalReadingFailureLoggedOnce: a reading that keeps failing is
// logged once per GPU and reading, again only after it has answered.
func TestOptionalReadingFailureLoggedOnce(t *testing.T) {
	n := newNode(t)
	b, logs := n.openLogged(t)
	g3, g4 := n.gpus[3], n.gpus[4]
	var mu sync.Mutex
	powerRet := nvml.ERROR_UNKNOWN
	g3.GetPowerUsageFunc = func() (uint32, nvml.Return) {
		mu.Lock()
		defer mu.Unlock()
		return 0, powerRet
	}
	g4.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	g4.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_NO_PERMISSION }
	// An unsupported reading is normal, and logged once.
	n.gpus[5].GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }

	warned := func(g *mockserver.Device, reading string) int {
		return logs.count("level=WARN", g.UUID, `reading="`+reading+`"`)
	}
	recovered := func(g *mockserver.Device, reading string) int {
		return logs.count("level=INFO", g.UUID, `reading="`+reading+`"`)
	}
	for range 3 {
		if s := snapshot(t, b); len(s.Failed) != 0 {
			t.Fatalf("Failed = %v", s.Failed)
		}
	}
	if w3, w4p, w4t := warned(g3, "get power usage"), warned(g4, "get power usage"), warned(g4, "get temperature"); w3 != 1 || w4p != 1 || w4t != 1 {
		t.Errorf("after 3 readings: warnings GPU 3 power %d, GPU 4 power %d, GPU 4 temperature %d; want 1 each\n%s", w3, w4p, w4t, logs.String())
	}
	if c := logs.count("ERROR_UNKNOWN", g3.UUID); c != 1 {
		t.Errorf("the warning names the NVML error %d times, want 1", c)
	}
	if c, w := logs.count(n.gpus[5].UUID), logs.count("level=INFO", n.gpus[5].UUID, `reading="get power usage"`, "no series"); c != 1 || w != 1 {
		t.Errorf("an unsupported reading was logged %d times (%d at INFO saying it has no series), want once", c, w)
	}

	// setPower changes GPU 3's power reading, then reads twice.
	setPower := func(ret nvml.Return) {
		mu.Lock()
		powerRet = ret
		mu.Unlock()
		snapshot(t, b)
		snapshot(t, b)
	}
	setPower(nvml.SUCCESS)
	if r := recovered(g3, "get power usage"); r != 1 {
		t.Errorf("GPU 3 power answering again logged %d times, want 1", r)
	}
	setPower(nvml.ERROR_UNKNOWN)
	if w := warned(g3, "get power usage"); w != 2 {
		t.Errorf("GPU 3 power failing again: %d warnings in all, want 2", w)
	}
	if w := warned(g4, "get power usage"); w != 1 {
		t.Errorf("GPU 4 power, failing all along: %d warnings, want 1", w)
	}
}

// TestProcessUtilizationWithoutSamples: no sample since the last reading
// means every process ran no kernel, 0; a GPU that cannot give samples,
// or a failed call, leaves the processes without a figure.
func TestProcessUtilizationWithoutSamples(t *testing.T) {
	tests := []struct {
		name    string
		samples []nvml.ProcessUtilizationSample
		ret     nvml.Return
		wantHas bool
	}{
		{"not found: no process ran a kernel", nil, nvml.ERROR_NOT_FOUND, true},
		{"zero-sized sample buffer", []nvml.ProcessUtilizationSample{}, nvml.ERROR_INSUFFICIENT_SIZE, true},
		{"not supported", nil, nvml.ERROR_NOT_SUPPORTED, false},
		{"failed", nil, nvml.ERROR_UNKNOWN, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			g := n.gpus[2]
			g.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
				return []nvml.ProcessInfo{{Pid: 11, UsedGpuMemory: gib}, {Pid: 12, UsedGpuMemory: 2 * gib}}, nvml.SUCCESS
			}
			g.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) { return tc.samples, tc.ret }
			s := snapshot(t, n.open(t))
			if len(s.Failed) != 0 {
				t.Fatalf("Failed = %v", s.Failed)
			}
			want := []gpu.Process{
				{PID: 11, UsedMemoryBytes: gib, HasSMUtilization: tc.wantHas},
				{PID: 12, UsedMemoryBytes: 2 * gib, HasSMUtilization: tc.wantHas},
			}
			if diff := cmp.Diff(want, s.Devices[2].Processes); diff != "" {
				t.Errorf("processes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDeviceCountFails(t *testing.T) {
	n := newNode(t)
	b := n.open(t)
	n.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_DRIVER_NOT_LOADED }
	_, err := b.Snapshot(context.Background())
	if !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), "ERROR_DRIVER_NOT_LOADED") {
		t.Errorf("Snapshot error %v: want gpu.ErrUnavailable naming ERROR_DRIVER_NOT_LOADED", err)
	}
}

// TestInitFails: without libnvidia-ml any call after a failed Init kills
// the process, so New must make no other call. The bare mock panics on any
// method whose function is not set, which the test turns into a failure.
func TestInitFails(t *testing.T) {
	for _, ret := range []nvml.Return{nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_NO_PERMISSION} {
		t.Run(ret.Error(), func(t *testing.T) {
			lib := &mock.Interface{InitFunc: func() nvml.Return { return ret }}
			var (
				b   *nvmlbackend.Backend
				err error
			)
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("New made a call after Init failed: %v", p)
					}
				}()
				b, err = nvmlbackend.New(lib, nvmlbackend.Options{})
			}()
			if b != nil || !errors.Is(err, gpu.ErrUnavailable) {
				t.Fatalf("New = %v, %v; want nil and gpu.ErrUnavailable", b, err)
			}
			if !strings.Contains(err.Error(), ret.Error()) {
				t.Errorf("error %q does not name %s", err, ret.Error())
			}
			if c := len(lib.InitCalls()); c != 1 {
				t.Errorf("Init called %d times, want 1", c)
			}
		})
	}
}

// TestXidEvents delivers events through the mocked event set and checks
// that exactly the Xid critical errors of registered GPUs are counted.
func TestXidEvents(t *testing.T) {
	n := newNode(t)
	// GPU 7 cannot report Xid errors: it must not be registered.
	n.gpus[7].GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeAll &^ nvml.EventTypeXidCriticalError, nvml.SUCCESS
	}
	b := n.open(t)

	for i, g := range n.gpus {
		calls := g.RegisterEventsCalls()
		if i == 7 {
			if len(calls) != 0 {
				t.Errorf("GPU 7 registered for events without supporting Xid errors")
			}
			continue
		}
		if len(calls) != 1 || calls[0].V != nvml.EventTypeXidCriticalError || calls[0].EventSet != n.set {
			t.Errorf("GPU %d RegisterEvents calls %+v, want one for Xid critical errors on the set", i, calls)
		}
	}

	xid := func(g *mockserver.Device, code uint64) nvml.EventData {
		return nvml.EventData{Device: g, EventType: nvml.EventTypeXidCriticalError, EventData: code}
	}
	// Events are read in order: those not to be counted go first, so that
	// once the counted ones show, all have been read.
	n.events <- nvml.EventData{Device: n.gpus[1], EventType: nvml.EventTypeSingleBitEccError, EventData: 1}
	n.events <- nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: 31}
	n.events <- xid(n.gpus[7], 79)
	n.events <- xid(n.gpus[1], 79)
	n.events <- xid(n.gpus[2], 13)
	n.events <- xid(n.gpus[1], 79)
	n.events <- xid(n.gpus[1], 48)

	want := []gpu.XidCount{
		{UUID: n.gpus[1].UUID, Index: 1, Xid: 48, Count: 1},
		{UUID: n.gpus[1].UUID, Index: 1, Xid: 79, Count: 2},
		{UUID: n.gpus[2].UUID, Index: 2, Xid: 13, Count: 1},
	}
	xidcount.Sort(want)
	var got []gpu.XidCount
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if got = b.Xids(); len(got) == len(want) && got[0].Count+got[1].Count+got[2].Count == 4 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Xids (-want +got):\n%s", diff)
	}
}

// TestXidLostGPU: the Xid of a GPU that fell off the bus is counted
// though the GPU no longer answers GetUUID, and once waits fail with
// ERROR_GPU_IS_LOST the set is made again without it, so that the other
// GPUs' Xid errors go on being counted.
func TestXidLostGPU(t *testing.T) {
	n := newNode(t)
	lost := make(chan struct{}, 1)
	wait := n.set.WaitFunc
	n.set.WaitFunc = func(ms uint32) (nvml.EventData, nvml.Return) {
		select {
		case <-lost:
			return nvml.EventData{}, nvml.ERROR_GPU_IS_LOST
		default:
			return wait(ms)
		}
	}
	b := n.open(t)
	waitFor := func(want []gpu.XidCount) {
		t.Helper()
		xidcount.Sort(want)
		var got []gpu.XidCount
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if got = b.Xids(); cmp.Equal(want, got) {
				return
			}
		}
		t.Fatalf("Xids (-want +got):\n%s", cmp.Diff(want, got))
	}

	n.gpus[3].GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	n.events <- nvml.EventData{Device: n.gpus[3], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	waitFor([]gpu.XidCount{{UUID: n.gpus[3].UUID, Index: 3, Xid: 79, Count: 1}})

	lost <- struct{}{}
	n.events <- nvml.EventData{Device: n.gpus[2], EventType: nvml.EventTypeXidCriticalError, EventData: 13}
	waitFor([]gpu.XidCount{{UUID: n.gpus[3].UUID, Index: 3, Xid: 79, Count: 1}, {UUID: n.gpus[2].UUID, Index: 2, Xid: 13, Count: 1}})
	if c := len(n.EventSetCreateCalls()); c != 2 {
		t.Errorf("event set created %d times, want 2: again after the GPU was lost", c)
	}
	if r2, r3 := len(n.gpus[2].RegisterEventsCalls()), len(n.gpus[3].RegisterEventsCalls()); r2 != 2 || r3 != 1 {
		t.Errorf("RegisterEvents calls: GPU 2 %d, GPU 3 %d; want 2 and 1 (the lost GPU not registered again)", r2, r3)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestClose checks that Close stops the event reader before freeing the
// set, shuts NVML down once, and that the backend is unusable afterwards
// without touching NVML.
func TestClose(t *testing.T) {
	for _, failingWait := range []bool{false, true} {
		t.Run(fmt.Sprintf("failing wait %v", failingWait), func(t *testing.T) {
			testClose(t, failingWait)
		})
	}
}

func testClose(t *testing.T, failingWait bool) {
	n := newNode(t)
	if failingWait {
		// A set whose wait fails at once: the reader must neither spin
		// nor keep Close from returning.
		n.set.WaitFunc = func(uint32) (nvml.EventData, nvml.Return) {
			defer n.enterWait()()
			return nvml.EventData{}, nvml.ERROR_UNKNOWN
		}
	}
	b := n.open(t)
	snapshot(t, b)
	// Close must not free the set under a running wait: wait until the
	// reader has been in Wait at least once.
	for deadline := time.Now().Add(10 * time.Second); len(n.set.WaitCalls()) == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}

	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	n.mu.Lock()
	if n.freedWhileWaiting {
		t.Error("event set freed while the reader was waiting on it")
	}
	n.mu.Unlock()
	waits := len(n.set.WaitCalls())
	if f, s := len(n.set.FreeCalls()), len(n.ShutdownCalls()); f != 1 || s != 1 {
		t.Errorf("after Close: Free called %d times, Shutdown %d; want 1 and 1", f, s)
	}
	counts := len(n.DeviceGetCountCalls())
	if _, err := b.Snapshot(context.Background()); !errors.Is(err, gpu.ErrUnavailable) {
		t.Errorf("Snapshot after Close: %v, want gpu.ErrUnavailable", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if c := len(n.DeviceGetCountCalls()); c != counts {
		t.Errorf("Snapshot after Close called NVML")
	}
	if f, s := len(n.set.FreeCalls()), len(n.ShutdownCalls()); f != 1 || s != 1 {
		t.Errorf("after a second Close: Free called %d times, Shutdown %d; want 1 and 1", f, s)
	}
	if w := len(n.set.WaitCalls()); w != waits {
		t.Errorf("event set waited on after Close returned (%d calls, then %d)", waits, w)
	}
}

func TestCloseReportsShutdownFailure(t *testing.T) {
	n := newNode(t)
	n.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNINITIALIZED }
	b := n.open(t)
	if err := b.Close(); !errors.Is(err, nvml.ERROR_UNINITIALIZED) {
		t.Errorf("Close: %v, want it to wrap ERROR_UNINITIALIZED", err)
	}
}

// TestWithoutEventSet: a driver that cannot create event sets still gives
// readings, no Xid counts, and Close shuts NVML down.
func TestWithoutEventSet(t *testing.T) {
	n := newNode(t)
	n.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	b := n.open(t)
	if s := snapshot(t, b); len(s.Devices) != 8 {
		t.Errorf("got %d devices", len(s.Devices))
	}
	if x := b.Xids(); len(x) != 0 {
		t.Errorf("Xids = %v", x)
	}
	if err := b.Close(); err != nil || len(n.ShutdownCalls()) != 1 {
		t.Errorf("Close: %v, %d Shutdown calls", err, len(n.ShutdownCalls()))
	}
}

// TestNoGPUSupportsXid: the event set is freed at once when no GPU can
// report Xid errors.
func TestNoGPUSupportsXid(t *testing.T) {
	n := newNode(t)
	for _, g := range n.gpus {
		g.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	}
	b := n.open(t)
	if f := len(n.set.FreeCalls()); f != 1 {
		t.Errorf("event set freed %d times, want 1", f)
	}
	if err := b.Close(); err != nil || len(n.set.FreeCalls()) != 1 || len(n.set.WaitCalls()) != 0 {
		t.Errorf("Close: %v; Free %d, Wait %d calls", err, len(n.set.FreeCalls()), len(n.set.WaitCalls()))
	}
}

func BenchmarkSnapshot8x64(b *testing.B) {
	n := newNode(b)
	for i, g := range n.gpus {
		procs := make([]nvml.ProcessInfo, 64)
		samples := make([]nvml.ProcessUtilizationSample, 64)
		for j := range procs {
			pid := uint32(10000 + 64*i + j)
			procs[j] = nvml.ProcessInfo{Pid: pid, UsedGpuMemory: uint64(j+1) << 26}
			samples[j] = nvml.ProcessUtilizationSample{Pid: pid, TimeStamp: 1, SmUtil: uint32(j % 100)}
		}
		g.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS }
		g.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) { return samples, nvml.SUCCESS }
	}
	be := n.open(b)
	b.ReportAllocs()
	for b.Loop() {
		s, err := be.Snapshot(context.Background())
		if err != nil || len(s.Devices) != 8 || len(s.Devices[0].Processes) != 64 {
			b.Fatal(fmt.Sprint(len(s.Devices), err))
		}
	}
}

// TestIdentityCachedPerSession: a GPU's handle, UUID and name do not
// change while NVML stays initialized, so they are read once, not at every
// scrape; a GPU that fails is looked up again, and a name that failed is
// asked again.
func TestIdentityCachedPerSession(t *testing.T) {
	n := newNode(t)
	g := n.gpus[3]
	nameRet := nvml.ERROR_UNKNOWN
	g.GetNameFunc = func() (string, nvml.Return) { return "NVIDIA A100", nameRet }
	b := n.open(t)
	handles := func() int {
		c := 0
		for _, call := range n.DeviceGetHandleByIndexCalls() {
			if call.N == 3 {
				c++
			}
		}
		return c
	}
	baseHandles, baseUUID := handles(), len(g.GetUUIDCalls()) // the Xid registration's lookups

	for range 3 {
		snapshot(t, b)
	}
	if h, u := handles()-baseHandles, len(g.GetUUIDCalls())-baseUUID; h != 1 || u != 1 {
		t.Errorf("3 readings: %d handle lookups, %d UUID reads of GPU 3; want 1 each", h, u)
	}
	if c := len(g.GetNameCalls()); c != 3 {
		t.Errorf("a failing name was asked %d times in 3 readings, want 3", c)
	}
	nameRet = nvml.SUCCESS
	for range 3 {
		if d := snapshot(t, b).Devices[3]; d.Name != "NVIDIA A100" {
			t.Errorf("name %q", d.Name)
		}
	}
	if c := len(g.GetNameCalls()); c != 4 {
		t.Errorf("name asked %d times in all, want 4 (once more once it answers)", c)
	}

	// A lost GPU is looked up again at the next reading.
	lost := true
	g.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		if lost {
			return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
		}
		return nvml.Memory{Total: 40 * gib}, nvml.SUCCESS
	}
	if s := snapshot(t, b); len(s.Failed) != 1 {
		t.Fatalf("Failed = %v, want GPU 3", s.Failed)
	}
	lost = false
	before := handles()
	if s := snapshot(t, b); len(s.Failed) != 0 {
		t.Fatalf("Failed = %v after the GPU came back", s.Failed)
	}
	if h := handles() - before; h != 1 {
		t.Errorf("after a lost GPU: %d handle lookups, want 1", h)
	}
}

// TestComputeProcesses: one GPU's compute list alone, for the exporter's
// OOM watch, reads no utilization sample (the next Snapshot's window stays
// where the last ended), and refuses a GPU no Snapshot has read.
func TestComputeProcesses(t *testing.T) {
	n := newNode(t)
	g0 := n.gpus[0]
	g0.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 3 * gib}, {Pid: 200, UsedGpuMemory: ^uint64(0)}}, nvml.SUCCESS
	}
	b := n.open(t)
	uuid, _ := g0.GetUUID()
	ctx := context.Background()
	if _, err := b.ComputeProcesses(ctx, uuid); err == nil {
		t.Error("a GPU no Snapshot has read: no error")
	}
	snapshot(t, b)
	samples := len(g0.GetSamplesCalls()) + len(g0.GetProcessUtilizationCalls())
	got, err := b.ComputeProcesses(ctx, uuid)
	if err != nil {
		t.Fatal(err)
	}
	want := []gpu.Process{{PID: 100, UsedMemoryBytes: 3 * gib}, {PID: 200, MemoryUnknown: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ComputeProcesses (-want +got):\n%s", diff)
	}
	if after := len(g0.GetSamplesCalls()) + len(g0.GetProcessUtilizationCalls()); after != samples {
		t.Errorf("%d utilization readings, want none", after-samples)
	}
	if _, err := b.ComputeProcesses(ctx, "GPU-nowhere"); err == nil || !strings.Contains(err.Error(), "GPU-nowhere") {
		t.Errorf("an unknown GPU: %v, want an error naming it", err)
	}
}

package nvmlbackend_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	nvmlbackend "github.com/gpuslice/gpuslice/internal/gpu/nvml"
)

// lightLib is an NVML of one GPU that answers from fixed values and counts
// the calls made into it, without go-nvml's mocks, whose recording of
// every call would be most of what a benchmark measures. On real NVML
// each call is a trip into libnvidia-ml and often the driver (an ioctl),
// so calls per reading are what a CPU profile of the exporter on a GPU
// would show as the backend's cost; go-nvml's wrappers count as they make
// them (a process list is two calls: NVML says the size, then fills it).
type lightLib struct {
	nvml.Interface // nil: a call the benchmark does not expect panics
	dev            *lightDevice
	calls          atomic.Int64
}

type lightDevice struct {
	nvml.Device // nil, as above
	calls       *atomic.Int64
	procs       []nvml.ProcessInfo
	samples     []nvml.ProcessUtilizationSample
	util        []nvml.Sample
	now         uint64
}

func (l *lightLib) Init() nvml.Return     { return nvml.SUCCESS }
func (l *lightLib) Shutdown() nvml.Return { return nvml.SUCCESS }
func (l *lightLib) SystemGetDriverVersion() (string, nvml.Return) {
	l.calls.Add(1)
	return "580.159.04", nvml.SUCCESS
}
func (l *lightLib) EventSetCreate() (nvml.EventSet, nvml.Return) {
	return nil, nvml.ERROR_NOT_SUPPORTED
}
func (l *lightLib) DeviceGetCount() (int, nvml.Return) { l.calls.Add(1); return 1, nvml.SUCCESS }
func (l *lightLib) DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return) {
	l.calls.Add(1)
	return l.dev, nvml.SUCCESS
}

func (d *lightDevice) GetUUID() (string, nvml.Return) {
	d.calls.Add(1)
	return "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348", nvml.SUCCESS
}
func (d *lightDevice) GetName() (string, nvml.Return) {
	d.calls.Add(1)
	return "NVIDIA H200", nvml.SUCCESS
}
func (d *lightDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	d.calls.Add(1)
	return nvml.Memory{Total: 150 << 30, Used: 40 << 30, Free: 110 << 30}, nvml.SUCCESS
}
func (d *lightDevice) GetSamples(nvml.SamplingType, uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
	d.calls.Add(2)
	d.now += 6_000_000
	for i := range d.util {
		d.util[i].TimeStamp = d.now - uint64(len(d.util)-1-i)*200_000
	}
	return nvml.VALUE_TYPE_UNSIGNED_INT, append([]nvml.Sample(nil), d.util...), nvml.SUCCESS
}
func (d *lightDevice) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	d.calls.Add(1)
	return nvml.Utilization{Gpu: 86}, nvml.SUCCESS
}
func (d *lightDevice) GetTemperature(nvml.TemperatureSensors) (uint32, nvml.Return) {
	d.calls.Add(1)
	return 45, nvml.SUCCESS
}
func (d *lightDevice) GetPowerUsage() (uint32, nvml.Return) {
	d.calls.Add(1)
	return 300_000, nvml.SUCCESS
}
func (d *lightDevice) GetMigMode() (int, int, nvml.Return) {
	d.calls.Add(1)
	return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS
}
func (d *lightDevice) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	d.calls.Add(2)
	return append([]nvml.ProcessInfo(nil), d.procs...), nvml.SUCCESS
}
func (d *lightDevice) GetGraphicsRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	d.calls.Add(1)
	return []nvml.ProcessInfo{}, nvml.SUCCESS
}
func (d *lightDevice) GetProcessUtilization(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	d.calls.Add(2)
	for i := range d.samples {
		d.samples[i].TimeStamp = d.now - uint64(300*i)
	}
	return append([]nvml.ProcessUtilizationSample(nil), d.samples...), nvml.SUCCESS
}

// BenchmarkSnapshot48 is one GPU with 48 busy processes, as the H200 of
// issue 22 (48 CUDA processes in 48 of 68 pods): the backend's share of a
// scrape, with the NVML calls it makes reported as nvml-calls/op.
func BenchmarkSnapshot48(b *testing.B) {
	lib := &lightLib{}
	d := &lightDevice{calls: &lib.calls, now: 1_800_000_000_000_000, util: make([]nvml.Sample, 30)}
	for i := range d.util {
		d.util[i].SampleValue[0] = 86
	}
	for i := range 48 {
		pid := uint32(100000 + 37*i)
		d.procs = append(d.procs, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: 600 << 20, GpuInstanceId: ^uint32(0), ComputeInstanceId: ^uint32(0)})
		d.samples = append(d.samples, nvml.ProcessUtilizationSample{Pid: pid, SmUtil: 1 + uint32(i%3)})
	}
	lib.dev = d
	be, err := nvmlbackend.New(lib, nvmlbackend.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	ctx := context.Background()
	snap := func() {
		s, err := be.Snapshot(ctx)
		if err != nil || len(s.Devices) != 1 || len(s.Devices[0].Processes) != 48 || s.Devices[0].Processes[0].SMUtilization == 0 {
			b.Fatalf("snapshot %+v, %v", s, err)
		}
	}
	snap() // the first reading, which may look things up once
	lib.calls.Store(0)
	b.ReportAllocs()
	for b.Loop() {
		snap()
	}
	b.ReportMetric(float64(lib.calls.Load())/float64(b.N), "nvml-calls/op")
}

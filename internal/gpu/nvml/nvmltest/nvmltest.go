// Package nvmltest is a light NVML for benchmarks of the nvml backend and
// of the exporter over it: GPUs answering from fixed values, with the
// calls made into the library counted. go-nvml's mocks record every call
// with its arguments, which is most of what a benchmark over them would
// measure; on real NVML each call is a trip into libnvidia-ml and often
// the driver, so the calls per reading are what stands for the library's
// cost here. Calls are counted as go-nvml makes them: a process list or a
// sample buffer is two (NVML gives the size, then fills it).
//
// Only the calls the backend makes on a GPU without MIG or events are
// answered; any other call panics (the embedded interfaces are nil).
package nvmltest

import (
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Lib is the library: Init, the GPUs by index, the driver version.
type Lib struct {
	nvml.Interface
	GPUs  []*GPU
	calls atomic.Int64
}

// GPU is one GPU. Its clock moves by Period at each utilization reading,
// with one GPU_UTILIZATION sample of Util percent every 200 ms and one
// process sample of SM[pid] percent per busy process, as a driver read
// once per scrape gives them.
type GPU struct {
	nvml.Device
	lib               *Lib
	UUID, Name        string
	MemTotal, MemUsed uint64
	Util              uint32
	Processes         []nvml.ProcessInfo
	SM                map[uint32]uint32
	Period            uint64 // µs between readings; 15 s when 0

	mu  sync.Mutex
	now uint64
}

// New returns a library of gpus.
func New(gpus ...*GPU) *Lib {
	l := &Lib{GPUs: gpus}
	for _, g := range gpus {
		g.lib = l
		g.now = 1_800_000_000_000_000
	}
	return l
}

// Calls is the number of calls made into the library so far.
func (l *Lib) Calls() int64 { return l.calls.Load() }

func (l *Lib) Init() nvml.Return     { return nvml.SUCCESS }
func (l *Lib) Shutdown() nvml.Return { return nvml.SUCCESS }

func (l *Lib) SystemGetDriverVersion() (string, nvml.Return) {
	l.calls.Add(1)
	return "580.159.04", nvml.SUCCESS
}

// EventSetCreate: no Xid events here.
func (l *Lib) EventSetCreate() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }

func (l *Lib) DeviceGetCount() (int, nvml.Return) { l.calls.Add(1); return len(l.GPUs), nvml.SUCCESS }

func (l *Lib) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	l.calls.Add(1)
	if i < 0 || i >= len(l.GPUs) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return l.GPUs[i], nvml.SUCCESS
}

func (g *GPU) GetUUID() (string, nvml.Return) { g.lib.calls.Add(1); return g.UUID, nvml.SUCCESS }
func (g *GPU) GetName() (string, nvml.Return) { g.lib.calls.Add(1); return g.Name, nvml.SUCCESS }

func (g *GPU) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	g.lib.calls.Add(1)
	return nvml.Memory{Total: g.MemTotal, Used: g.MemUsed, Free: g.MemTotal - g.MemUsed}, nvml.SUCCESS
}

func (g *GPU) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	g.lib.calls.Add(1)
	return nvml.Utilization{Gpu: g.Util}, nvml.SUCCESS
}

// GetSamples gives the GPU_UTILIZATION samples of one Period and moves
// the clock on.
func (g *GPU) GetSamples(typ nvml.SamplingType, _ uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
	g.lib.calls.Add(2)
	if typ != nvml.GPU_UTILIZATION_SAMPLES {
		return 0, nil, nvml.ERROR_NOT_SUPPORTED
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	period := g.Period
	if period == 0 {
		period = 15_000_000
	}
	g.now += period
	n := max(period/200_000, 1)
	out := make([]nvml.Sample, n)
	for i := range out {
		out[i].TimeStamp = g.now - (n-1-uint64(i))*200_000
		binary.NativeEndian.PutUint32(out[i].SampleValue[:4], g.Util)
	}
	return nvml.VALUE_TYPE_UNSIGNED_INT, out, nvml.SUCCESS
}

func (g *GPU) GetTemperature(nvml.TemperatureSensors) (uint32, nvml.Return) {
	g.lib.calls.Add(1)
	return 45, nvml.SUCCESS
}

func (g *GPU) GetPowerUsage() (uint32, nvml.Return) { g.lib.calls.Add(1); return 300_000, nvml.SUCCESS }

func (g *GPU) GetMigMode() (int, int, nvml.Return) {
	g.lib.calls.Add(1)
	return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS
}

func (g *GPU) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	g.lib.calls.Add(2)
	return append([]nvml.ProcessInfo(nil), g.Processes...), nvml.SUCCESS
}

// GetGraphicsRunningProcesses: none (a compute GPU); one call, as NVML
// answers at once when the list is empty.
func (g *GPU) GetGraphicsRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	g.lib.calls.Add(1)
	return []nvml.ProcessInfo{}, nvml.SUCCESS
}

// GetProcessUtilization gives one sample per busy process, stamped at the
// clock (a few hundred microseconds apart).
func (g *GPU) GetProcessUtilization(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	g.lib.calls.Add(2)
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]nvml.ProcessUtilizationSample, 0, len(g.SM))
	for i, p := range g.Processes {
		if sm, ok := g.SM[p.Pid]; ok {
			out = append(out, nvml.ProcessUtilizationSample{Pid: p.Pid, TimeStamp: g.now - uint64(300*i), SmUtil: sm})
		}
	}
	if len(out) == 0 {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return out, nvml.SUCCESS
}

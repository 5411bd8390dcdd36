// Package gputest builds GPU scenarios for tests: the same description of a
// node (GPUs, processes, Xid events, failing GPUs) can be written as a sim
// file for the sim backend, served by an in-memory Fake backend, or turned
// into the gpu.Snapshot a test expects back. A test table then reads like
// the scenario it checks:
//
//	gputest.WriteSimFile(t, path,
//		gputest.GPU(gputest.UUID(0), 48<<30,
//			gputest.Proc(4242, 4<<30, 0.30),
//			gputest.Proc(4343, 2<<30, 0.10)),
//		gputest.GPU(gputest.UUID(1), 48<<30).WithXids(79),
//	)
package gputest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/internal/xidcount"
	"github.com/gpuslice/gpuslice/internal/gpu/sim"
)

// DefaultName is the name GPU gives a GPU: the card of the time-slicing
// homelab this project started from.
const DefaultName = "NVIDIA RTX A6000"

// A6000MemoryBytes is the memory of an RTX A6000 as NVML reports it.
const A6000MemoryBytes = 51527024640

// GPUSpec is one GPU of a scenario. Device.Index is ignored: a GPU's index
// is its position in the list it is passed in. Device.MemoryUsedBytes 0
// means "the sum of the processes' memory", as in a sim file.
type GPUSpec struct {
	gpu.Device
	// Xids lists Xid events, one entry per event (79, 79 is two events).
	Xids []uint64
	// Error, when set, makes this GPU fail its reading with this text.
	Error string
}

// GPU returns a GPU named DefaultName with the given processes.
func GPU(uuid string, memoryTotalBytes uint64, procs ...gpu.Process) GPUSpec {
	return GPUSpec{Device: gpu.Device{
		UUID:             uuid,
		Name:             DefaultName,
		MemoryTotalBytes: memoryTotalBytes,
		Processes:        slices.Clone(procs),
	}}
}

// Proc returns a process with an SM utilization sample (0..1).
func Proc(pid int, usedMemoryBytes uint64, smUtilization float64) gpu.Process {
	return gpu.Process{PID: pid, UsedMemoryBytes: usedMemoryBytes, SMUtilization: smUtilization, HasSMUtilization: true}
}

// ProcNoSample returns a process the driver has no SM sample for.
func ProcNoSample(pid int, usedMemoryBytes uint64) gpu.Process {
	return gpu.Process{PID: pid, UsedMemoryBytes: usedMemoryBytes}
}

// WithXids returns g with these Xid events added.
func (g GPUSpec) WithXids(xids ...uint64) GPUSpec {
	g.Xids = append(slices.Clone(g.Xids), xids...)
	return g
}

// WithError returns g failing its readings with msg.
func (g GPUSpec) WithError(msg string) GPUSpec {
	g.Error = msg
	return g
}

// WithUnsupported returns g without the readings r, as a GPU whose driver
// answers NOT_SUPPORTED for them.
func (g GPUSpec) WithUnsupported(r gpu.Readings) GPUSpec {
	g.Missing |= r
	if r.Has(gpu.ReadingUtilization) {
		g.Utilization = 0
	}
	if r.Has(gpu.ReadingTemperature) {
		g.TemperatureCelsius = 0
	}
	if r.Has(gpu.ReadingPower) {
		g.PowerWatts = 0
	}
	return g
}

// WithMIG returns g with MIG mode on and these MIG devices. As NVML does on
// a MIG-enabled GPU, it gives no device utilization. The sim file gives
// every MIG device memory: one without HasMemory reads back with its used
// memory summed from its processes.
func (g GPUSpec) WithMIG(devices ...gpu.MIGDevice) GPUSpec {
	g = g.WithUnsupported(gpu.ReadingUtilization)
	g.MIGEnabled = true
	g.MIGDevices = slices.Clone(devices)
	return g
}

// WithUtilization returns g with the device utilization u (0..1).
func (g GPUSpec) WithUtilization(u float64) GPUSpec {
	g.Utilization = u
	return g
}

// WithMemoryUsed returns g reporting n bytes used, whatever its processes
// hold (memory held by contexts outside any listed process).
func (g GPUSpec) WithMemoryUsed(n uint64) GPUSpec {
	g.MemoryUsedBytes = n
	return g
}

// UUID returns a fixed, valid-looking UUID for GPU i, so scenarios and
// golden files stay stable.
func UUID(i int) string {
	return fmt.Sprintf("GPU-00000000-0000-4000-8000-%012x", i)
}

// Node returns a busy node of n A6000 GPUs with procsPerGPU processes each:
// PIDs unique on the node, memory and SM utilization varying by process,
// one Xid 13 on GPU 0. The scenario of the benchmarks (8 × 64).
func Node(n, procsPerGPU int) []GPUSpec {
	gpus := make([]GPUSpec, n)
	for i := range gpus {
		procs := make([]gpu.Process, procsPerGPU)
		for j := range procs {
			pid := 10000 + i*procsPerGPU + j
			procs[j] = Proc(pid, uint64(j%8+1)<<26, float64(j%10)/100)
		}
		g := GPU(UUID(i), A6000MemoryBytes, procs...)
		g.Utilization = 0.5
		g.TemperatureCelsius = 60
		g.PowerWatts = 200
		if i == 0 {
			g.Xids = []uint64{13}
		}
		gpus[i] = g
	}
	return gpus
}

// SimFile returns the sim file describing gpus.
func SimFile(gpus ...GPUSpec) sim.File {
	f := sim.File{GPUs: make([]sim.GPU, len(gpus))}
	for i, g := range gpus {
		s := sim.GPU{
			UUID:               g.UUID,
			Name:               g.Name,
			MemoryTotalBytes:   g.MemoryTotalBytes,
			Utilization:        g.Utilization,
			TemperatureCelsius: g.TemperatureCelsius,
			PowerWatts:         g.PowerWatts,
			Error:              g.Error,
			Unsupported:        g.Missing.Names(),
		}
		if g.MemoryUsedBytes != 0 {
			s.MemoryUsedBytes = &g.MemoryUsedBytes
		}
		for _, x := range g.Xids {
			s.XidEvents = append(s.XidEvents, sim.XidEvent{Xid: x})
		}
		for _, p := range g.Processes {
			sp := sim.Process{PID: p.PID, UsedMemoryBytes: p.UsedMemoryBytes, MPSServer: p.MPSServer}
			if p.HasSMUtilization {
				sp.SMUtilization = &p.SMUtilization
			}
			if p.InMIG {
				sp.GPUInstance, sp.ComputeInstance = &p.GPUInstanceID, &p.ComputeInstanceID
			}
			s.Processes = append(s.Processes, sp)
		}
		for _, m := range g.MIGDevices {
			sm := sim.MIGDevice{UUID: m.UUID, Name: m.Name, GPUInstance: m.GPUInstanceID,
				ComputeInstance: m.ComputeInstanceID, MemoryTotalBytes: m.MemoryTotalBytes}
			if m.HasMemory {
				sm.MemoryUsedBytes = &m.MemoryUsedBytes
			}
			s.MIG = append(s.MIG, sm)
		}
		f.GPUs[i] = s
	}
	return f
}

// SimYAML returns the contents of the sim file describing gpus.
func SimYAML(gpus ...GPUSpec) []byte {
	data, err := yaml.Marshal(SimFile(gpus...))
	if err != nil {
		panic(fmt.Sprintf("gputest: marshal sim file: %v", err)) // only plain structs: cannot fail
	}
	return data
}

// WriteSimFile writes the sim file describing gpus at path. It replaces the
// file atomically (temporary file, then rename), so a backend reading it at
// the same moment sees the old scenario or the new one, never half of one.
func WriteSimFile(t testing.TB, path string, gpus ...GPUSpec) {
	t.Helper()
	if err := writeAtomic(path, SimYAML(gpus...)); err != nil {
		t.Fatalf("gputest: write sim file: %v", err)
	}
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	if err := errors.Join(werr, tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

// NewSim writes gpus to a sim file in a fresh temporary directory and
// returns a sim backend over it and the file's path (rewrite it with
// WriteSimFile to change the scenario). The backend is closed at the end of
// the test.
func NewSim(t testing.TB, gpus ...GPUSpec) (*sim.Backend, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gpus.yaml")
	WriteSimFile(t, path, gpus...)
	b := sim.New(path)
	t.Cleanup(func() { b.Close() })
	return b, path
}

// Snapshot returns the snapshot a backend reports for gpus: indexes by
// position, failing GPUs in Failed (their Err carries the Error text;
// compare errors by message), MemoryUsedBytes 0 replaced by the processes'
// sum, driver version sim.DefaultDriverVersion. It is computed here, not by
// the sim backend, so tests can hold the backend to it.
func Snapshot(gpus ...GPUSpec) gpu.Snapshot {
	s := gpu.Snapshot{DriverVersion: sim.DefaultDriverVersion, Devices: []gpu.Device{}}
	for i, g := range gpus {
		if g.Error != "" {
			s.Failed = append(s.Failed, gpu.DeviceError{Index: i, UUID: g.UUID, Err: errors.New(g.Error)})
			continue
		}
		d := g.Device
		d.Index = i
		d.Processes = slices.Clone(g.Processes)
		d.MIGDevices = slices.Clone(g.MIGDevices)
		if d.MemoryUsedBytes == 0 {
			for _, p := range d.Processes {
				d.MemoryUsedBytes += p.UsedMemoryBytes
			}
		}
		s.Devices = append(s.Devices, d)
	}
	return s
}

// Xids returns the Xid counts of gpus (one per listed event), sorted by UUID
// then Xid as gpu.Backend.Xids returns them.
func Xids(gpus ...GPUSpec) []gpu.XidCount {
	out := []gpu.XidCount{}
	for i, g := range gpus {
		for _, x := range g.Xids {
			j := slices.IndexFunc(out, func(c gpu.XidCount) bool { return c.UUID == g.UUID && c.Xid == x })
			if j < 0 {
				out = append(out, gpu.XidCount{UUID: g.UUID, Index: i, Xid: x})
				j = len(out) - 1
			}
			out[j].Count++
		}
	}
	xidcount.Sort(out)
	return out
}

// Fake is an in-memory gpu.Backend whose readings the test sets. It is
// safe for concurrent use, so a test may change it while the code under
// test reads it.
type Fake struct {
	mu        sync.Mutex
	snap      gpu.Snapshot
	xids      []gpu.XidCount
	err       error
	snapshots int
	closed    bool
}

var _ gpu.Backend = (*Fake)(nil)

// NewFake returns a Fake serving gpus.
func NewFake(gpus ...GPUSpec) *Fake {
	f := &Fake{}
	f.Set(gpus...)
	return f
}

// Set makes the Fake serve gpus: Snapshot(gpus...) and Xids(gpus...). It
// clears an error set by SetError.
func (f *Fake) Set(gpus ...GPUSpec) {
	s, x := Snapshot(gpus...), Xids(gpus...)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snap, f.xids, f.err = s, x, nil
}

// SetSnapshot makes the Fake serve s as it is (for readings GPUSpec cannot
// describe, such as a DeviceError without a UUID).
func (f *Fake) SetSnapshot(s gpu.Snapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snap, f.err = cloneSnapshot(s), nil
}

// SetXids makes Xids return counts.
func (f *Fake) SetXids(counts ...gpu.XidCount) {
	c := slices.Clone(counts)
	xidcount.Sort(c)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.xids = c
}

// SetError makes Snapshot fail with err (nil to read again), as when the
// whole backend is unavailable. Wrap gpu.ErrUnavailable to be realistic.
func (f *Fake) SetError(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// Snapshot returns a copy of what the test set, or its error.
func (f *Fake) Snapshot(ctx context.Context) (gpu.Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return gpu.Snapshot{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snapshots++
	if f.err != nil {
		return gpu.Snapshot{}, f.err
	}
	return cloneSnapshot(f.snap), nil
}

// Xids returns a copy of the counts the test set.
func (f *Fake) Xids() []gpu.XidCount {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.xids)
}

// Close marks the Fake closed.
func (f *Fake) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// Closed reports whether Close was called.
func (f *Fake) Closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// Snapshots returns how many times Snapshot was called.
func (f *Fake) Snapshots() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snapshots
}

// cloneSnapshot copies s deeply, so that neither the test nor the code
// under test can change the other's slices.
func cloneSnapshot(s gpu.Snapshot) gpu.Snapshot {
	s.Devices = slices.Clone(s.Devices)
	for i := range s.Devices {
		s.Devices[i].Processes = slices.Clone(s.Devices[i].Processes)
		s.Devices[i].MIGDevices = slices.Clone(s.Devices[i].MIGDevices)
	}
	s.Failed = slices.Clone(s.Failed)
	return s
}

// Package gpu is the one interface gpuslice has to GPUs. The exporter and the
// device plugin read devices, memory, utilization, processes and Xid events
// through Backend, and never call NVML directly, so that every program can run
// on the simulated node (backend "sim") as well as on real hardware ("nvml").
package gpu

import (
	"context"
	"errors"
	"strconv"
)

// ErrUnavailable wraps the error of a backend that cannot be read at all (no
// NVML library, a sim file that does not exist or does not parse).
var ErrUnavailable = errors.New("gpu backend unavailable")

// Process is one process holding a context on a GPU.
type Process struct {
	PID             int
	UsedMemoryBytes uint64
	// MemoryUnknown is true where the driver does not account for the
	// process's memory to this caller (NVML's NVML_VALUE_NOT_AVAILABLE,
	// which nvidia-smi prints as N/A): UsedMemoryBytes is then 0 and
	// means nothing. The GPU's own used memory still counts it.
	MemoryUnknown bool
	// SMUtilization is the share of the GPU's SMs this process kept busy,
	// 0..1, over the time since the backend's previous reading of the GPU
	// (the window of Device.Utilization where the GPU keeps samples; the
	// processes of one GPU then add up to no more than it). A process the
	// driver lists without any utilization sample in that time ran no
	// kernel: 0, with HasSMUtilization set.
	// HasSMUtilization is false where no figure can be had: per-process
	// utilization unsupported (MIG-enabled GPUs, old GPUs) or its call failed.
	SMUtilization    float64
	HasSMUtilization bool
	// InMIG is true for a process in a MIG instance of a MIG-enabled GPU;
	// GPUInstanceID and ComputeInstanceID then name the instance (NVML's
	// IDs, from 0). ComputeInstanceID is -1 where the driver gave only the
	// GPU instance. Outside MIG both are 0 and mean nothing.
	InMIG             bool
	GPUInstanceID     int
	ComputeInstanceID int
	// MPSServer is true for a CUDA MPS server (nvidia-cuda-mps-server):
	// the process that holds the GPU for every MPS client, counted by the
	// exporter as the GPU's MPS overhead rather than any container's. A
	// backend that cannot tell leaves it false; the exporter also knows
	// the server by its command name in /proc.
	MPSServer bool
}

// MIGDevice is one MIG device of a MIG-enabled GPU: a GPU instance with one
// compute instance, what CUDA and the device plugin see as one device.
type MIGDevice struct {
	// Index is its place among its GPU's MIG devices, as
	// nvmlDeviceGetMigDeviceHandleByIndex numbers them.
	Index int
	// UUID is the MIG device's UUID as NVML prints it: "MIG-<uuid>" from
	// driver R470 on, "MIG-GPU-<gpu uuid>/<gi>/<ci>" before. The device
	// plugin advertises it as the device ID.
	UUID string
	// Name is NVML's name for it, with the profile ("NVIDIA A100-SXM4-40GB
	// MIG 1g.5gb"); empty when it could not be read.
	Name                             string
	GPUInstanceID, ComputeInstanceID int
	// MemoryTotalBytes and MemoryUsedBytes are the instance's own memory,
	// a hardware partition of the GPU's; HasMemory is false when NVML did
	// not give them, and then they are 0, not a reading.
	MemoryTotalBytes, MemoryUsedBytes uint64
	HasMemory                         bool
}

// Device is one physical GPU as read at one moment.
type Device struct {
	Index            int
	UUID             string
	Name             string
	MemoryTotalBytes uint64
	MemoryUsedBytes  uint64
	// Utilization is the device's SM busy ratio, 0..1: over the time since
	// the backend's previous reading, as its processes' SMUtilization,
	// where the GPU keeps utilization samples; otherwise over the driver's
	// last sample period.
	Utilization        float64
	TemperatureCelsius float64
	PowerWatts         float64
	// Missing lists the readings above that the GPU did not give in this
	// snapshot (the driver does not support them there, such as power on a
	// card without a sensor or utilization on a MIG-enabled GPU, or the
	// call failed). Their fields are 0, which must not be shown as a
	// reading: a power of 0 W or a utilization of 0 is a claim.
	Missing Readings
	// Processes holds compute and graphics processes, each PID once. On
	// a MIG-enabled GPU they are those of every MIG instance.
	Processes []Process
	// MIGEnabled is true when the GPU's current MIG mode is on; MIGDevices
	// then lists the MIG devices that NVML gave, by Index.
	MIGEnabled bool
	MIGDevices []MIGDevice
}

// MIGDevice returns the MIG device of d that holds GPU instance gi and
// compute instance ci; ci -1 matches a GPU instance with one MIG device.
func (d *Device) MIGDevice(gi, ci int) (*MIGDevice, bool) {
	var found *MIGDevice
	for i := range d.MIGDevices {
		m := &d.MIGDevices[i]
		if m.GPUInstanceID != gi || (ci >= 0 && m.ComputeInstanceID != ci) {
			continue
		}
		if found != nil {
			return nil, false // ci unknown and the instance has several
		}
		found = m
	}
	return found, found != nil
}

// Readings is a set of a Device's optional readings. The zero value is the
// empty set, so a Device built without it has every reading.
type Readings uint8

// The optional readings of a Device.
const (
	ReadingUtilization Readings = 1 << iota
	ReadingTemperature
	ReadingPower
)

// Has reports whether r holds every reading of x.
func (r Readings) Has(x Readings) bool { return r&x == x }

// readingNames names the readings, as the sim file's "unsupported" list does.
var readingNames = []struct {
	r    Readings
	name string
}{
	{ReadingUtilization, "utilization"},
	{ReadingTemperature, "temperature"},
	{ReadingPower, "power"},
}

// Names returns the names of the readings in r.
func (r Readings) Names() []string {
	var names []string
	for _, n := range readingNames {
		if r.Has(n.r) {
			names = append(names, n.name)
		}
	}
	return names
}

// ReadingNamed returns the reading called name ("utilization",
// "temperature" or "power").
func ReadingNamed(name string) (Readings, bool) {
	for _, n := range readingNames {
		if n.name == name {
			return n.r, true
		}
	}
	return 0, false
}

// DeviceError says that one GPU failed a call during a snapshot. The other
// GPUs of the snapshot are still valid.
type DeviceError struct {
	Index int
	UUID  string // empty when not even the UUID could be read
	Err   error
}

func (e *DeviceError) Error() string {
	if e.UUID != "" {
		return "gpu " + e.UUID + ": " + e.Err.Error()
	}
	return "gpu index " + strconv.Itoa(e.Index) + ": " + e.Err.Error()
}

func (e *DeviceError) Unwrap() error { return e.Err }

// Snapshot is one reading of every GPU on the node.
type Snapshot struct {
	DriverVersion string
	Devices       []Device
	// Failed lists the GPUs that failed a call in this reading; they are not
	// in Devices.
	Failed []DeviceError
}

// XidCount is the number of Xid events of one kind seen on one GPU since the
// backend started. Counts only grow.
type XidCount struct {
	UUID  string
	Index int
	Xid   uint64
	Count uint64
}

// Backend reads GPUs. Implementations are safe for concurrent use.
type Backend interface {
	// Snapshot reads every GPU. It returns an error (wrapping
	// ErrUnavailable) only when nothing at all could be read; a single GPU's
	// failure is reported in Snapshot.Failed.
	Snapshot(ctx context.Context) (Snapshot, error)
	// Xids returns the cumulative Xid counts, sorted by UUID then Xid.
	Xids() []XidCount
	// Close releases the backend (stops event readers, shuts NVML down).
	Close() error
}

// ProcessLister is a Backend that lists one GPU's compute processes on
// their own, without the rest of a Snapshot: no utilization sample is
// read, so the window the next Snapshot reports over does not move. The
// exporter's OOM watch, which reads logs between scrapes, asks it whether
// a GPU runs a CUDA MPS server now.
type ProcessLister interface {
	// ComputeProcesses lists the compute processes of GPU uuid (PID,
	// memory, MPSServer where the backend knows it). It fails for a GPU
	// it does not know.
	ComputeProcesses(ctx context.Context, uuid string) ([]Process, error)
}

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
	// SMUtilization is the share of the GPU's SMs this process kept busy over
	// the last sample period, 0..1 (0 when the driver reports that no process
	// ran a kernel in the period). HasSMUtilization is false where no figure
	// can be had: per-process utilization unsupported, or its call failed.
	SMUtilization    float64
	HasSMUtilization bool
}

// Device is one physical GPU as read at one moment.
type Device struct {
	Index            int
	UUID             string
	Name             string
	MemoryTotalBytes uint64
	MemoryUsedBytes  uint64
	// Utilization is the device's SM busy ratio, 0..1.
	Utilization        float64
	TemperatureCelsius float64
	PowerWatts         float64
	// Processes holds compute and graphics processes, each PID once.
	Processes []Process
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

// Package nvmlbackend is the GPU backend over NVIDIA's NVML library, through
// github.com/NVIDIA/go-nvml. It takes an nvml.Interface so that tests run
// against go-nvml's mocks; programs pass nvml.New().
//
// NVML must be initialized before any other call: without libnvidia-ml,
// Init returns ERROR_LIBRARY_NOT_FOUND and any further call kills the
// process. New therefore calls Init first and nothing else when it fails.
//
// Per GPU, a reading needs the handle, the UUID and the memory information:
// if any of those calls fails the GPU goes to Snapshot.Failed for that
// reading and the other GPUs still come back. Every other reading (name,
// utilization, temperature, power, compute and graphics process lists,
// per-process utilization) is optional: when it fails it is left empty for
// that snapshot, and utilization, temperature and power are marked in
// Device.Missing so that no series shows a 0 the GPU never reported. The GPU
// still comes back, because one reading the driver cannot give (a power
// sensor answering ERROR_UNKNOWN) says nothing about whether the GPU can run
// work, and the device plugin marks a failed GPU unhealthy. A failing
// optional reading is logged once per GPU and reading until it answers
// again; ERROR_NOT_SUPPORTED (no power sensor, utilization on a MIG-enabled
// GPU) is logged once for the life of the backend. The exception is a
// return saying the GPU itself is gone or unusable (ERROR_GPU_IS_LOST,
// ERROR_GPU_NOT_FOUND, ERROR_RESET_REQUIRED, and the driver being unloaded
// or replaced under the process): from any call it fails the GPU.
//
// Utilization is read over one window per GPU, the time since the
// previous reading (window.go): each process's SM share is the
// time-weighted mean of its nvmlDeviceGetProcessUtilization samples newer
// than the last timestamp seen, each sample's smUtil being already that
// process's share of the GPU; the GPU's own utilization is the mean of its
// GPU_UTILIZATION samples (nvmlDeviceGetSamples) over the same window,
// falling back to nvmlDeviceGetUtilizationRates (NVML's last sample
// period) where the driver keeps none; and the shares are scaled down to
// add up to no more than that GPU figure. A listed process without a
// sample ran no kernel and reads 0 (with HasSMUtilization set). Only a GPU
// that cannot give process samples at all (ERROR_NOT_SUPPORTED), or a
// failed call, leaves processes without a figure.
//
// NVML that breaks under a running process is initialized again: a reading
// that cannot count the GPUs, or reads none of them, makes the next reading
// shut NVML down and call Init again, with backoff while that does not
// help (recover.go). Readings that fail because the library and the driver
// no longer fit (ERROR_LIB_RM_VERSION_MISMATCH, ERROR_DRIVER_NOT_LOADED,
// ERROR_UNINITIALIZED) or because a GPU is gone (ERROR_GPU_IS_LOST) fail
// the GPU; ERROR_UNKNOWN fails it from a required call and empties an
// optional reading. Init failures name their usual cause and fix.
//
// On a GPU whose MIG mode is on, each MIG device is read through its MIG
// device handle (UUID, GPU and compute instance IDs, name, the instance's
// own memory), and each process keeps the instances NVML lists it in, so
// that the attribution can put it on its MIG device. The process lists and
// the memory of the Device stay the whole GPU's. A GPU that does not
// support MIG (NOT_SUPPORTED for its mode) is a GPU without MIG, and is not
// logged.
//
// Xid events are read by a goroutine waiting on an NVML event set with
// EventTypeXidCriticalError registered on every GPU that supports it; the
// set is created again after each re-initialization, and after a GPU of it
// is lost (on the GPUs still there), and counts go on. An event is put on
// its GPU by the handle it was registered with, which a GPU that fell off
// the bus still carries when it no longer answers GetUUID.
package nvmlbackend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/internal/xidcount"
)

// DefaultXidPollTimeout is how long one wait for Xid events lasts when
// Options.XidPollTimeout is 0. Close waits at most about this long for the
// event goroutine to stop.
const DefaultXidPollTimeout = time.Second

// Options tune a Backend. The zero value is ready to use.
type Options struct {
	// Logger receives warnings (Xid events that cannot be read, GPUs that
	// cannot report them); nil means slog.Default().
	Logger *slog.Logger
	// XidPollTimeout is how long each wait on the event set lasts.
	XidPollTimeout time.Duration
	// RetryInit makes New succeed when NVML cannot be initialized: the
	// backend starts without NVML, every Snapshot fails (wrapping
	// gpu.ErrUnavailable, naming the likely fix) and Init is tried again
	// with backoff. The exporter uses it so that it keeps serving, and says
	// why, where a crash loop would only hide the message behind restarts.
	RetryInit bool
	// InitBackoff is the wait after a failed re-initialization before the
	// next, doubled at each further failure up to MaxInitBackoff. Zero
	// means DefaultInitBackoff and DefaultMaxInitBackoff.
	InitBackoff, MaxInitBackoff time.Duration
	// Now is the clock of the backoff; nil means time.Now.
	Now func() time.Time
}

// Backend reads GPUs through NVML. It is safe for concurrent use.
type Backend struct {
	lib           nvml.Interface
	log           *slog.Logger
	driverVersion string

	xids xidcount.Counts

	// windows holds, per GPU UUID, where the previous reading's samples
	// ended, so that each reading asks only for newer samples.
	mu      sync.Mutex
	windows map[string]sampleWindow
	// ids holds, per GPU index, what does not change while NVML stays
	// initialized: the handle, UUID and name. Each is a call into
	// libnvidia-ml at every scrape otherwise. Emptied by start (a new
	// NVML session) and, for one GPU, when a call says it is gone.
	ids map[int]identity
	// failing holds the optional readings that failed at their last try
	// and have been logged, so that a lasting failure is logged once.
	failing map[reading]bool
	// unsupported holds the readings that answered ERROR_NOT_SUPPORTED and
	// have been logged: what a GPU does not support it never will, so that
	// is said once.
	unsupported map[reading]bool

	// ready says NVML is initialized: until it is, no call but Init may be
	// made (without libnvidia-ml any other call kills the process). ready
	// and xid change only under life's write lock.
	ready bool
	// xid reads Xid events; nil when no GPU reports them or NVML is down.
	xid          *xidReader
	xidTimeoutMs uint32
	// init holds the re-initialization state, guarded by mu.
	init initState
	// life keeps Close (and a re-initialization) from shutting NVML down,
	// which unloads the library, under a running Snapshot; closed turns
	// later Snapshots away.
	life     sync.RWMutex
	closed   bool
	closeErr error
	once     sync.Once
}

var (
	_ gpu.Backend       = (*Backend)(nil)
	_ gpu.ProcessLister = (*Backend)(nil)
)

// New initializes NVML through lib and starts reading Xid events. When
// NVML cannot be initialized it returns an error wrapping
// gpu.ErrUnavailable and the nvml.Return, with the likely fix, and makes no
// other call on lib; with Options.RetryInit it logs that error and returns
// a backend that tries again. A GPU that cannot report Xid events is logged
// and read without them.
func New(lib nvml.Interface, opts Options) (*Backend, error) {
	b := &Backend{
		lib:         lib,
		log:         opts.Logger,
		windows:     make(map[string]sampleWindow),
		ids:         make(map[int]identity),
		failing:     make(map[reading]bool),
		unsupported: make(map[reading]bool),
		init:        newInitState(opts),
	}
	if b.log == nil {
		b.log = slog.Default()
	}
	timeout := opts.XidPollTimeout
	if timeout <= 0 {
		timeout = DefaultXidPollTimeout
	}
	b.xidTimeoutMs = uint32(min(timeout.Milliseconds(), int64(^uint32(0))))
	if ret := lib.Init(); ret != nvml.SUCCESS {
		err := initError(ret)
		if !opts.RetryInit {
			return nil, err
		}
		retry := b.init.failed(err)
		b.log.Error("nvml: cannot initialize NVML; no GPU metrics until it can, retrying", "error", err, "retry_in", retry)
		return b, nil
	}
	b.start()
	return b, nil
}

// start reads what is read once per NVML initialization and starts the Xid
// reader. Callers hold life's write lock, or own b alone.
func (b *Backend) start() {
	b.ready = true
	b.mu.Lock()
	clear(b.ids) // handles of an earlier session mean nothing in this one
	b.mu.Unlock()
	if v, ret := b.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		b.driverVersion = v
	} else {
		b.log.Warn("nvml: cannot read the driver version", "error", ret.Error())
	}
	b.xid = b.registerXidEvents()
	if b.xid != nil {
		go b.readXidEvents(b.xid)
	}
}

// Snapshot reads every GPU. It fails as a whole (wrapping
// gpu.ErrUnavailable) when NVML is not initialized, when the GPUs cannot be
// counted, or after Close. A failed GPU's error wraps the nvml.Return of
// the call that failed.
//
// A reading that cannot count the GPUs, or that counts some and reads none,
// means NVML itself is broken: the driver was unloaded or upgraded under
// the process (ERROR_DRIVER_NOT_LOADED, ERROR_LIB_RM_VERSION_MISMATCH), the
// container lost its device access (ERROR_UNKNOWN after a systemd
// daemon-reload), or every GPU fell off the bus (ERROR_GPU_IS_LOST). The
// next Snapshot then shuts NVML down and initializes it again, and keeps
// trying with backoff until a reading gives a GPU.
func (b *Backend) Snapshot(ctx context.Context) (gpu.Snapshot, error) {
	b.reinitIfDue()
	b.life.RLock()
	defer b.life.RUnlock()
	if b.closed {
		return gpu.Snapshot{}, fmt.Errorf("%w: nvml backend closed", gpu.ErrUnavailable)
	}
	if !b.ready {
		return gpu.Snapshot{}, b.init.unavailable(b.now())
	}
	n, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		err := fmt.Errorf("%w: nvml device count: %w", gpu.ErrUnavailable, ret)
		b.brokenBy(err)
		return gpu.Snapshot{}, err
	}
	s := gpu.Snapshot{DriverVersion: b.driverVersion, Devices: make([]gpu.Device, 0, n)}
	for i := range n {
		if err := ctx.Err(); err != nil {
			return gpu.Snapshot{}, err
		}
		d, derr := b.readDevice(i)
		if derr != nil {
			s.Failed = append(s.Failed, *derr)
			continue
		}
		s.Devices = append(s.Devices, d)
	}
	switch {
	case len(s.Devices) > 0:
		b.mu.Lock()
		recovered := b.init.readable()
		b.mu.Unlock()
		if recovered {
			b.log.Info("nvml: GPUs readable again")
		}
	case len(s.Failed) > 0:
		b.brokenBy(fmt.Errorf("no GPU readable: %w", &s.Failed[0]))
	}
	return s, nil
}

// ComputeProcesses lists GPU uuid's compute processes (PID and memory)
// with one NVML call (0.6 ms of CPU beside 48 processes on an H200),
// reading no utilization sample. The GPU must have been read by a
// Snapshot since NVML was last initialized: its handle is taken from
// what that reading cached.
func (b *Backend) ComputeProcesses(ctx context.Context, uuid string) ([]gpu.Process, error) {
	b.life.RLock()
	defer b.life.RUnlock()
	if b.closed || !b.ready {
		return nil, fmt.Errorf("%w: nvml not initialized", gpu.ErrUnavailable)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var h nvml.Device
	b.mu.Lock()
	for _, id := range b.ids {
		if id.uuid == uuid {
			h = id.h
			break
		}
	}
	b.mu.Unlock()
	if h == nil {
		return nil, fmt.Errorf("GPU %s: not read since NVML was initialized", uuid)
	}
	list, ret := h.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GPU %s: %w", uuid, &callError{callCompute, ret})
	}
	procs := make([]gpu.Process, 0, len(list))
	for _, p := range list {
		mem, known := usedMemory(p)
		procs = append(procs, gpu.Process{PID: int(p.Pid), UsedMemoryBytes: mem, MemoryUnknown: !known})
	}
	return procs, nil
}

// callError is an NVML call that failed.
type callError struct {
	call string
	ret  nvml.Return
}

func (e *callError) Error() string { return e.call + ": " + e.ret.Error() }

// Unwrap lets errors.Is match the NVML return (nvml.Return is an error).
func (e *callError) Unwrap() error { return e.ret }

// The optional readings, named as in logs and errors.
const (
	callName         = "get name"
	callUtilization  = "get utilization"
	callUtilSamples  = "get utilization samples"
	callTemperature  = "get temperature"
	callPower        = "get power usage"
	callCompute      = "get compute processes"
	callGraphics     = "get graphics processes"
	callProcessUtil  = "get process utilization"
	callMIGMode      = "get MIG mode"
	callMIGCount     = "get max MIG device count"
	callMIGHandle    = "get MIG device handle"
	callMIGUUID      = "get MIG device uuid"
	callMIGInstance  = "get MIG device instance IDs"
	callMIGName      = "get MIG device name"
	callMIGMemory    = "get MIG device memory info"
	callMIGProcesses = "get MIG device compute processes"
)

// migCall names a call on MIG device i, so that each MIG device's
// readings are logged apart: one device failing while another answers must
// not read as one reading flapping.
func migCall(call string, i int) string {
	return call + " (MIG device " + strconv.Itoa(i) + ")"
}

// reading is one optional reading of one GPU.
type reading struct {
	uuid, call string
}

// gpuGone reports whether a return says the GPU (or the driver under it) is
// gone or unusable, rather than that one reading could not be taken.
func gpuGone(ret nvml.Return) bool {
	switch ret {
	case nvml.ERROR_GPU_IS_LOST, nvml.ERROR_GPU_NOT_FOUND, nvml.ERROR_RESET_REQUIRED,
		nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_LIB_RM_VERSION_MISMATCH, nvml.ERROR_UNINITIALIZED:
		return true
	}
	return false
}

// optional judges the return of an optional reading: ok when it gave a
// value, an error (failing the GPU) only when the GPU is gone. Any other
// failure leaves the reading empty and is logged when it starts.
func (b *Backend) optional(uuid, call string, ret nvml.Return) (ok bool, err error) {
	switch {
	case ret == nvml.SUCCESS:
		b.answered(uuid, call)
		return true, nil
	case ret == nvml.ERROR_NOT_SUPPORTED:
		b.answered(uuid, call)
		b.mu.Lock()
		logged := b.unsupported[reading{uuid, call}]
		b.unsupported[reading{uuid, call}] = true
		b.mu.Unlock()
		if !logged {
			b.log.Info("nvml: GPU does not support a reading; it has no series", "uuid", uuid, "reading", call)
		}
		return false, nil
	case gpuGone(ret):
		return false, &callError{call, ret}
	}
	b.warnOnce(uuid, call, ret, "nvml: GPU reading failed; left empty until it answers")
	return false, nil
}

// answered notes that an optional reading answered, logging it if it had
// been failing.
func (b *Backend) answered(uuid, call string) {
	k := reading{uuid, call}
	b.mu.Lock()
	logged := b.failing[k]
	delete(b.failing, k)
	b.mu.Unlock()
	if logged {
		b.log.Info("nvml: GPU reading answers again", "uuid", uuid, "reading", call)
	}
}

// identity is what a GPU index names for the life of an NVML session.
type identity struct {
	h          nvml.Device
	uuid, name string
	// named: the name was read; a failed name is asked again next time.
	named bool
	// migOffUntil: the GPU answered that MIG is off (or not supported, and
	// then it is zero time's end) and is not asked again before then.
	migOffUntil time.Time
}

// migRecheck is how long a GPU that answered MIG off is not asked again.
// Its MIG mode is one of the four lists-and-modes a scrape reads, 0.36 ms
// of 7.9 on a real H200 in a Firecracker VM, where every NVML call costs
// the driver's round trip, and it changes only when an administrator
// drains the GPU and turns MIG on (then creates instances and restarts the
// device plugin): a change shows within this time.
const migRecheck = 30 * time.Second

// farFuture is the recheck time of a GPU without MIG support.
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// migOff reports whether GPU i answered MIG off recently enough not to
// be asked again.
func (b *Backend) migOff(i int, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	id, ok := b.ids[i]
	return ok && now.Before(id.migOffUntil)
}

// setMIGOff records GPU i's answer that MIG is off, until until.
func (b *Backend) setMIGOff(i int, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if id, ok := b.ids[i]; ok {
		id.migOffUntil = until
		b.ids[i] = id
	}
}

// identify returns GPU i's handle, UUID and name, from the cache or from
// NVML. The name is optional: ok is false only when the handle or the UUID
// could not be had (err then says which), and the UUID is set when known.
func (b *Backend) identify(i int) (id identity, err error) {
	b.mu.Lock()
	id, ok := b.ids[i]
	b.mu.Unlock()
	if ok && id.named {
		return id, nil
	}
	if !ok {
		var ret nvml.Return
		if id.h, ret = b.lib.DeviceGetHandleByIndex(i); ret != nvml.SUCCESS {
			return identity{}, &callError{"get handle", ret}
		}
		if id.uuid, ret = id.h.GetUUID(); ret != nvml.SUCCESS {
			return identity{}, &callError{"get uuid", ret}
		}
	}
	name, ret := id.h.GetName()
	if ok, err := b.optional(id.uuid, callName, ret); err != nil {
		return id, err
	} else if ok {
		id.name, id.named = name, true
	}
	b.mu.Lock()
	b.ids[i] = id
	b.mu.Unlock()
	return id, nil
}

// forgetGPU drops GPU i's cached identity, so that the next reading looks
// the GPU up again: after a GPU is lost, its handle may not come back.
func (b *Backend) forgetGPU(i int) {
	b.mu.Lock()
	delete(b.ids, i)
	b.mu.Unlock()
}

func (b *Backend) readDevice(i int) (gpu.Device, *gpu.DeviceError) {
	d := gpu.Device{Index: i}
	fail := func(err error) (gpu.Device, *gpu.DeviceError) {
		b.forgetGPU(i)
		return gpu.Device{}, &gpu.DeviceError{Index: i, UUID: d.UUID, Err: err}
	}
	id, err := b.identify(i)
	d.UUID, d.Name = id.uuid, id.name
	if err != nil {
		return fail(err)
	}
	h := id.h
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail(&callError{"get memory info", ret})
	}
	d.MemoryTotalBytes, d.MemoryUsedBytes = mem.Total, mem.Used
	util, err := b.readUtilization(h, d.UUID)
	if err != nil {
		return fail(err)
	} else if util.ok {
		d.Utilization = util.util
	} else {
		d.Missing |= gpu.ReadingUtilization
	}
	temp, ret := h.GetTemperature(nvml.TEMPERATURE_GPU)
	if ok, err := b.optional(d.UUID, callTemperature, ret); err != nil {
		return fail(err)
	} else if ok {
		d.TemperatureCelsius = float64(temp)
	} else {
		d.Missing |= gpu.ReadingTemperature
	}
	mw, ret := h.GetPowerUsage()
	if ok, err := b.optional(d.UUID, callPower, ret); err != nil {
		return fail(err)
	} else if ok {
		d.PowerWatts = float64(mw) / 1000
	} else {
		d.Missing |= gpu.ReadingPower
	}
	migProcs, err := b.readMIG(i, h, &d)
	if err != nil {
		return fail(err)
	}
	procs, err := b.readProcesses(h, d.UUID, d.MemoryUsedBytes, util, d.MIGEnabled, migProcs)
	if err != nil {
		return fail(err)
	}
	if util.windowed || (util.noNewSample && util.ok) {
		fitShares(procs, d.Utilization)
	}
	d.Processes = procs
	return d, nil
}

// migProcesses is the compute process list of one MIG device.
type migProcesses struct {
	gi, ci int
	list   []nvml.ProcessInfo
}

// readMIG reads the GPU's MIG mode and, when it is on, each MIG device's
// UUID, instance IDs, name, memory and processes, through the MIG device
// handles. All of it is optional: a GPU that does not support MIG
// (NOT_SUPPORTED) is a GPU without MIG, and a MIG device whose UUID or
// instance IDs cannot be read is left out (nothing could be joined to it).
// Its error is a GPU that is gone.
func (b *Backend) readMIG(i int, h nvml.Device, d *gpu.Device) ([]migProcesses, error) {
	now := b.now()
	if b.migOff(i, now) {
		return nil, nil
	}
	current, _, ret := h.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		// Most GPUs have no MIG: that is no missing reading, and not
		// worth a log line on every GeForce and workstation card; nor
		// worth asking again while NVML stays up.
		b.setMIGOff(i, farFuture)
		return nil, nil
	}
	if ok, err := b.optional(d.UUID, callMIGMode, ret); err != nil || !ok {
		return nil, err
	}
	if current != nvml.DEVICE_MIG_ENABLE {
		b.setMIGOff(i, now.Add(migRecheck))
		return nil, nil
	}
	d.MIGEnabled = true
	n, ret := h.GetMaxMigDeviceCount()
	if ok, err := b.optional(d.UUID, callMIGCount, ret); err != nil || !ok {
		return nil, err
	}
	var procs []migProcesses
	for i := range n {
		mh, ret := h.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND {
			continue // a slot without a MIG device
		}
		if ok, err := b.optional(d.UUID, migCall(callMIGHandle, i), ret); err != nil {
			return nil, err
		} else if !ok {
			continue
		}
		m, ok, err := b.readMIGDevice(mh, d.UUID, i)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		d.MIGDevices = append(d.MIGDevices, m)
		// The GPU's handle lists the processes of every instance only to
		// a caller with enough privileges; a MIG device's handle lists
		// its own (NVML API Reference, nvmlDeviceGetComputeRunningProcesses).
		list, ret := mh.GetComputeRunningProcesses()
		if ok, err := b.optional(d.UUID, migCall(callMIGProcesses, i), ret); err != nil {
			return nil, err
		} else if ok && len(list) > 0 {
			procs = append(procs, migProcesses{gi: m.GPUInstanceID, ci: m.ComputeInstanceID, list: list})
		}
	}
	return procs, nil
}

// readMIGDevice reads MIG device i of GPU uuid. ok is false when its
// identity (UUID, instance IDs) could not be read.
func (b *Backend) readMIGDevice(mh nvml.Device, uuid string, i int) (m gpu.MIGDevice, ok bool, err error) {
	m.Index = i
	var ret nvml.Return
	m.UUID, ret = mh.GetUUID()
	if ok, err := b.optional(uuid, migCall(callMIGUUID, i), ret); !ok {
		return m, false, err
	}
	m.GPUInstanceID, ret = mh.GetGpuInstanceId()
	if ok, err := b.optional(uuid, migCall(callMIGInstance, i), ret); !ok {
		return m, false, err
	}
	m.ComputeInstanceID, ret = mh.GetComputeInstanceId()
	if ok, err := b.optional(uuid, migCall(callMIGInstance, i), ret); !ok {
		return m, false, err
	}
	name, ret := mh.GetName()
	if ok, err := b.optional(uuid, migCall(callMIGName, i), ret); err != nil {
		return m, false, err
	} else if ok {
		m.Name = name
	}
	mem, ret := mh.GetMemoryInfo()
	if ok, err := b.optional(uuid, migCall(callMIGMemory, i), ret); err != nil {
		return m, false, err
	} else if ok {
		m.MemoryTotalBytes, m.MemoryUsedBytes, m.HasMemory = mem.Total, mem.Used, true
	}
	return m, true, nil
}

// notAvailable is NVML_VALUE_NOT_AVAILABLE as an unsigned 64-bit value:
// what some drivers (and any driver without permission) report as a
// process's used memory.
const notAvailable = ^uint64(0)

// usedMemory is the memory NVML lists a process with; known is false, and
// the figure 0, where the driver does not account for it (notAvailable).
func usedMemory(p nvml.ProcessInfo) (bytes uint64, known bool) {
	if p.UsedGpuMemory == notAvailable {
		return 0, false
	}
	return p.UsedGpuMemory, true
}

// addMemory merges one more list's figure for a process into it: a
// process listed with its memory in one list (compute, graphics, its MIG
// device's) and without it in another has the figure it was given.
func addMemory(p *gpu.Process, bytes uint64, known bool) {
	p.UsedMemoryBytes = max(p.UsedMemoryBytes, bytes)
	p.MemoryUnknown = p.MemoryUnknown && !known
}

// noInstance is what NVML puts in a process's GPU and compute instance IDs
// outside MIG (0xFFFFFFFF).
const noInstance = ^uint32(0)

// readProcesses merges the compute and graphics process lists (a process
// with both kinds of context is listed in both, each time with its whole
// memory, so it counts once with the larger figure) and adds each process's
// SM share over the time since the previous reading (applyShares). On a MIG-enabled GPU
// each process keeps the GPU and compute instance NVML lists it in, and
// the lists of the MIG devices (migProcs) add the processes the GPU's own
// list lacks and the instance of those it gives without one. Its error is
// a GPU that is gone; a list or the samples that cannot be read are left
// out. The graphics list is read only when it may hold something
// (graphicsDue); used is the GPU's used memory of the same reading.
//
// The per-process samples are one driver round trip, 1.5 ms of CPU on a
// real H200 in a Firecracker VM whether or not it finds a sample (measured
// call by call beside 48 processes; the size query before it costs 0.02
// ms). They are not asked for when the GPU's own reading (util) already
// says what they hold: both come from the driver's one buffer of
// utilization samples, stamped alike (the same timestamps on the H200),
// so when every GPU sample of the window read 0 no process ran a kernel
// and each reads 0, the process window moving on to where the GPU's
// ended; and when no GPU sample is newer than the previous reading no
// process sample is either, and each process keeps the share of the last
// window (a process new since reads 0). An idle GPU whose pods hold
// memory is the common state of a shared GPU between jobs, and of
// notebooks.
func (b *Backend) readProcesses(h nvml.Device, uuid string, used uint64, util utilReading, mig bool, migProcs []migProcesses) ([]gpu.Process, error) {
	var procs []gpu.Process
	add := func(list []nvml.ProcessInfo) {
		for _, p := range list {
			mem, known := usedMemory(p)
			if j := slices.IndexFunc(procs, func(q gpu.Process) bool { return q.PID == int(p.Pid) }); j >= 0 {
				addMemory(&procs[j], mem, known)
				continue
			}
			proc := gpu.Process{PID: int(p.Pid), UsedMemoryBytes: mem, MemoryUnknown: !known}
			if mig && p.GpuInstanceId != noInstance {
				proc.InMIG, proc.GPUInstanceID, proc.ComputeInstanceID = true, int(p.GpuInstanceId), -1
				if p.ComputeInstanceId != noInstance {
					proc.ComputeInstanceID = int(p.ComputeInstanceId)
				}
			}
			procs = append(procs, proc)
		}
	}
	compute, ret := h.GetComputeRunningProcesses()
	computeOK, err := b.optional(uuid, callCompute, ret)
	if err != nil {
		return nil, err
	}
	var graphics []nvml.ProcessInfo
	graphicsOK := false
	unexplained, known := unexplainedMemory(used, compute, computeOK)
	if now := b.now(); mig || b.graphicsDue(uuid, unexplained, known, now) {
		graphics, ret = h.GetGraphicsRunningProcesses()
		if graphicsOK, err = b.optional(uuid, callGraphics, ret); err != nil {
			return nil, err
		}
		b.updateWindow(uuid, func(w *sampleWindow) {
			w.graphicsRead, w.graphicsAny, w.unexplained = now, graphicsOK && len(graphics) > 0, unexplained
		})
	}
	// One allocation for the usual case, where the lists are all there is
	// (growing by append cost five at 48 processes).
	procs = make([]gpu.Process, 0, len(compute)+len(graphics))
	if computeOK {
		add(compute)
	}
	if graphicsOK {
		add(graphics)
	}
	for _, m := range migProcs {
		for _, p := range m.list {
			mem, known := usedMemory(p)
			j := slices.IndexFunc(procs, func(q gpu.Process) bool { return q.PID == int(p.Pid) })
			if j < 0 {
				procs = append(procs, gpu.Process{PID: int(p.Pid), MemoryUnknown: true})
				j = len(procs) - 1
			}
			addMemory(&procs[j], mem, known)
			if !procs[j].InMIG || procs[j].ComputeInstanceID < 0 {
				procs[j].InMIG, procs[j].GPUInstanceID, procs[j].ComputeInstanceID = true, m.gi, m.ci
			}
		}
	}
	if len(procs) == 0 {
		return nil, nil
	}
	slices.SortFunc(procs, func(a, b gpu.Process) int { return cmp.Compare(a.PID, b.PID) })

	switch {
	case util.idleThrough > 0:
		applyShares(procs, nil, 0)
		b.updateWindow(uuid, func(w *sampleWindow) {
			w.procSeen, w.shares = max(w.procSeen, util.idleThrough), nil
		})
		return procs, nil
	case util.noNewSample:
		shares := b.window(uuid).shares
		for j := range procs {
			procs[j].SMUtilization, procs[j].HasSMUtilization = shares[procs[j].PID], true
		}
		return procs, nil
	}
	since := b.window(uuid).procSeen
	samples, ret := h.GetProcessUtilization(since)
	// go-nvml returns ERROR_INSUFFICIENT_SIZE with no samples when NVML
	// sized the sample buffer at zero: no samples, as ERROR_NOT_FOUND says.
	if ret == nvml.ERROR_INSUFFICIENT_SIZE && len(samples) == 0 {
		ret = nvml.ERROR_NOT_FOUND
	}
	if ret == nvml.ERROR_NOT_FOUND {
		b.answered(uuid, callProcessUtil)
		samples = nil
	} else if ok, err := b.optional(uuid, callProcessUtil, ret); err != nil {
		return nil, err
	} else if !ok {
		return procs, nil
	}
	newest := applyShares(procs, samples, since)
	shares := make(map[int]float64, len(procs))
	for _, p := range procs {
		if p.SMUtilization > 0 {
			shares[p.PID] = p.SMUtilization
		}
	}
	b.updateWindow(uuid, func(w *sampleWindow) { w.procSeen, w.shares = max(w.procSeen, newest), shares })
	return procs, nil
}

// xidReader is one event set with its GPUs and the goroutine reading it.
type xidReader struct {
	set nvml.EventSet
	// gpus maps the UUID of each GPU registered on set to its index, and
	// byDevice each one's handle to the same: a GPU that fell off the bus
	// (Xid 79) no longer answers GetUUID, but its event still carries the
	// handle it was registered with. Written before the goroutine starts,
	// then only by it (remake).
	gpus       map[string]int
	byDevice   map[nvml.Device]xidGPU
	stop, done chan struct{}
}

// xidGPU is a GPU registered for Xid events.
type xidGPU struct {
	uuid  string
	index int
}

// registerXidEvents creates an event set and registers Xid critical errors
// on every GPU that supports them. It returns nil when none does.
func (b *Backend) registerXidEvents() *xidReader {
	r := &xidReader{stop: make(chan struct{}), done: make(chan struct{})}
	if !b.makeXidSet(r, b.log) {
		return nil
	}
	return r
}

// makeXidSet gives r a new event set with Xid critical errors registered
// on every GPU that supports them, and says whether any does (when none
// does, the set is freed and r left as it was). What it cannot register is
// logged to log.
func (b *Backend) makeXidSet(r *xidReader, log *slog.Logger) bool {
	set, ret := b.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		log.Warn("nvml: cannot create an event set; Xid errors will not be counted", "error", ret.Error())
		return false
	}
	n, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		log.Warn("nvml: cannot count GPUs; Xid errors will not be counted", "error", ret.Error())
		b.freeUnused(set)
		return false
	}
	gpus, byDevice := make(map[string]int), make(map[nvml.Device]xidGPU)
	for i := range n {
		log := log.With("gpu", i)
		h, ret := b.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			log.Warn("nvml: cannot get GPU handle; its Xid errors will not be counted", "error", ret.Error())
			continue
		}
		uuid, ret := h.GetUUID()
		if ret != nvml.SUCCESS {
			log.Warn("nvml: cannot read GPU UUID; its Xid errors will not be counted", "error", ret.Error())
			continue
		}
		log = log.With("uuid", uuid)
		supported, ret := h.GetSupportedEventTypes()
		if ret != nvml.SUCCESS {
			log.Warn("nvml: cannot read supported event types; Xid errors will not be counted", "error", ret.Error())
			continue
		}
		if supported&nvml.EventTypeXidCriticalError == 0 {
			log.Info("nvml: GPU does not report Xid errors")
			continue
		}
		if ret := h.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			log.Warn("nvml: cannot register Xid events; its Xid errors will not be counted", "error", ret.Error())
			continue
		}
		gpus[uuid] = i
		if usableKey(h) {
			byDevice[h] = xidGPU{uuid, i}
		}
	}
	if len(gpus) == 0 {
		b.freeUnused(set)
		return false
	}
	r.set, r.gpus, r.byDevice = set, gpus, byDevice
	return true
}

// usableKey says whether d can be a map key: go-nvml's handles can, a
// test's double might not.
func usableKey(d nvml.Device) bool {
	return d != nil && reflect.TypeOf(d).Comparable()
}

// freeUnused frees an event set no GPU reports on. A failure leaks one
// driver handle and changes nothing the exporter reports, so it is only
// logged.
func (b *Backend) freeUnused(set nvml.EventSet) {
	if ret := set.Free(); ret != nvml.SUCCESS {
		b.log.Warn("nvml: cannot free the unused event set", "error", ret.Error())
	}
}

// readXidEvents waits on r's event set until r is stopped. NVML's wait
// cannot be interrupted, so it waits at most xidTimeoutMs at a time and
// checks for the stop in between.
//
// A wait fails with ERROR_GPU_IS_LOST once a GPU of the set has fallen off
// the bus, and goes on failing so: the set is made again on the GPUs that
// still answer, so that the others' Xid errors go on being counted. A
// failure is logged once until a wait succeeds or times out again.
func (b *Backend) readXidEvents(r *xidReader) {
	defer close(r.done)
	timeoutMs := b.xidTimeoutMs
	logged := nvml.SUCCESS
	var remade time.Time
	for {
		select {
		case <-r.stop:
			return
		default:
		}
		e, ret := r.set.Wait(timeoutMs)
		switch ret {
		case nvml.SUCCESS:
			logged = nvml.SUCCESS
			b.countXid(r, e)
			continue
		case nvml.ERROR_TIMEOUT:
			logged = nvml.SUCCESS
			continue
		}
		if ret != logged {
			b.log.Warn("nvml: waiting for Xid events failed", "error", ret.Error())
			logged = ret
		}
		if ret == nvml.ERROR_GPU_IS_LOST && time.Since(remade) >= xidRemakeEvery {
			b.remakeXidSet(r)
			remade = time.Now()
		}
		// Some failures return at once; waiting before the next try
		// keeps a broken event set from spinning a CPU.
		select {
		case <-r.stop:
			return
		case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
		}
	}
}

// xidRemakeEvery is how often a set whose waits fail with
// ERROR_GPU_IS_LOST is made again: a GPU that fell off the bus stays lost
// until the node is fixed, and each try lists every GPU.
const xidRemakeEvery = 30 * time.Second

// remakeXidSet replaces r's event set by a new one on the GPUs that still
// answer; r's goroutine calls it, the only one waiting on the set, so the
// old set may be freed. When no GPU can be registered the old set stays.
func (b *Backend) remakeXidSet(r *xidReader) {
	old := r.set
	// Tried again every xidRemakeEvery while the GPU stays lost: what
	// cannot be registered was said when the wait first failed.
	if !b.makeXidSet(r, slog.New(slog.DiscardHandler)) {
		return
	}
	if ret := old.Free(); ret != nvml.SUCCESS {
		b.log.Warn("nvml: cannot free the event set of a lost GPU", "error", ret.Error())
	}
	b.log.Info("nvml: Xid events registered again after a GPU was lost", "gpus", len(r.gpus))
}

func (b *Backend) countXid(r *xidReader, e nvml.EventData) {
	if e.EventType != nvml.EventTypeXidCriticalError {
		return
	}
	if e.Device == nil {
		b.log.Warn("nvml: Xid event without a GPU, not counted", "xid", e.EventData)
		return
	}
	g, ok := xidGPU{}, false
	if usableKey(e.Device) {
		g, ok = r.byDevice[e.Device]
	}
	if !ok {
		uuid, ret := e.Device.GetUUID()
		if ret != nvml.SUCCESS {
			b.log.Warn("nvml: cannot read the UUID of the GPU of an Xid event, not counted", "xid", e.EventData, "error", ret.Error())
			return
		}
		index, registered := r.gpus[uuid]
		if !registered {
			b.log.Warn("nvml: Xid event from a GPU not registered, not counted", "uuid", uuid, "xid", e.EventData)
			return
		}
		g = xidGPU{uuid, index}
	}
	b.log.Warn("nvml: Xid error", "gpu", g.index, "uuid", g.uuid, "xid", e.EventData)
	b.xids.Add(g.uuid, g.index, e.EventData, 1)
}

// Xids returns the Xid events counted since New, sorted by UUID then Xid.
func (b *Backend) Xids() []gpu.XidCount {
	return b.xids.List()
}

// stopXids stops the Xid reader and frees its event set (NVML forbids
// freeing a set while a goroutine waits on it). Callers hold life's write
// lock.
func (b *Backend) stopXids() error {
	r := b.xid
	if r == nil {
		return nil
	}
	b.xid = nil
	close(r.stop)
	<-r.done
	if ret := r.set.Free(); ret != nvml.SUCCESS {
		return &callError{"free event set", ret}
	}
	return nil
}

// Close stops the Xid reader, frees the event set and shuts NVML down. It
// may be called more than once; later calls return the first result.
func (b *Backend) Close() error {
	b.once.Do(func() {
		b.life.Lock()
		defer b.life.Unlock()
		b.closed = true
		var errs []error
		if err := b.stopXids(); err != nil {
			errs = append(errs, err)
		}
		if b.ready {
			b.ready = false
			if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
				errs = append(errs, &callError{"shutdown", ret})
			}
		}
		if err := errors.Join(errs...); err != nil {
			b.closeErr = fmt.Errorf("nvml close: %w", err)
		}
	})
	return b.closeErr
}

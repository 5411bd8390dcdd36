package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/sim"
)

// node is the simulated GPU node behind the exported entry points, in plain
// Go (no C types) so that it can be tested without loading the library.
// Every reading goes through sim.Backend, the code the Go sim backend runs,
// so both backends see one simulated GPU.
type node struct {
	backend *sim.Backend
	path    string

	mu sync.Mutex
	// sets are the event sets created and not yet freed.
	sets map[*eventSet]bool
	// lastErr is why the file last failed to read: nvmlErrorString adds it
	// to the text of ERROR_DRIVER_NOT_LOADED.
	lastErr error
	// now gives sample timestamps; a field so tests can fix it.
	now func() time.Time
}

func newNode(path string) *node {
	return &node{backend: sim.New(path), path: path, sets: make(map[*eventSet]bool), now: time.Now}
}

// fileError is the file that cannot be read or parsed. Every call that
// reads the node returns ERROR_DRIVER_NOT_LOADED with it, the way a node
// without its driver answers.
type fileError struct{ err error }

func (e *fileError) Error() string { return e.err.Error() }

// gpuState is one GPU as read now: dev is nil when the sim file gives the
// GPU an error.
type gpuState struct {
	index int
	uuid  string
	dev   *gpu.Device
	err   error
}

// reading is the whole node as read now.
type reading struct {
	driverVersion string
	gpus          []gpuState
}

// read reads the sim file once.
func (n *node) read() (*reading, error) {
	s, err := n.backend.Snapshot(context.Background())
	if err != nil {
		n.mu.Lock()
		n.lastErr = err
		n.mu.Unlock()
		return nil, &fileError{err}
	}
	r := &reading{driverVersion: s.DriverVersion, gpus: make([]gpuState, len(s.Devices)+len(s.Failed))}
	for i := range s.Devices {
		d := &s.Devices[i]
		if d.Index >= len(r.gpus) {
			return nil, &fileError{fmt.Errorf("sim file %s: GPU index %d out of range", n.path, d.Index)}
		}
		r.gpus[d.Index] = gpuState{index: d.Index, uuid: d.UUID, dev: d}
	}
	for _, f := range s.Failed {
		if f.Index >= len(r.gpus) {
			return nil, &fileError{fmt.Errorf("sim file %s: GPU index %d out of range", n.path, f.Index)}
		}
		r.gpus[f.Index] = gpuState{index: f.Index, uuid: f.UUID, err: f.Err}
	}
	return r, nil
}

// gpu reads the GPU at index. A GPU the file gives an error fails with
// ERROR_GPU_IS_LOST when readable is true: identity (handle, UUID, index,
// minor number, PCI address) still answers, as the driver keeps it for a
// GPU that fell off the bus, and readings fail.
func (n *node) gpu(index int, readable bool) (*gpuState, nvml.Return) {
	r, err := n.read()
	if err != nil {
		return nil, nvml.ERROR_DRIVER_NOT_LOADED
	}
	if index < 0 || index >= len(r.gpus) {
		// The file lost this GPU since the handle was given out.
		return nil, nvml.ERROR_GPU_NOT_FOUND
	}
	g := &r.gpus[index]
	if readable && g.dev == nil {
		return nil, nvml.ERROR_GPU_IS_LOST
	}
	return g, nvml.SUCCESS
}

// percent turns a 0..1 ratio into NVML's whole percent.
func percent(ratio float64) uint32 {
	return uint32(math.Round(min(max(ratio, 0), 1) * 100))
}

// processSamples are the per-process utilization samples of d newer than
// since, stamped now (microseconds, as NVML). Processes the file gives no
// smUtilization have no sample.
func processSamples(d *gpu.Device, since uint64, now time.Time) []nvml.ProcessUtilizationSample {
	ts := uint64(now.UnixMicro())
	if ts <= since {
		return nil
	}
	var out []nvml.ProcessUtilizationSample
	for _, p := range d.Processes {
		if !p.HasSMUtilization {
			continue
		}
		out = append(out, nvml.ProcessUtilizationSample{Pid: uint32(p.PID), TimeStamp: ts, SmUtil: percent(p.SMUtilization)})
	}
	return out
}

// utilizationSamples are the samples of d of type typ newer than since,
// stamped now: one GPU_UTILIZATION sample of the file's utilization. A GPU
// whose utilization the file marks unsupported gives none
// (ERROR_NOT_SUPPORTED), nor does any other type; no sample newer than
// since is ERROR_NOT_FOUND.
func utilizationSamples(d *gpu.Device, typ nvml.SamplingType, since uint64, now time.Time) ([]nvml.Sample, nvml.Return) {
	if typ != nvml.GPU_UTILIZATION_SAMPLES || d.Missing.Has(gpu.ReadingUtilization) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	ts := uint64(now.UnixMicro())
	if ts <= since {
		return nil, nvml.ERROR_NOT_FOUND
	}
	s := nvml.Sample{TimeStamp: ts}
	binary.NativeEndian.PutUint32(s.SampleValue[:4], percent(d.Utilization))
	return []nvml.Sample{s}, nvml.SUCCESS
}

// eventSet is an NVML event set: the GPUs registered on it (by UUID, with
// their event mask) and, per GPU UUID and Xid, how many events it has
// delivered, so that each Xid event of the file is delivered once per set.
type eventSet struct {
	mu         sync.Mutex
	registered map[string]uint64
	delivered  map[xidKey]uint64
}

type xidKey struct {
	uuid string
	xid  uint64
}

// supportedEvents are the event types a simulated GPU reports: only Xid
// critical errors, since the sim file has no other events.
const supportedEvents = nvml.EventTypeXidCriticalError

func (n *node) createSet() *eventSet {
	s := &eventSet{registered: make(map[string]uint64), delivered: make(map[xidKey]uint64)}
	n.mu.Lock()
	n.sets[s] = true
	n.mu.Unlock()
	return s
}

func (n *node) freeSet(s *eventSet) nvml.Return {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.sets[s] {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	delete(n.sets, s)
	return nvml.SUCCESS
}

func (n *node) validSet(s *eventSet) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sets[s]
}

// register adds the GPU at index to the set. Registering a type the GPU
// does not report fails with ERROR_NOT_SUPPORTED, as NVML does.
func (n *node) register(s *eventSet, index int, types uint64) nvml.Return {
	if types&^supportedEvents != 0 {
		return nvml.ERROR_NOT_SUPPORTED
	}
	g, ret := n.gpu(index, false)
	if ret != nvml.SUCCESS {
		return ret
	}
	s.mu.Lock()
	s.registered[g.uuid] |= types
	s.mu.Unlock()
	return nvml.SUCCESS
}

// xidEvent is one Xid event to deliver.
type xidEvent struct {
	index int
	xid   uint64
}

// nextEvent returns the next Xid event of a registered GPU that the set has
// not delivered, and marks it delivered. The counts are the sim backend's:
// the number of entries per (GPU, Xid), never decreasing.
func (n *node) nextEvent(s *eventSet) (xidEvent, bool, nvml.Return) {
	if _, err := n.read(); err != nil {
		return xidEvent{}, false, nvml.ERROR_DRIVER_NOT_LOADED
	}
	counts := n.backend.Xids()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range counts {
		if s.registered[c.UUID]&nvml.EventTypeXidCriticalError == 0 {
			continue
		}
		k := xidKey{c.UUID, c.Xid}
		if s.delivered[k] < c.Count {
			s.delivered[k]++
			return xidEvent{index: c.Index, xid: c.Xid}, true, nvml.SUCCESS
		}
	}
	return xidEvent{}, false, nvml.SUCCESS
}

// eventPoll is how often a wait on an event set reads the file again.
const eventPoll = 50 * time.Millisecond

// wait returns the next undelivered event, reading the file every
// eventPoll until timeout; ERROR_TIMEOUT when none came.
func (n *node) wait(s *eventSet, timeout time.Duration) (xidEvent, nvml.Return) {
	deadline := n.now().Add(timeout)
	for {
		e, ok, ret := n.nextEvent(s)
		if ret != nvml.SUCCESS || ok {
			return e, ret
		}
		left := deadline.Sub(n.now())
		if left <= 0 {
			return xidEvent{}, nvml.ERROR_TIMEOUT
		}
		time.Sleep(min(left, eventPoll))
	}
}

// errorText is nvmlErrorString's text: NVML's wording of each return, with
// the reason the sim file could not be read added to the return that
// reports it.
func errorText(ret nvml.Return, fileErr error) string {
	text, ok := returnText[ret]
	if !ok {
		text = "Unknown Error"
	}
	if ret == nvml.ERROR_DRIVER_NOT_LOADED && fileErr != nil {
		text += " (gpuslice simulated NVML: " + fileErr.Error() + ")"
	}
	return text
}

// fileErr is why the file last failed to read, or nil.
func (n *node) fileErr() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lastErr
}

// returnText is the wording NVML gives each return.
var returnText = map[nvml.Return]string{
	nvml.SUCCESS:                       "Success",
	nvml.ERROR_UNINITIALIZED:           "Uninitialized",
	nvml.ERROR_INVALID_ARGUMENT:        "Invalid Argument",
	nvml.ERROR_NOT_SUPPORTED:           "Not Supported",
	nvml.ERROR_NO_PERMISSION:           "Insufficient Permissions",
	nvml.ERROR_ALREADY_INITIALIZED:     "Already Initialized",
	nvml.ERROR_NOT_FOUND:               "Not Found",
	nvml.ERROR_INSUFFICIENT_SIZE:       "Insufficient Size",
	nvml.ERROR_INSUFFICIENT_POWER:      "Insufficient External Power",
	nvml.ERROR_DRIVER_NOT_LOADED:       "Driver Not Loaded",
	nvml.ERROR_TIMEOUT:                 "Timeout",
	nvml.ERROR_IRQ_ISSUE:               "Interrupt request issue",
	nvml.ERROR_LIBRARY_NOT_FOUND:       "NVML Shared Library Not Found",
	nvml.ERROR_FUNCTION_NOT_FOUND:      "Function Not Found",
	nvml.ERROR_CORRUPTED_INFOROM:       "Corrupted infoROM",
	nvml.ERROR_GPU_IS_LOST:             "GPU is lost",
	nvml.ERROR_RESET_REQUIRED:          "GPU requires restart",
	nvml.ERROR_OPERATING_SYSTEM:        "The operating system has blocked the request.",
	nvml.ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
	nvml.ERROR_IN_USE:                  "In use by another client",
	nvml.ERROR_MEMORY:                  "Insufficient Memory",
	nvml.ERROR_NO_DATA:                 "No data",
	nvml.ERROR_GPU_NOT_FOUND:           "GPU not found",
	nvml.ERROR_UNKNOWN:                 "Unknown Error",
}

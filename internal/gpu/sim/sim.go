// Package sim is the GPU backend over a simulated node: a YAML file that
// describes GPUs, their processes and Xid events (DESIGN.md, "Simulated GPU
// node"). The file is read again at every Snapshot (and parsed again when
// its bytes changed), so a test or a demo changes what the programs see by
// rewriting it while they run. Writers should replace the file atomically
// (write a temporary file, then rename), as gputest.WriteSimFile does; a
// reader that catches a half-written file reports it as unreadable for that
// one reading.
//
// Beyond DESIGN.md the file accepts:
//   - driverVersion (top level): the reported driver version, default "sim";
//   - gpus[].memoryUsedBytes: default the sum of the GPU's processes'
//     usedMemoryBytes;
//   - gpus[].error: that GPU fails every reading with this text (it is put in
//     Snapshot.Failed), the way a GPU fails an NVML call;
//   - processes[].smUtilization may be left out: the process then has no SM
//     sample (gpu.Process.HasSMUtilization is false);
//   - gpus[].unsupported: readings the GPU does not give, any of
//     "utilization", "temperature", "power" (gpu.Device.Missing), as NVML
//     answers NOT_SUPPORTED for power on a card without a sensor or for
//     utilization on a MIG-enabled GPU;
//   - gpus[].mig: the GPU has MIG mode on, with these MIG devices (uuid,
//     name, gpuInstance, computeInstance, memoryTotalBytes and
//     memoryUsedBytes, which defaults to the sum of the processes in that
//     instance); its utilization is then unsupported, as NVML answers;
//   - processes[].gpuInstance and computeInstance, on a GPU with mig: the
//     MIG device the process runs in (both, naming one of gpus[].mig);
//   - processes[].mpsServer: true for a CUDA MPS server process
//     (gpu.Process.MPSServer); the GPU's other processes are then its MPS
//     clients. NVML lists the server among the compute processes, and
//     per-process utilization only for it, so a sim file for an MPS GPU
//     gives smUtilization to the server alone.
//
// Xid events: each xidEvents entry is one event. The count for a (GPU UUID,
// Xid) pair is the number of entries with that Xid listed for that GPU, and
// it never decreases: the backend keeps the largest count it has read, so
// deleting entries (or the GPU) from the file does not lower a counter, and
// adding entries raises it. Counts are updated by every Snapshot and Xids
// call.
package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"gopkg.in/yaml.v3"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/internal/xidcount"
)

// DefaultDriverVersion is reported when the file sets no driverVersion.
const DefaultDriverVersion = "sim"

// File is the simulated node as written in YAML. Optional numbers are
// pointers so that "absent" and "0" differ. Marshal it with gopkg.in/yaml.v3
// to write a sim file.
type File struct {
	DriverVersion string `yaml:"driverVersion,omitempty"`
	GPUs          []GPU  `yaml:"gpus"`
}

// GPU is one entry of File.GPUs; its index in the list is the GPU index.
type GPU struct {
	UUID             string `yaml:"uuid"`
	Name             string `yaml:"name,omitempty"`
	MemoryTotalBytes uint64 `yaml:"memoryTotalBytes"`
	// MemoryUsedBytes, when nil, is the sum of the processes' memory.
	MemoryUsedBytes    *uint64    `yaml:"memoryUsedBytes,omitempty"`
	Utilization        float64    `yaml:"utilization"`
	TemperatureCelsius float64    `yaml:"temperatureCelsius"`
	PowerWatts         float64    `yaml:"powerWatts"`
	XidEvents          []XidEvent `yaml:"xidEvents,omitempty"`
	// Unsupported names readings the GPU does not give: "utilization",
	// "temperature", "power". Their values above are ignored.
	Unsupported []string `yaml:"unsupported,omitempty"`
	// Error, when set, makes this GPU fail every reading with this text.
	Error     string    `yaml:"error,omitempty"`
	Processes []Process `yaml:"processes,omitempty"`
	// MIG, when set, turns MIG mode on with these MIG devices.
	MIG []MIGDevice `yaml:"mig,omitempty"`
}

// MIGDevice is one MIG device of a simulated MIG-enabled GPU.
type MIGDevice struct {
	UUID             string `yaml:"uuid"`
	Name             string `yaml:"name,omitempty"`
	GPUInstance      int    `yaml:"gpuInstance"`
	ComputeInstance  int    `yaml:"computeInstance"`
	MemoryTotalBytes uint64 `yaml:"memoryTotalBytes"`
	// MemoryUsedBytes, when nil, is the sum of its processes' memory.
	MemoryUsedBytes *uint64 `yaml:"memoryUsedBytes,omitempty"`
}

// XidEvent is one Xid event on a GPU.
type XidEvent struct {
	Xid uint64 `yaml:"xid"`
}

// Process is one process on a simulated GPU.
type Process struct {
	PID             int    `yaml:"pid"`
	UsedMemoryBytes uint64 `yaml:"usedMemoryBytes"`
	// SMUtilization, when nil, means the process has no SM sample.
	SMUtilization *float64 `yaml:"smUtilization,omitempty"`
	// GPUInstance and ComputeInstance place the process in a MIG device
	// of its GPU; nil outside MIG.
	GPUInstance     *int `yaml:"gpuInstance,omitempty"`
	ComputeInstance *int `yaml:"computeInstance,omitempty"`
	MPSServer       bool `yaml:"mpsServer,omitempty"`
}

// process is p as a reading gives it.
func (p Process) process() gpu.Process {
	q := gpu.Process{PID: p.PID, UsedMemoryBytes: p.UsedMemoryBytes, MPSServer: p.MPSServer}
	if p.SMUtilization != nil {
		q.SMUtilization, q.HasSMUtilization = *p.SMUtilization, true
	}
	if p.GPUInstance != nil {
		q.InMIG, q.GPUInstanceID, q.ComputeInstanceID = true, *p.GPUInstance, *p.ComputeInstance
	}
	return q
}

// Backend reads the simulated node from its file. It is safe for concurrent
// use.
type Backend struct {
	path string

	xids xidcount.Counts

	// mu guards the file as last read and parsed: a file read again with
	// the same bytes is not parsed again (YAML parsing is most of the cost
	// of a reading at 8 GPUs × 64 processes).
	mu       sync.Mutex
	lastData []byte
	lastFile *File
}

var (
	_ gpu.Backend       = (*Backend)(nil)
	_ gpu.ProcessLister = (*Backend)(nil)
)

// New returns a backend over the file at path. It does not read the file:
// the first Snapshot does, and reports a missing or invalid file then, so a
// program may start before the file is written.
func New(path string) *Backend {
	return &Backend{path: path}
}

// Snapshot reads the file and returns its GPUs. A missing file gives an
// error wrapping both gpu.ErrUnavailable and fs.ErrNotExist; a file that
// does not parse or fails validation gives an error wrapping
// gpu.ErrUnavailable that names the file, the line and the field.
func (b *Backend) Snapshot(ctx context.Context) (gpu.Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return gpu.Snapshot{}, err
	}
	f, err := b.read()
	if err != nil {
		return gpu.Snapshot{}, err
	}
	b.countXids(f)
	return f.snapshot(), nil
}

// Xids reads the file to bring the counts up to date and returns them,
// sorted by UUID then Xid. When the file cannot be read the counts from the
// last good reading are returned.
func (b *Backend) Xids() []gpu.XidCount {
	if f, err := b.read(); err == nil {
		b.countXids(f)
	}
	return b.xids.List()
}

// ComputeProcesses reads the file and returns GPU uuid's processes.
func (b *Backend) ComputeProcesses(ctx context.Context, uuid string) ([]gpu.Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, err := b.read()
	if err != nil {
		return nil, err
	}
	for _, g := range f.GPUs {
		if g.UUID != uuid {
			continue
		}
		if g.Error != "" {
			return nil, fmt.Errorf("sim file %s: GPU %s: %s", b.path, uuid, g.Error)
		}
		procs := make([]gpu.Process, len(g.Processes))
		for j, p := range g.Processes {
			procs[j] = p.process()
		}
		return procs, nil
	}
	return nil, fmt.Errorf("sim file %s: no GPU %s", b.path, uuid)
}

// Close does nothing: the backend holds nothing open between readings.
func (b *Backend) Close() error { return nil }

func (b *Backend) read() (*File, error) {
	data, err := os.ReadFile(b.path)
	if err != nil {
		// err is an *fs.PathError: it names the file and wraps
		// fs.ErrNotExist when the file is missing.
		return nil, fmt.Errorf("%w: sim file: %w", gpu.ErrUnavailable, err)
	}
	b.mu.Lock()
	if b.lastFile != nil && bytes.Equal(data, b.lastData) {
		f := b.lastFile
		b.mu.Unlock()
		return f, nil
	}
	b.mu.Unlock()
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%w: sim file %s: %w", gpu.ErrUnavailable, b.path, err)
	}
	b.mu.Lock()
	b.lastData, b.lastFile = data, f
	b.mu.Unlock()
	return f, nil
}

func (b *Backend) countXids(f *File) {
	for i, g := range f.GPUs {
		seen := make(map[uint64]uint64, len(g.XidEvents))
		for _, e := range g.XidEvents {
			seen[e.Xid]++
		}
		for xid, n := range seen {
			b.xids.Raise(g.UUID, i, xid, n)
		}
	}
}

func (f *File) snapshot() gpu.Snapshot {
	s := gpu.Snapshot{DriverVersion: f.DriverVersion, Devices: make([]gpu.Device, 0, len(f.GPUs))}
	if s.DriverVersion == "" {
		s.DriverVersion = DefaultDriverVersion
	}
	for i, g := range f.GPUs {
		if g.Error != "" {
			s.Failed = append(s.Failed, gpu.DeviceError{Index: i, UUID: g.UUID, Err: errors.New(g.Error)})
			continue
		}
		d := gpu.Device{
			Index:              i,
			UUID:               g.UUID,
			Name:               g.Name,
			MemoryTotalBytes:   g.MemoryTotalBytes,
			Utilization:        g.Utilization,
			TemperatureCelsius: g.TemperatureCelsius,
			PowerWatts:         g.PowerWatts,
		}
		for _, name := range g.Unsupported {
			r, _ := gpu.ReadingNamed(name) // validated when read
			d.Missing |= r
		}
		if d.Missing.Has(gpu.ReadingUtilization) {
			d.Utilization = 0
		}
		if d.Missing.Has(gpu.ReadingTemperature) {
			d.TemperatureCelsius = 0
		}
		if d.Missing.Has(gpu.ReadingPower) {
			d.PowerWatts = 0
		}
		var used uint64
		if len(g.Processes) > 0 {
			d.Processes = make([]gpu.Process, len(g.Processes))
		}
		for j, p := range g.Processes {
			d.Processes[j] = p.process()
			used += p.UsedMemoryBytes
		}
		d.MemoryUsedBytes = used
		if g.MemoryUsedBytes != nil {
			d.MemoryUsedBytes = *g.MemoryUsedBytes
		}
		if len(g.MIG) > 0 {
			d.MIGEnabled = true
			d.Missing |= gpu.ReadingUtilization
			d.Utilization = 0
			d.MIGDevices = make([]gpu.MIGDevice, len(g.MIG))
			for k, m := range g.MIG {
				d.MIGDevices[k] = gpu.MIGDevice{Index: k, UUID: m.UUID, Name: m.Name,
					GPUInstanceID: m.GPUInstance, ComputeInstanceID: m.ComputeInstance,
					MemoryTotalBytes: m.MemoryTotalBytes, HasMemory: true}
				if m.MemoryUsedBytes != nil {
					d.MIGDevices[k].MemoryUsedBytes = *m.MemoryUsedBytes
					continue
				}
				for _, p := range d.Processes {
					if p.InMIG && p.GPUInstanceID == m.GPUInstance && p.ComputeInstanceID == m.ComputeInstance {
						d.MIGDevices[k].MemoryUsedBytes += p.UsedMemoryBytes
					}
				}
			}
		}
		s.Devices = append(s.Devices, d)
	}
	return s
}

// Parse decodes and validates the contents of a sim file. Unknown fields
// are errors, so a misspelt field does not silently read as zero. Errors
// name the line and field but not the file; Snapshot adds the file.
func Parse(data []byte) (*File, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("file is empty")
		}
		return nil, err
	}
	if err := f.validate(); err != nil {
		// Only a file that fails validation pays for a second parse, to
		// say on which line the bad entry is.
		return nil, withLine(data, err)
	}
	return &f, nil
}

// fieldError is a validation error about gpus[GPU] (and its List[Proc],
// "processes" unless List says otherwise, when Proc >= 0).
type fieldError struct {
	GPU, Proc int
	List      string
	Field     string
	Msg       string
	line      int
}

func (e *fieldError) list() string {
	if e.List == "" {
		return "processes"
	}
	return e.List
}

func (e *fieldError) Error() string {
	path := fmt.Sprintf("gpus[%d]", e.GPU)
	if e.Proc >= 0 {
		path += fmt.Sprintf(".%s[%d]", e.list(), e.Proc)
	}
	if e.Field != "" {
		path += "." + e.Field
	}
	if e.line > 0 {
		return fmt.Sprintf("line %d: %s: %s", e.line, path, e.Msg)
	}
	return path + ": " + e.Msg
}

func (f *File) validate() error {
	uuids := make(map[string]int, len(f.GPUs))
	for i, g := range f.GPUs {
		gerr := func(field, format string, args ...any) error {
			return &fieldError{GPU: i, Proc: -1, Field: field, Msg: fmt.Sprintf(format, args...)}
		}
		if g.UUID == "" {
			return gerr("uuid", "must not be empty")
		}
		if j, dup := uuids[g.UUID]; dup {
			return gerr("uuid", "%q is also the uuid of gpus[%d]", g.UUID, j)
		}
		uuids[g.UUID] = i
		if !(g.Utilization >= 0 && g.Utilization <= 1) {
			return gerr("utilization", "%v is outside 0..1", g.Utilization)
		}
		for _, name := range g.Unsupported {
			if _, ok := gpu.ReadingNamed(name); !ok {
				return gerr("unsupported", "%q is not a reading (want utilization, temperature or power)", name)
			}
		}
		instances, err := validateMIG(i, g.MIG)
		if err != nil {
			return err
		}
		pids := make(map[int]int, len(g.Processes))
		for j, p := range g.Processes {
			perr := func(field, format string, args ...any) error {
				return &fieldError{GPU: i, Proc: j, Field: field, Msg: fmt.Sprintf(format, args...)}
			}
			if p.PID <= 0 {
				return perr("pid", "must be a positive number, not %d", p.PID)
			}
			if k, dup := pids[p.PID]; dup {
				return perr("pid", "%d is also the pid of processes[%d] on this GPU", p.PID, k)
			}
			pids[p.PID] = j
			if p.SMUtilization != nil && !(*p.SMUtilization >= 0 && *p.SMUtilization <= 1) {
				return perr("smUtilization", "%v is outside 0..1", *p.SMUtilization)
			}
			switch {
			case p.GPUInstance == nil && p.ComputeInstance == nil:
			case len(g.MIG) == 0:
				return perr("gpuInstance", "the GPU has no mig devices")
			case p.GPUInstance == nil || p.ComputeInstance == nil:
				return perr("gpuInstance", "gpuInstance and computeInstance go together")
			case !instances[[2]int{*p.GPUInstance, *p.ComputeInstance}]:
				return perr("gpuInstance", "no mig device of this GPU has gpuInstance %d and computeInstance %d", *p.GPUInstance, *p.ComputeInstance)
			}
		}
	}
	return nil
}

// validateMIG checks the MIG devices of gpus[i] and returns their
// (gpuInstance, computeInstance) pairs.
func validateMIG(i int, devices []MIGDevice) (map[[2]int]bool, error) {
	instances := make(map[[2]int]bool, len(devices))
	uuids := make(map[string]int, len(devices))
	for k, m := range devices {
		merr := func(field, format string, args ...any) error {
			return &fieldError{GPU: i, Proc: k, List: "mig", Field: field, Msg: fmt.Sprintf(format, args...)}
		}
		if !strings.HasPrefix(m.UUID, "MIG-") {
			return nil, merr("uuid", "%q is not a MIG device UUID (MIG-<uuid>, or MIG-GPU-<uuid>/<gi>/<ci> on old drivers)", m.UUID)
		}
		if j, dup := uuids[m.UUID]; dup {
			return nil, merr("uuid", "%q is also the uuid of mig[%d]", m.UUID, j)
		}
		uuids[m.UUID] = k
		if m.GPUInstance < 0 || m.ComputeInstance < 0 {
			return nil, merr("gpuInstance", "instance IDs must not be negative")
		}
		key := [2]int{m.GPUInstance, m.ComputeInstance}
		if instances[key] {
			return nil, merr("gpuInstance", "another mig device has gpuInstance %d and computeInstance %d", m.GPUInstance, m.ComputeInstance)
		}
		instances[key] = true
	}
	return instances, nil
}

// withLine adds the line of the entry a fieldError is about.
func withLine(data []byte, err error) error {
	var fe *fieldError
	if !errors.As(err, &fe) {
		return err
	}
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil || len(root.Content) == 0 {
		return err
	}
	n := lookup(root.Content[0], "gpus")
	if n == nil || fe.GPU >= len(n.Content) {
		return err
	}
	n = n.Content[fe.GPU]
	if fe.Proc >= 0 {
		if n = lookup(n, fe.list()); n == nil || fe.Proc >= len(n.Content) {
			return err
		}
		n = n.Content[fe.Proc]
	}
	fe.line = n.Line
	if v := lookup(n, fe.Field); v != nil {
		fe.line = v.Line
	}
	return fe
}

// lookup returns the value of key in a YAML mapping node, or nil.
func lookup(m *yaml.Node, key string) *yaml.Node {
	if m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// Command libnvml is libnvidia-ml.so.1 made from gpuslice's simulated GPU
// node: a C shared library that exports the NVML entry points gpuslice's
// nvml backend (through go-nvml) and NVIDIA's nvidia-device-plugin v0.19.0
// (through go-nvml and go-nvlib) call, and answers them from the sim file
// (DESIGN.md, "Simulated GPU node"). With it both programs run their real
// dlopen path on a machine without a GPU.
//
// Build and use (hack/libnvml.sh builds it into .cache/lib):
//
//	go build -buildmode=c-shared -o DIR/libnvidia-ml.so.1 ./test/libnvml
//	GPUSLICE_SIM_FILE=gpus.yaml LD_LIBRARY_PATH=DIR gpuslice-exporter --gpu.backend=nvml
//
// The sim file is GPUSLICE_SIM_FILE, default /run/gpuslice-sim/gpus.yaml,
// read when NVML is initialized and again at every call, through
// internal/gpu/sim, the code of the Go sim backend: one truth for both.
// What a call answers:
//   - a missing or unparseable file fails nvmlInit (and later calls) with
//     NVML_ERROR_DRIVER_NOT_LOADED, and nvmlErrorString of that return says
//     which file and why;
//   - a GPU with `error:` keeps its identity (handle by index or UUID, UUID,
//     index, minor number, PCI info, event registration) and fails every
//     reading with NVML_ERROR_GPU_IS_LOST, like a GPU fallen off the bus;
//   - processes are compute processes with the PIDs of the file; on a GPU
//     with an mpsServer process the MPS list holds the others (its
//     clients), else it is empty; the graphics list is empty; processes
//     without smUtilization have no per-process utilization sample;
//   - utilization and SM samples are whole percent, temperature whole
//     degrees, power whole milliwatts, as NVML gives them; per read, one
//     sample per process with an smUtilization and one GPU_UTILIZATION
//     sample (nvmlDeviceGetSamples), stamped at the read, as a real driver
//     read every scrape gives them;
//   - each Xid event of the file is delivered once per event set
//     (XidCriticalError is the only event type supported);
//   - MIG is not supported (as on an RTX A6000; a sim file's mig entries
//     and processes' instances are ignored), nor NVLink, P2P, fabric,
//     NUMA or vGPU queries; compute capability 8.6, Ampere architecture.
//
// A Go c-shared library carries its own Go runtime: loaded into a Go
// program there are two runtimes in one process. test/integration runs
// the exporter over it under load to keep that honest.
package main

/*
#include <stdlib.h>
#include <string.h>
*/
import "C"

import (
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuslice/gpuslice/internal/gpu"
)

// DefaultSimFile is the sim file read when GPUSLICE_SIM_FILE is not set.
const DefaultSimFile = "/run/gpuslice-sim/gpus.yaml"

var envName = C.CString("GPUSLICE_SIM_FILE")

// The simulated versions. The CUDA version is the one NVIDIA's driver 570
// series reports; callers only compare it against minimums.
const (
	cudaDriverVersion = 12080
	nvmlVersion       = "12.570.0"
	computeMajor      = 8
	computeMinor      = 6
)

func main() {}

// lib is the library's state. A C library has no handle to hang it on, so
// it is one value for the process, as NVML's is.
var lib struct {
	mu       sync.Mutex
	refcount int
	node     *node
	// handles are the device handles given out, one per GPU index, in C
	// memory so that neither Go runtime's collector looks into them; never
	// freed, so a stale handle stays a valid pointer.
	handles []unsafe.Pointer
	index   map[unsafe.Pointer]int
	sets    map[unsafe.Pointer]*eventSet
	// errText caches nvmlErrorString's C strings: callers keep the pointer.
	errText map[string]*C.char
}

func ret(r nvml.Return) C.int { return C.int(r) }

// current returns the node when NVML is initialized.
func current() (*node, nvml.Return) {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if lib.refcount == 0 {
		return nil, nvml.ERROR_UNINITIALIZED
	}
	return lib.node, nvml.SUCCESS
}

// device resolves a device handle and reads its GPU (see node.gpu).
func device(h unsafe.Pointer, readable bool) (*node, *gpuState, nvml.Return) {
	n, r := current()
	if r != nvml.SUCCESS {
		return nil, nil, r
	}
	lib.mu.Lock()
	i, ok := lib.index[h]
	lib.mu.Unlock()
	if !ok {
		return nil, nil, nvml.ERROR_INVALID_ARGUMENT
	}
	g, r := n.gpu(i, readable)
	return n, g, r
}

// handle returns the device handle of a GPU index, making it the first time.
func handle(i int) unsafe.Pointer {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	for len(lib.handles) <= i {
		h := C.malloc(8)
		lib.index[h] = len(lib.handles)
		lib.handles = append(lib.handles, h)
	}
	return lib.handles[i]
}

// putString copies s into a caller's buffer of length bytes, NUL included.
func putString(dst *C.char, length C.uint, s string) nvml.Return {
	if dst == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if uint64(len(s))+1 > uint64(length) {
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(dst)), len(s)+1)
	copy(b, s)
	b[len(s)] = 0
	return nvml.SUCCESS
}

//export nvmlInit_v2
func nvmlInit_v2() C.int { return nvmlInitWithFlags(0) }

//export nvmlInit
func nvmlInit() C.int { return nvmlInitWithFlags(0) }

//export nvmlInitWithFlags
func nvmlInitWithFlags(flags C.uint) C.int {
	// libc's environment, not os.Getenv: this runtime copied the
	// environment when the library was loaded, and a Go host sets its
	// variables (os.Setenv) in libc's.
	path := ""
	if v := C.getenv(envName); v != nil {
		path = C.GoString(v)
	}
	if path == "" {
		path = DefaultSimFile
	}
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if lib.index == nil {
		lib.index = make(map[unsafe.Pointer]int)
		lib.sets = make(map[unsafe.Pointer]*eventSet)
		lib.errText = make(map[string]*C.char)
	}
	if lib.refcount > 0 {
		lib.refcount++
		return ret(nvml.SUCCESS)
	}
	n := newNode(path)
	if lib.node != nil && lib.node.path == path {
		// Keep the Xid counts of an earlier init, as the driver keeps
		// its events across NVML sessions.
		n = lib.node
	}
	if _, err := n.read(); err != nil {
		lib.node = n
		return ret(nvml.ERROR_DRIVER_NOT_LOADED)
	}
	lib.node = n
	lib.refcount = 1
	return ret(nvml.SUCCESS)
}

//export nvmlShutdown
func nvmlShutdown() C.int {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if lib.refcount == 0 {
		return ret(nvml.ERROR_UNINITIALIZED)
	}
	lib.refcount--
	return ret(nvml.SUCCESS)
}

//export nvmlErrorString
func nvmlErrorString(result C.int) *C.char {
	lib.mu.Lock()
	n := lib.node
	lib.mu.Unlock()
	var fileErr error
	if n != nil {
		fileErr = n.fileErr()
	}
	text := errorText(nvml.Return(result), fileErr)
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if lib.errText == nil {
		lib.errText = make(map[string]*C.char)
	}
	cs, ok := lib.errText[text]
	if !ok {
		cs = C.CString(text)
		lib.errText[text] = cs
	}
	return cs
}

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(version *C.char, length C.uint) C.int {
	n, r := current()
	if r != nvml.SUCCESS {
		return ret(r)
	}
	rd, err := n.read()
	if err != nil {
		return ret(nvml.ERROR_DRIVER_NOT_LOADED)
	}
	return ret(putString(version, length, rd.driverVersion))
}

//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(version *C.char, length C.uint) C.int {
	if _, r := current(); r != nvml.SUCCESS {
		return ret(r)
	}
	return ret(putString(version, length, nvmlVersion))
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(v *C.int) C.int {
	if v == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	if _, r := current(); r != nvml.SUCCESS {
		return ret(r)
	}
	*v = cudaDriverVersion
	return ret(nvml.SUCCESS)
}

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(v *C.int) C.int { return nvmlSystemGetCudaDriverVersion(v) }

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(count *C.uint) C.int {
	if count == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	n, r := current()
	if r != nvml.SUCCESS {
		return ret(r)
	}
	rd, err := n.read()
	if err != nil {
		return ret(nvml.ERROR_DRIVER_NOT_LOADED)
	}
	*count = C.uint(len(rd.gpus))
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetCount
func nvmlDeviceGetCount(count *C.uint) C.int { return nvmlDeviceGetCount_v2(count) }

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(index C.uint, dev *unsafe.Pointer) C.int {
	if dev == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	n, r := current()
	if r != nvml.SUCCESS {
		return ret(r)
	}
	rd, err := n.read()
	if err != nil {
		return ret(nvml.ERROR_DRIVER_NOT_LOADED)
	}
	if int(index) >= len(rd.gpus) {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	putHandle(dev, handle(int(index)))
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetHandleByIndex
func nvmlDeviceGetHandleByIndex(index C.uint, dev *unsafe.Pointer) C.int {
	return nvmlDeviceGetHandleByIndex_v2(index, dev)
}

// putHandle writes a handle into the caller's memory as a plain word, so
// that this runtime's write barrier never sees the caller's heap.
func putHandle(dst *unsafe.Pointer, h unsafe.Pointer) {
	*(*uintptr)(unsafe.Pointer(dst)) = uintptr(h)
}

//export nvmlDeviceGetHandleByUUID
func nvmlDeviceGetHandleByUUID(uuid *C.char, dev *unsafe.Pointer) C.int {
	if uuid == nil || dev == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	n, r := current()
	if r != nvml.SUCCESS {
		return ret(r)
	}
	rd, err := n.read()
	if err != nil {
		return ret(nvml.ERROR_DRIVER_NOT_LOADED)
	}
	want := C.GoString(uuid)
	for _, g := range rd.gpus {
		if g.uuid == want {
			putHandle(dev, handle(g.index))
			return ret(nvml.SUCCESS)
		}
	}
	return ret(nvml.ERROR_NOT_FOUND)
}

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(dev unsafe.Pointer, uuid *C.char, length C.uint) C.int {
	_, g, r := device(dev, false)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	return ret(putString(uuid, length, g.uuid))
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(dev unsafe.Pointer, name *C.char, length C.uint) C.int {
	_, g, r := device(dev, true)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	return ret(putString(name, length, g.dev.Name))
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(dev unsafe.Pointer, index *C.uint) C.int {
	_, g, r := device(dev, false)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if index == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	*index = C.uint(g.index)
	return ret(nvml.SUCCESS)
}

// The minor number is the GPU index: /dev/nvidia<index>.
//
//export nvmlDeviceGetMinorNumber
func nvmlDeviceGetMinorNumber(dev unsafe.Pointer, minor *C.uint) C.int {
	return nvmlDeviceGetIndex(dev, minor)
}

// pciInfo is the simulated PCI address: bus index+1 of domain 0, device 0,
// with NVIDIA's vendor ID.
func pciInfo(index int) nvml.PciInfo {
	var p nvml.PciInfo
	p.Bus = uint32(index + 1)
	p.PciDeviceId = 0x10de
	legacy := []byte(fmtBusID(4, p.Bus))
	full := []byte(fmtBusID(8, p.Bus))
	for i := 0; i < len(legacy) && i < len(p.BusIdLegacy)-1; i++ {
		p.BusIdLegacy[i] = int8(legacy[i])
	}
	for i := 0; i < len(full) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(full[i])
	}
	return p
}

// fmtBusID writes a PCI bus ID with a domain of domainDigits hex digits:
// 0000:01:00.0 (legacy) or 00000000:01:00.0.
func fmtBusID(domainDigits int, bus uint32) string {
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, 16)
	for range domainDigits {
		b = append(b, '0')
	}
	b = append(b, ':', hex[bus>>4&0xf], hex[bus&0xf])
	return string(append(b, ":00.0"...))
}

//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(dev unsafe.Pointer, pci unsafe.Pointer) C.int {
	_, g, r := device(dev, false)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if pci == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	*(*nvml.PciInfo)(pci) = pciInfo(g.index)
	return ret(nvml.SUCCESS)
}

// nvmlPciInfo_t has the same layout in versions 2 and 3.
//
//export nvmlDeviceGetPciInfo_v2
func nvmlDeviceGetPciInfo_v2(dev unsafe.Pointer, pci unsafe.Pointer) C.int {
	return nvmlDeviceGetPciInfo_v3(dev, pci)
}

//export nvmlDeviceGetMemoryInfo
func nvmlDeviceGetMemoryInfo(dev unsafe.Pointer, mem unsafe.Pointer) C.int {
	_, g, r := device(dev, true)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if mem == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	d := g.dev
	*(*nvml.Memory)(mem) = nvml.Memory{Total: d.MemoryTotalBytes, Used: d.MemoryUsedBytes, Free: d.MemoryTotalBytes - min(d.MemoryUsedBytes, d.MemoryTotalBytes)}
	return ret(nvml.SUCCESS)
}

// memoryV2Version is NVML's version word of nvmlMemory_v2_t: its size and
// version 2 in the top byte.
const memoryV2Version = uint32(unsafe.Sizeof(nvml.Memory_v2{})) | 2<<24

//export nvmlDeviceGetMemoryInfo_v2
func nvmlDeviceGetMemoryInfo_v2(dev unsafe.Pointer, mem unsafe.Pointer) C.int {
	_, g, r := device(dev, true)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if mem == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	m := (*nvml.Memory_v2)(mem)
	if m.Version != memoryV2Version {
		return ret(nvml.ERROR_ARGUMENT_VERSION_MISMATCH)
	}
	d := g.dev
	*m = nvml.Memory_v2{Version: m.Version, Total: d.MemoryTotalBytes, Used: d.MemoryUsedBytes, Free: d.MemoryTotalBytes - min(d.MemoryUsedBytes, d.MemoryTotalBytes)}
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetUtilizationRates
func nvmlDeviceGetUtilizationRates(dev unsafe.Pointer, util unsafe.Pointer) C.int {
	_, g, r := device(dev, true)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if util == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	if g.dev.Missing.Has(gpu.ReadingUtilization) {
		return ret(nvml.ERROR_NOT_SUPPORTED) // the file's unsupported: list
	}
	*(*nvml.Utilization)(util) = nvml.Utilization{Gpu: percent(g.dev.Utilization)}
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetTemperature
func nvmlDeviceGetTemperature(dev unsafe.Pointer, sensor C.int, temp *C.uint) C.int {
	_, g, r := device(dev, true)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if temp == nil || nvml.TemperatureSensors(sensor) != nvml.TEMPERATURE_GPU {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	if g.dev.Missing.Has(gpu.ReadingTemperature) {
		return ret(nvml.ERROR_NOT_SUPPORTED)
	}
	*temp = C.uint(max(0, roundInt(g.dev.TemperatureCelsius)))
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetPowerUsage
func nvmlDeviceGetPowerUsage(dev unsafe.Pointer, mw *C.uint) C.int {
	_, g, r := device(dev, true)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if mw == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	if g.dev.Missing.Has(gpu.ReadingPower) {
		return ret(nvml.ERROR_NOT_SUPPORTED) // a card without a power sensor
	}
	*mw = C.uint(max(0, roundInt(g.dev.PowerWatts*1000)))
	return ret(nvml.SUCCESS)
}

func roundInt(f float64) int64 {
	if f < 0 {
		return int64(f - 0.5)
	}
	return int64(f + 0.5)
}

// Which list a running-process call asks for.
type processList int

const (
	computeList processList = iota
	graphicsList
	mpsList
)

// processes answers the running-process calls: the compute list holds the
// file's processes (an MPS server and its clients among them, as NVML lists
// them), the MPS list the clients of a GPU with an mpsServer process, the
// graphics list nothing. Pid and used memory lead every version, and
// versions 2 and 3 add the MIG instance IDs, invalid off MIG.
func processes(dev unsafe.Pointer, count *C.uint, infos unsafe.Pointer, list processList, v1 bool) C.int {
	_, g, r := device(dev, true)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if count == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	var listed []gpu.Process
	switch list {
	case computeList:
		listed = g.dev.Processes
	case mpsList:
		if slices.ContainsFunc(g.dev.Processes, func(p gpu.Process) bool { return p.MPSServer }) {
			for _, p := range g.dev.Processes {
				if !p.MPSServer {
					listed = append(listed, p)
				}
			}
		}
	}
	procs := len(listed)
	if int(*count) < procs || procs > 0 && infos == nil {
		*count = C.uint(procs)
		return ret(nvml.ERROR_INSUFFICIENT_SIZE)
	}
	*count = C.uint(procs)
	for i, p := range listed {
		if v1 {
			unsafe.Slice((*nvml.ProcessInfo_v1)(infos), procs)[i] = nvml.ProcessInfo_v1{Pid: uint32(p.PID), UsedGpuMemory: p.UsedMemoryBytes}
			continue
		}
		unsafe.Slice((*nvml.ProcessInfo)(infos), procs)[i] = nvml.ProcessInfo{Pid: uint32(p.PID), UsedGpuMemory: p.UsedMemoryBytes, GpuInstanceId: invalidID, ComputeInstanceId: invalidID}
	}
	return ret(nvml.SUCCESS)
}

// invalidID is the GPU and compute instance ID of a process off MIG.
const invalidID = 0xFFFFFFFF

//export nvmlDeviceGetComputeRunningProcesses_v3
func nvmlDeviceGetComputeRunningProcesses_v3(dev unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return processes(dev, count, infos, computeList, false)
}

//export nvmlDeviceGetComputeRunningProcesses_v2
func nvmlDeviceGetComputeRunningProcesses_v2(dev unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return processes(dev, count, infos, computeList, false)
}

//export nvmlDeviceGetComputeRunningProcesses
func nvmlDeviceGetComputeRunningProcesses(dev unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return processes(dev, count, infos, computeList, true)
}

//export nvmlDeviceGetGraphicsRunningProcesses_v3
func nvmlDeviceGetGraphicsRunningProcesses_v3(dev unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return processes(dev, count, infos, graphicsList, false)
}

//export nvmlDeviceGetGraphicsRunningProcesses_v2
func nvmlDeviceGetGraphicsRunningProcesses_v2(dev unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return processes(dev, count, infos, graphicsList, false)
}

//export nvmlDeviceGetGraphicsRunningProcesses
func nvmlDeviceGetGraphicsRunningProcesses(dev unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return processes(dev, count, infos, graphicsList, true)
}

//export nvmlDeviceGetMPSComputeRunningProcesses_v3
func nvmlDeviceGetMPSComputeRunningProcesses_v3(dev unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return processes(dev, count, infos, mpsList, false)
}

//export nvmlDeviceGetMPSComputeRunningProcesses_v2
func nvmlDeviceGetMPSComputeRunningProcesses_v2(dev unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return processes(dev, count, infos, mpsList, false)
}

//export nvmlDeviceGetMPSComputeRunningProcesses
func nvmlDeviceGetMPSComputeRunningProcesses(dev unsafe.Pointer, count *C.uint, infos unsafe.Pointer) C.int {
	return processes(dev, count, infos, mpsList, true)
}

// nvmlDeviceGetProcessUtilization gives one sample per process with an
// smUtilization, newer than lastSeen; ERROR_NOT_FOUND when there is none
// (as NVML when no process ran a kernel since), except that a GPU whose
// processes all lack smUtilization answers ERROR_NOT_SUPPORTED, so that
// "no figure" in the file stays no figure rather than reading as 0.
//
//export nvmlDeviceGetProcessUtilization
func nvmlDeviceGetProcessUtilization(dev unsafe.Pointer, samples unsafe.Pointer, count *C.uint, lastSeen C.ulonglong) C.int {
	n, g, r := device(dev, true)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if count == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	if len(g.dev.Processes) > 0 && !hasSamples(g) {
		return ret(nvml.ERROR_NOT_SUPPORTED)
	}
	s := processSamples(g.dev, uint64(lastSeen), n.now())
	if len(s) == 0 {
		*count = 0
		return ret(nvml.ERROR_NOT_FOUND)
	}
	if samples == nil || int(*count) < len(s) {
		*count = C.uint(len(s))
		return ret(nvml.ERROR_INSUFFICIENT_SIZE)
	}
	*count = C.uint(len(s))
	copy(unsafe.Slice((*nvml.ProcessUtilizationSample)(samples), len(s)), s)
	return ret(nvml.SUCCESS)
}

// nvmlDeviceGetSamples gives GPU_UTILIZATION_SAMPLES only: one sample of
// the file's utilization (unsigned int percent), stamped now, when that is
// newer than lastSeen, ERROR_NOT_FOUND otherwise, as a driver answers a
// reading within one of its sample periods; a GPU whose utilization the
// file marks unsupported answers ERROR_NOT_SUPPORTED, and the other sample
// types are not kept. A NULL buffer asks for the count, as NVML's does.
//
//export nvmlDeviceGetSamples
func nvmlDeviceGetSamples(dev unsafe.Pointer, typ C.int, lastSeen C.ulonglong, valType *C.int, count *C.uint, samples unsafe.Pointer) C.int {
	n, g, r := device(dev, true)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if valType == nil || count == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	s, r := utilizationSamples(g.dev, nvml.SamplingType(typ), uint64(lastSeen), n.now())
	if r != nvml.SUCCESS {
		return ret(r)
	}
	*valType = C.int(nvml.VALUE_TYPE_UNSIGNED_INT)
	if samples == nil {
		*count = C.uint(len(s))
		return ret(nvml.SUCCESS)
	}
	k := min(int(*count), len(s))
	copy(unsafe.Slice((*nvml.Sample)(samples), k), s[:k])
	*count = C.uint(k)
	return ret(nvml.SUCCESS)
}

func hasSamples(g *gpuState) bool {
	for _, p := range g.dev.Processes {
		if p.HasSMUtilization {
			return true
		}
	}
	return false
}

//export nvmlEventSetCreate
func nvmlEventSetCreate(set *unsafe.Pointer) C.int {
	n, r := current()
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if set == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	h := C.malloc(8)
	lib.mu.Lock()
	lib.sets[h] = n.createSet()
	lib.mu.Unlock()
	putHandle(set, h)
	return ret(nvml.SUCCESS)
}

// eventSetOf resolves an event set handle.
func eventSetOf(h unsafe.Pointer) (*node, *eventSet, nvml.Return) {
	n, r := current()
	if r != nvml.SUCCESS {
		return nil, nil, r
	}
	lib.mu.Lock()
	s, ok := lib.sets[h]
	lib.mu.Unlock()
	if !ok || !n.validSet(s) {
		return nil, nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return n, s, nvml.SUCCESS
}

//export nvmlEventSetFree
func nvmlEventSetFree(set unsafe.Pointer) C.int {
	n, s, r := eventSetOf(set)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	lib.mu.Lock()
	delete(lib.sets, set)
	lib.mu.Unlock()
	r = n.freeSet(s)
	C.free(set)
	return ret(r)
}

//export nvmlDeviceGetSupportedEventTypes
func nvmlDeviceGetSupportedEventTypes(dev unsafe.Pointer, types *C.ulonglong) C.int {
	_, _, r := device(dev, false)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if types == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	*types = supportedEvents
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(dev unsafe.Pointer, types C.ulonglong, set unsafe.Pointer) C.int {
	_, g, r := device(dev, false)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	n, s, r := eventSetOf(set)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	return ret(n.register(s, g.index, uint64(types)))
}

// eventData is nvmlEventData_t. The device handle is written as a plain
// word (see putHandle).
type eventData struct {
	device            uintptr
	eventType         uint64
	eventData         uint64
	gpuInstanceID     uint32
	computeInstanceID uint32
}

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(set unsafe.Pointer, data unsafe.Pointer, timeoutMs C.uint) C.int {
	n, s, r := eventSetOf(set)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if data == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	e, r := n.wait(s, time.Duration(timeoutMs)*time.Millisecond)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	*(*eventData)(data) = eventData{
		device:            uintptr(handle(e.index)),
		eventType:         nvml.EventTypeXidCriticalError,
		eventData:         e.xid,
		gpuInstanceID:     invalidID,
		computeInstanceID: invalidID,
	}
	return ret(nvml.SUCCESS)
}

// nvmlEventSetWait is version 1, whose nvmlEventData_t ends after the Xid.
//
//export nvmlEventSetWait
func nvmlEventSetWait(set unsafe.Pointer, data unsafe.Pointer, timeoutMs C.uint) C.int {
	var full eventData
	r := nvmlEventSetWait_v2(set, unsafe.Pointer(&full), timeoutMs)
	if nvml.Return(r) == nvml.SUCCESS {
		C.memcpy(data, unsafe.Pointer(&full), C.size_t(unsafe.Offsetof(full.gpuInstanceID)))
	}
	return r
}

//export nvmlDeviceGetCudaComputeCapability
func nvmlDeviceGetCudaComputeCapability(dev unsafe.Pointer, major, minor *C.int) C.int {
	_, _, r := device(dev, true)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if major == nil || minor == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	*major, *minor = computeMajor, computeMinor
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetArchitecture
func nvmlDeviceGetArchitecture(dev unsafe.Pointer, arch *C.uint) C.int {
	_, _, r := device(dev, true)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if arch == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	*arch = C.uint(nvml.DEVICE_ARCH_AMPERE)
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetBrand
func nvmlDeviceGetBrand(dev unsafe.Pointer, brand *C.int) C.int {
	_, _, r := device(dev, true)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if brand == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	*brand = C.int(nvml.BRAND_NVIDIA_RTX)
	return ret(nvml.SUCCESS)
}

// notSupported answers a query about a feature simulated GPUs lack, after
// checking the handle as NVML does.
func notSupported(dev unsafe.Pointer) C.int {
	if _, _, r := device(dev, false); r != nvml.SUCCESS {
		return ret(r)
	}
	return ret(nvml.ERROR_NOT_SUPPORTED)
}

//export nvmlDeviceGetMigMode
func nvmlDeviceGetMigMode(dev unsafe.Pointer, current, pending *C.uint) C.int {
	return notSupported(dev)
}

//export nvmlDeviceGetMaxMigDeviceCount
func nvmlDeviceGetMaxMigDeviceCount(dev unsafe.Pointer, count *C.uint) C.int {
	return notSupported(dev)
}

//export nvmlDeviceGetMigDeviceHandleByIndex
func nvmlDeviceGetMigDeviceHandleByIndex(dev unsafe.Pointer, index C.uint, mig *unsafe.Pointer) C.int {
	return notSupported(dev)
}

//export nvmlDeviceGetDeviceHandleFromMigDeviceHandle
func nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig unsafe.Pointer, dev *unsafe.Pointer) C.int {
	return ret(nvml.ERROR_INVALID_ARGUMENT)
}

// No handle this library gives out is a MIG device's.
//
//export nvmlDeviceIsMigDeviceHandle
func nvmlDeviceIsMigDeviceHandle(dev unsafe.Pointer, isMig *C.uint) C.int {
	if _, _, r := device(dev, false); r != nvml.SUCCESS {
		return ret(r)
	}
	if isMig == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	*isMig = 0
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetAttributes_v2
func nvmlDeviceGetAttributes_v2(dev unsafe.Pointer, attr unsafe.Pointer) C.int {
	return notSupported(dev)
}

//export nvmlDeviceGetAttributes
func nvmlDeviceGetAttributes(dev unsafe.Pointer, attr unsafe.Pointer) C.int {
	return notSupported(dev)
}

//export nvmlDeviceGetNumaNodeId
func nvmlDeviceGetNumaNodeId(dev unsafe.Pointer, node *C.uint) C.int {
	return notSupported(dev)
}

//export nvmlDeviceGetGpuFabricInfo
func nvmlDeviceGetGpuFabricInfo(dev unsafe.Pointer, info unsafe.Pointer) C.int {
	return notSupported(dev)
}

//export nvmlDeviceGetGpuFabricInfoV
func nvmlDeviceGetGpuFabricInfoV(dev unsafe.Pointer, info unsafe.Pointer) C.int {
	return notSupported(dev)
}

//export nvmlDeviceGetAddressingMode
func nvmlDeviceGetAddressingMode(dev unsafe.Pointer, mode unsafe.Pointer) C.int {
	return notSupported(dev)
}

//export nvmlDeviceGetNvLinkState
func nvmlDeviceGetNvLinkState(dev unsafe.Pointer, link C.uint, active *C.int) C.int {
	return notSupported(dev)
}

//export nvmlDeviceGetNvLinkRemotePciInfo_v2
func nvmlDeviceGetNvLinkRemotePciInfo_v2(dev unsafe.Pointer, link C.uint, pci unsafe.Pointer) C.int {
	return notSupported(dev)
}

//export nvmlDeviceGetP2PStatus
func nvmlDeviceGetP2PStatus(dev1, dev2 unsafe.Pointer, index C.int, status *C.int) C.int {
	return notSupported(dev1)
}

// Simulated GPUs sit behind one host bridge each: no NVLink, no PCIe
// switch shared.
//
//export nvmlDeviceGetTopologyCommonAncestor
func nvmlDeviceGetTopologyCommonAncestor(dev1, dev2 unsafe.Pointer, level *C.int) C.int {
	_, g1, r := device(dev1, false)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	_, g2, r := device(dev2, false)
	if r != nvml.SUCCESS {
		return ret(r)
	}
	if level == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	*level = C.int(nvml.TOPOLOGY_HOSTBRIDGE)
	if g1.index == g2.index {
		*level = C.int(nvml.TOPOLOGY_INTERNAL)
	}
	return ret(nvml.SUCCESS)
}

package nvmlbackend

/*
#cgo linux LDFLAGS: -Wl,--unresolved-symbols=ignore-in-object-files
#cgo darwin LDFLAGS: -Wl,-undefined,dynamic_lookup

// The NVML calls that take a caller's buffer (NVML API Reference), declared
// with opaque pointers: the buffers are go-nvml's own types, whose layout
// is NVML's. The symbols resolve to the libnvidia-ml that go-nvml's Init
// opened with RTLD_GLOBAL, as go-nvml's own calls do.
int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, void *infos);
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *device, unsigned int *count, void *infos);
int nvmlDeviceGetProcessUtilization(void *device, void *samples, unsigned int *count, unsigned long long lastSeen);
int nvmlDeviceGetSamples(void *device, int type, unsigned long long lastSeen, int *valType, unsigned int *count, void *samples);
*/
import "C"

import (
	"reflect"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Each of go-nvml's list readings asks NVML twice: once for the size of
// the list (a NULL or one-entry buffer), once for the list. On a real H200
// in a Firecracker VM every call into the driver cost about as much as the
// other, and with 48 processes these four lists were two thirds of a
// scrape's CPU (make test-gpu's profile). A buffer sized from the previous
// reading makes it one call, and a second only when the list outgrew it.

// rawDevice is the driver handle of a go-nvml device.
type rawDevice struct{ h unsafe.Pointer }

// goNVMLPackage is the package whose device type holds a driver handle.
const goNVMLPackage = "github.com/NVIDIA/go-nvml/pkg/nvml"

// asRaw returns d's driver handle when d is go-nvml's own device (one
// pointer field, the handle); ok is false for anything else (test mocks),
// which is then read through its methods.
func asRaw(d nvml.Device) (rawDevice, bool) {
	if d == nil {
		return rawDevice{}, false
	}
	v := reflect.ValueOf(d)
	if v.Kind() != reflect.Struct || v.Type().PkgPath() != goNVMLPackage || v.NumField() != 1 || v.Field(0).Kind() != reflect.Pointer {
		return rawDevice{}, false
	}
	h := v.Field(0).UnsafePointer()
	return rawDevice{h}, h != nil
}

// maxTries bounds the retries of a list that keeps outgrowing its buffer
// (processes starting between the calls).
const maxTries = 4

// processes reads the compute or graphics process list into a buffer of
// hint entries, larger when NVML says the list needs more.
func (r rawDevice) processes(graphics bool, hint int) ([]nvml.ProcessInfo, nvml.Return) {
	n := max(hint, 1)
	for range maxTries {
		buf := make([]nvml.ProcessInfo, n)
		count := C.uint(n)
		var rc C.int
		if graphics {
			rc = C.nvmlDeviceGetGraphicsRunningProcesses_v3(r.h, &count, unsafe.Pointer(&buf[0]))
		} else {
			rc = C.nvmlDeviceGetComputeRunningProcesses_v3(r.h, &count, unsafe.Pointer(&buf[0]))
		}
		ret := nvml.Return(rc)
		if ret != nvml.ERROR_INSUFFICIENT_SIZE {
			if ret != nvml.SUCCESS {
				return nil, ret
			}
			return buf[:min(int(count), n)], ret
		}
		n = max(int(count)+int(count)/4+1, n*2)
	}
	return nil, nvml.ERROR_INSUFFICIENT_SIZE
}

// processUtilization reads the per-process samples newer than since into a
// buffer of hint entries, larger when NVML says they need more.
func (r rawDevice) processUtilization(since uint64, hint int) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	n := max(hint, 1)
	for range maxTries {
		buf := make([]nvml.ProcessUtilizationSample, n)
		count := C.uint(n)
		ret := nvml.Return(C.nvmlDeviceGetProcessUtilization(r.h, unsafe.Pointer(&buf[0]), &count, C.ulonglong(since)))
		if ret != nvml.ERROR_INSUFFICIENT_SIZE {
			if ret != nvml.SUCCESS {
				return nil, ret
			}
			return buf[:min(int(count), n)], ret
		}
		n = max(int(count)+int(count)/4+1, n*2)
	}
	return nil, nvml.ERROR_INSUFFICIENT_SIZE
}

// samples reads the samples of typ newer than since into a buffer of hint
// entries. NVML fills what fits and says how many it wrote (or answers
// ERROR_INSUFFICIENT_SIZE); a full buffer may have left some out, so it is
// read again, twice as large.
func (r rawDevice) samples(typ nvml.SamplingType, since uint64, hint int) (nvml.ValueType, []nvml.Sample, nvml.Return) {
	n := max(hint, 1)
	for try := 1; ; try++ {
		buf := make([]nvml.Sample, n)
		count := C.uint(n)
		var vt C.int
		ret := nvml.Return(C.nvmlDeviceGetSamples(r.h, C.int(typ), C.ulonglong(since), &vt, &count, unsafe.Pointer(&buf[0])))
		switch {
		case ret == nvml.ERROR_INSUFFICIENT_SIZE && try < maxTries:
			n = max(int(count), n*2)
			continue
		case ret != nvml.SUCCESS:
			return nvml.ValueType(vt), nil, ret
		}
		if int(count) < n || try == maxTries {
			return nvml.ValueType(vt), buf[:min(int(count), n)], ret
		}
		n *= 2
	}
}

// listSizes is how long each list was at a GPU's previous reading.
type listSizes struct {
	compute, graphics, procUtil, samples int
}

// sized returns GPU uuid's list sizes and records the new ones set makes.
func (b *Backend) sized(uuid string, set func(s *listSizes)) listSizes {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sizes[uuid]
	if set != nil {
		n := s
		set(&n)
		b.sizes[uuid] = n
	}
	return s
}

// grown is a buffer for a list that was last n long: room for a quarter
// more, and at least least, so that a few new processes or a longer
// scrape interval need no second call.
func grown(n, least int) int { return max(n+n/4+1, least) }

// processList is the GPU's compute (or graphics) process list, read in
// one call where the device is go-nvml's.
func (b *Backend) processList(h nvml.Device, uuid string, graphics bool) ([]nvml.ProcessInfo, nvml.Return) {
	r, ok := asRaw(h)
	if !ok {
		if graphics {
			return h.GetGraphicsRunningProcesses()
		}
		return h.GetComputeRunningProcesses()
	}
	last := b.sized(uuid, nil)
	hint := last.compute
	if graphics {
		hint = last.graphics
	}
	list, ret := r.processes(graphics, grown(hint, 4))
	if ret == nvml.SUCCESS {
		b.sized(uuid, func(s *listSizes) {
			if graphics {
				s.graphics = len(list)
			} else {
				s.compute = len(list)
			}
		})
	}
	return list, ret
}

// processUtilization is the GPU's per-process samples newer than since,
// read in one call where the device is go-nvml's. As go-nvml's, it
// answers ERROR_INSUFFICIENT_SIZE with no samples only when NVML could not
// size them.
func (b *Backend) processUtilization(h nvml.Device, uuid string, since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	r, ok := asRaw(h)
	if !ok {
		return h.GetProcessUtilization(since)
	}
	list, ret := r.processUtilization(since, grown(b.sized(uuid, nil).procUtil, 8))
	if ret == nvml.SUCCESS {
		b.sized(uuid, func(s *listSizes) { s.procUtil = len(list) })
	}
	return list, ret
}

// samples is the GPU's samples of typ newer than since, read in one call
// where the device is go-nvml's.
func (b *Backend) samples(h nvml.Device, uuid string, typ nvml.SamplingType, since uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
	r, ok := asRaw(h)
	if !ok {
		return h.GetSamples(typ, since)
	}
	vt, list, ret := r.samples(typ, since, grown(2*b.sized(uuid, nil).samples, 32))
	if ret == nvml.SUCCESS {
		b.sized(uuid, func(s *listSizes) { s.samples = len(list) })
	}
	return vt, list, ret
}

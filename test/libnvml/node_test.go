package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuslice/gpuslice/internal/gpu"
)

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

const twoGPUs = `gpus:
  - uuid: GPU-a
    memoryTotalBytes: 100
    xidEvents: [{xid: 79}, {xid: 79}, {xid: 13}]
  - uuid: GPU-b
    memoryTotalBytes: 100
    error: fell off the bus
    xidEvents: [{xid: 79}]
`

func TestPercent(t *testing.T) {
	for _, tc := range []struct {
		ratio float64
		want  uint32
	}{{0, 0}, {0.29, 29}, {0.42, 42}, {0.305, 31}, {1, 100}, {1.5, 100}, {-1, 0}} {
		if got := percent(tc.ratio); got != tc.want {
			t.Errorf("percent(%v) = %d, want %d", tc.ratio, got, tc.want)
		}
	}
}

func TestProcessSamples(t *testing.T) {
	now := time.UnixMicro(5_000_000)
	d := &gpu.Device{Processes: []gpu.Process{
		{PID: 1, SMUtilization: 0.3, HasSMUtilization: true},
		{PID: 2},
		{PID: 3, HasSMUtilization: true},
	}}
	got := processSamples(d, 0, now)
	if len(got) != 2 || got[0].Pid != 1 || got[0].SmUtil != 30 || got[1].Pid != 3 || got[1].SmUtil != 0 || got[0].TimeStamp != 5_000_000 {
		t.Errorf("samples = %+v, want PIDs 1 (30%%) and 3 (0%%) at 5000000", got)
	}
	if got := processSamples(d, 5_000_000, now); got != nil {
		t.Errorf("samples not newer than lastSeen = %+v, want none", got)
	}
}

// TestEventsOncePerSet checks that each Xid entry of the file is delivered
// once to each set that registered its GPU, including a GPU in error, and
// that entries added later are delivered too.
func TestEventsOncePerSet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.yaml")
	writeFile(t, path, twoGPUs)
	n := newNode(path)
	drain := func(s *eventSet) map[xidEvent]int {
		got := map[xidEvent]int{}
		for {
			e, r := n.wait(s, 0)
			if r == nvml.ERROR_TIMEOUT {
				return got
			}
			if r != nvml.SUCCESS {
				t.Fatalf("wait: %v", r)
			}
			got[e]++
		}
	}
	s1, s2 := n.createSet(), n.createSet()
	for i := range 2 {
		if r := n.register(s1, i, nvml.EventTypeXidCriticalError); r != nvml.SUCCESS {
			t.Fatalf("register GPU %d: %v", i, r)
		}
	}
	if r := n.register(s2, 0, nvml.EventTypeXidCriticalError); r != nvml.SUCCESS {
		t.Fatal(r)
	}
	if r := n.register(s2, 0, nvml.EventTypeDoubleBitEccError); r != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("registering ECC events = %v, want NOT_SUPPORTED", r)
	}
	want1 := map[xidEvent]int{{0, 79}: 2, {0, 13}: 1, {1, 79}: 1}
	if got := drain(s1); !equal(got, want1) {
		t.Errorf("set 1 got %v, want %v", got, want1)
	}
	if got := drain(s1); len(got) != 0 {
		t.Errorf("set 1 got %v again", got)
	}
	if got, want := drain(s2), map[xidEvent]int{{0, 79}: 2, {0, 13}: 1}; !equal(got, want) {
		t.Errorf("set 2 got %v, want %v", got, want)
	}
	writeFile(t, path, strings.Replace(twoGPUs, "{xid: 13}]", "{xid: 13}, {xid: 48}]", 1))
	if got, want := drain(s1), map[xidEvent]int{{0, 48}: 1}; !equal(got, want) {
		t.Errorf("after an entry was added, set 1 got %v, want %v", got, want)
	}
	if r := n.freeSet(s1); r != nvml.SUCCESS {
		t.Errorf("free: %v", r)
	}
	if r := n.freeSet(s1); r != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("second free = %v, want INVALID_ARGUMENT", r)
	}
}

func equal(a, b map[xidEvent]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestGPUInErrorKeepsIdentity(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.yaml")
	writeFile(t, path, twoGPUs)
	n := newNode(path)
	g, r := n.gpu(1, false)
	if r != nvml.SUCCESS || g.uuid != "GPU-b" {
		t.Errorf("identity of the GPU in error = %+v, %v; want GPU-b", g, r)
	}
	if _, r := n.gpu(1, true); r != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("reading the GPU in error = %v, want GPU_IS_LOST", r)
	}
	if _, r := n.gpu(2, false); r != nvml.ERROR_GPU_NOT_FOUND {
		t.Errorf("a GPU past the file = %v, want GPU_NOT_FOUND", r)
	}
}

func TestBadFileNamesItInErrorText(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.yaml")
	writeFile(t, path, "gpus:\n  - uuid: GPU-a\n    memoryTotalBytes: lots\n")
	n := newNode(path)
	if _, r := n.gpu(0, false); r != nvml.ERROR_DRIVER_NOT_LOADED {
		t.Fatalf("bad file = %v, want DRIVER_NOT_LOADED", r)
	}
	text := errorText(nvml.ERROR_DRIVER_NOT_LOADED, n.fileErr())
	if !strings.HasPrefix(text, "Driver Not Loaded") || !strings.Contains(text, path) || !strings.Contains(text, "line 3") {
		t.Errorf("error text %q does not name the file and line", text)
	}
	if got := errorText(nvml.ERROR_GPU_IS_LOST, n.fileErr()); got != "GPU is lost" {
		t.Errorf("GPU_IS_LOST text = %q", got)
	}
}

func TestUtilizationSamples(t *testing.T) {
	now := time.UnixMicro(5_000_000)
	d := &gpu.Device{Utilization: 0.42}
	got, r := utilizationSamples(d, nvml.GPU_UTILIZATION_SAMPLES, 0, now)
	if r != nvml.SUCCESS || len(got) != 1 || got[0].TimeStamp != 5_000_000 || binary.NativeEndian.Uint32(got[0].SampleValue[:4]) != 42 {
		t.Errorf("samples = %+v, %v; want one of 42 %% at 5000000", got, r)
	}
	if _, r := utilizationSamples(d, nvml.GPU_UTILIZATION_SAMPLES, 5_000_000, now); r != nvml.ERROR_NOT_FOUND {
		t.Errorf("no sample newer than lastSeen: %v, want ERROR_NOT_FOUND", r)
	}
	if _, r := utilizationSamples(d, nvml.TOTAL_POWER_SAMPLES, 0, now); r != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("power samples: %v, want ERROR_NOT_SUPPORTED", r)
	}
	d.Missing = gpu.ReadingUtilization
	if _, r := utilizationSamples(d, nvml.GPU_UTILIZATION_SAMPLES, 0, now); r != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("utilization unsupported: %v, want ERROR_NOT_SUPPORTED", r)
	}
}

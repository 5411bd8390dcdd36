package nvmlbackend_test

import (
	"encoding/binary"
	"slices"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	mockserver "github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpuslice/gpuslice/internal/gpu"
)

// sharedGPU plays the driver of one time-sliced GPU the way an H200 with
// driver 580 answered pynvml in issue 22: nvmlDeviceGetProcessUtilization
// with the last timestamp seen gives one sample per busy process per read,
// stamped at the read (processes a few hundred microseconds apart), with
// smUtil already that process's share; nvmlDeviceGetSamples keeps a
// GPU_UTILIZATION sample every 200 ms. Time moves only through advance.
type sharedGPU struct {
	mu  sync.Mutex
	now uint64 // µs, NVML's CPU timestamps
	// busy is each running process's SM share in percent; a process in
	// procs but not in busy ran no kernel.
	busy  map[uint32]uint32
	procs []uint32
	// util is the driver's GPU_UTILIZATION buffer.
	util []nvml.Sample
}

const (
	sec        = 1_000_000 // µs
	utilPeriod = 200_000   // µs between GPU_UTILIZATION samples
)

// utilSample is a GPU_UTILIZATION sample: an unsigned int percent.
func utilSample(ts uint64, percent uint32) nvml.Sample {
	s := nvml.Sample{TimeStamp: ts}
	binary.NativeEndian.PutUint32(s.SampleValue[:4], percent)
	return s
}

// install makes GPU g of a mock node answer from s.
func (s *sharedGPU) install(g *mockserver.Device) {
	g.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var list []nvml.ProcessInfo
		for _, pid := range s.procs {
			list = append(list, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: gib})
		}
		return list, nvml.SUCCESS
	}
	g.GetProcessUtilizationFunc = func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var out []nvml.ProcessUtilizationSample
		for i, pid := range s.procs {
			pct, ok := s.busy[pid]
			ts := s.now - uint64(300*i)
			if ok && ts > lastSeen {
				out = append(out, nvml.ProcessUtilizationSample{Pid: pid, TimeStamp: ts, SmUtil: pct})
			}
		}
		if len(out) == 0 {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return out, nvml.SUCCESS
	}
	g.GetSamplesFunc = func(typ nvml.SamplingType, lastSeen uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if typ != nvml.GPU_UTILIZATION_SAMPLES {
			return 0, nil, nvml.ERROR_INVALID_ARGUMENT
		}
		var out []nvml.Sample
		for _, u := range s.util {
			if u.TimeStamp > lastSeen {
				out = append(out, u)
			}
		}
		if len(out) == 0 {
			return nvml.VALUE_TYPE_UNSIGNED_INT, nil, nvml.ERROR_NOT_FOUND
		}
		// go-nvml sizes the slice from NVML's first answer and does not
		// shorten it to what the second wrote: trailing zero samples.
		return nvml.VALUE_TYPE_UNSIGNED_INT, append(out, nvml.Sample{}, nvml.Sample{}), nvml.SUCCESS
	}
}

// advance moves the clock by d µs, the GPU keeping one sample per period
// with the percents of gpu in turn.
func (s *sharedGPU) advance(d uint64, gpu ...uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, end := 0, s.now+d; s.now+utilPeriod <= end; i++ {
		s.now += utilPeriod
		s.util = append(s.util, utilSample(s.now, gpu[i%len(gpu)]))
	}
}

func (s *sharedGPU) set(busy map[uint32]uint32, procs ...uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.busy, s.procs = busy, procs
}

// TestSharedGPUUtilization reads a GPU shared by busy pods, scrape after
// scrape, in the forms a real GPU gave (issue 22). Two busy pods read
// 0.0135 and 0.0145 before: one sample's value over 31 "periods" counted
// from the microseconds between two processes' timestamps.
func TestSharedGPUUtilization(t *testing.T) {
	tests := []struct {
		name string
		busy map[uint32]uint32 // smUtil per PID, each read
		gpu  []uint32          // the GPU's samples, in turn
		// want is each process's share and the GPU's figure, every scrape.
		want    map[int]float64
		wantGPU float64
	}{
		{
			name: "one busy pod alone, one idle",
			busy: map[uint32]uint32{100: 41},
			gpu:  []uint32{37, 42, 40, 41, 42},
			// 0.41 against a GPU at 0.404: scaled down to it.
			want:    map[int]float64{100: 0.404, 200: 0},
			wantGPU: 0.404,
		},
		{
			// 53 + 32 = 85 against a GPU at 84..88 (mean 86).
			name:    "two busy pods",
			busy:    map[uint32]uint32{100: 53, 200: 32},
			gpu:     []uint32{84, 88, 86, 85, 87},
			want:    map[int]float64{100: 0.53, 200: 0.32},
			wantGPU: 0.86,
		},
		{
			// Four pods whose samples add up to more than the GPU's:
			// scaled down to it, in proportion.
			name:    "four busy pods, shares over the GPU's figure",
			busy:    map[uint32]uint32{100: 22, 200: 21, 300: 20, 400: 19},
			gpu:     []uint32{80},
			want:    map[int]float64{100: 0.22 * 0.8 / 0.82, 200: 0.21 * 0.8 / 0.82, 300: 0.20 * 0.8 / 0.82, 400: 0.19 * 0.8 / 0.82},
			wantGPU: 0.80,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			g := n.gpus[2]
			s := &sharedGPU{now: 1_800_000_000 * sec}
			s.install(g)
			s.set(tc.busy, 100, 200, 300, 400)
			if len(tc.busy) < 3 {
				s.set(tc.busy, 100, 200)
			}
			s.advance(30*sec, tc.gpu...) // the driver's buffer before the first scrape
			b := n.open(t)
			for scrape := range 3 {
				if scrape > 0 {
					s.advance(6*sec, tc.gpu...)
				}
				d := snapshot(t, b).Devices[2]
				if d.Missing.Has(gpu.ReadingUtilization) {
					t.Fatalf("scrape %d: GPU utilization missing", scrape)
				}
				got, sum := map[int]float64{}, 0.0
				for _, p := range d.Processes {
					if !p.HasSMUtilization {
						t.Errorf("scrape %d: PID %d has no SM figure", scrape, p.PID)
					}
					got[p.PID] = p.SMUtilization
					sum += p.SMUtilization
				}
				near := cmpopts.EquateApprox(0, 0.002)
				if diff := cmp.Diff(tc.want, got, near); diff != "" {
					t.Errorf("scrape %d: SM share by PID (-want +got):\n%s", scrape, diff)
				}
				if !cmp.Equal(tc.wantGPU, d.Utilization, near) {
					t.Errorf("scrape %d: GPU utilization %.4f, want %.4f", scrape, d.Utilization, tc.wantGPU)
				}
				if sum > d.Utilization+1e-9 {
					t.Errorf("scrape %d: processes add up to %.4f, over the GPU's %.4f", scrape, sum, d.Utilization)
				}
			}
			// GetUtilizationRates is NVML's last sample period, not the
			// window: not read while the samples answer.
			if c := len(g.GetUtilizationRatesCalls()); c != 0 {
				t.Errorf("GetUtilizationRates called %d times with samples at hand", c)
			}
		})
	}
}

// TestUtilizationWindow: every reading asks for the GPU's and the
// processes' samples since the newest of the previous reading, so both
// cover the same window, and an idle stretch reads as idle, not as the
// last busy figure.
func TestUtilizationWindow(t *testing.T) {
	n := newNode(t)
	g := n.gpus[1]
	s := &sharedGPU{now: 1000 * sec}
	s.install(g)
	s.set(map[uint32]uint32{7: 60}, 7, 8)
	s.advance(2*sec, 60)
	b := n.open(t)

	d := snapshot(t, b).Devices[1]
	if !cmp.Equal(d.Utilization, 0.6, approx) || !cmp.Equal(d.Processes[0].SMUtilization, 0.6, approx) || d.Processes[1].SMUtilization != 0 {
		t.Errorf("busy: GPU %v, PID 7 %v, PID 8 %v; want 0.6, 0.6, 0", d.Utilization, d.Processes[0].SMUtilization, d.Processes[1].SMUtilization)
	}
	// Both pods idle for 6 s: no process sample, GPU samples of 0.
	s.set(nil, 7, 8)
	s.advance(6*sec, 0)
	d = snapshot(t, b).Devices[1]
	if d.Utilization != 0 || d.Missing.Has(gpu.ReadingUtilization) {
		t.Errorf("idle: GPU %v (missing %v), want 0", d.Utilization, d.Missing.Names())
	}
	for _, p := range d.Processes {
		if p.SMUtilization != 0 || !p.HasSMUtilization {
			t.Errorf("idle: PID %d reads %v (has %v), want 0", p.PID, p.SMUtilization, p.HasSMUtilization)
		}
	}

	// PID 8 busy for 2 s.
	s.set(map[uint32]uint32{8: 40}, 7, 8)
	s.advance(2*sec, 40)
	d = snapshot(t, b).Devices[1]
	if !cmp.Equal(d.Utilization, 0.4, approx) || d.Processes[0].SMUtilization != 0 || !cmp.Equal(d.Processes[1].SMUtilization, 0.4, approx) {
		t.Errorf("busy again: GPU %v, PID 7 %v, PID 8 %v; want 0.4, 0, 0.4", d.Utilization, d.Processes[0].SMUtilization, d.Processes[1].SMUtilization)
	}

	var procSince, utilSince []uint64
	for _, c := range g.GetProcessUtilizationCalls() {
		procSince = append(procSince, c.V)
	}
	for _, c := range g.GetSamplesCalls() {
		utilSince = append(utilSince, c.V)
	}
	// The first reading asks for all the driver keeps; each next one from
	// the newest sample of the one before. The idle window, whose GPU
	// samples all read 0, does not ask for process samples: the next
	// asks from the end of the idle window.
	if want := []uint64{0, 1008 * sec}; !slices.Equal(procSince, want) {
		t.Errorf("process samples asked since %v, want %v", procSince, want)
	}
	if want := []uint64{0, 1002 * sec, 1008 * sec}; !slices.Equal(utilSince, want) {
		t.Errorf("GPU samples asked since %v, want %v", utilSince, want)
	}
}

// TestUtilizationFallback: where the GPU keeps no samples, or none is
// newer than the previous reading, its utilization is
// GetUtilizationRates's, and its processes' shares are left as NVML gave
// them (the two figures cover different times, so one cannot bound the
// other). A GPU that does not support samples is not asked again.
func TestUtilizationFallback(t *testing.T) {
	tests := []struct {
		name      string
		ret       nvml.Return
		wantAsked int // GetSamples calls over three readings
		wantWarn  int
	}{
		{"no sample since the last reading", nvml.ERROR_NOT_FOUND, 3, 0},
		{"not supported", nvml.ERROR_NOT_SUPPORTED, 1, 0},
		{"failing", nvml.ERROR_UNKNOWN, 3, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			g := n.gpus[2] // GetUtilizationRates: 20 %
			g.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
				return []nvml.ProcessInfo{{Pid: 5, UsedGpuMemory: gib}}, nvml.SUCCESS
			}
			var ts uint64
			g.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
				ts += 2 * sec
				return []nvml.ProcessUtilizationSample{{Pid: 5, TimeStamp: ts, SmUtil: 41}}, nvml.SUCCESS
			}
			g.GetSamplesFunc = func(nvml.SamplingType, uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
				return 0, nil, tc.ret
			}
			b, logs := n.openLogged(t)
			for range 3 {
				d := snapshot(t, b).Devices[2]
				if d.Utilization != 0.2 || d.Missing != 0 {
					t.Fatalf("GPU utilization %v (missing %v), want GetUtilizationRates's 0.2", d.Utilization, d.Missing.Names())
				}
				if p := d.Processes[0]; p.SMUtilization != 0.41 {
					t.Errorf("PID 5 reads %v, want NVML's 0.41", p.SMUtilization)
				}
			}
			if c := len(g.GetSamplesCalls()); c != tc.wantAsked {
				t.Errorf("GetSamples called %d times, want %d", c, tc.wantAsked)
			}
			if w := logs.count("level=WARN", g.UUID, "utilization samples"); w != tc.wantWarn {
				t.Errorf("%d warnings about the samples, want %d\n%s", w, tc.wantWarn, logs)
			}
		})
	}
}

// TestUtilizationSamplesGPUGone: a GPU whose samples call says it is gone
// fails, as from any call.
func TestUtilizationSamplesGPUGone(t *testing.T) {
	n := newNode(t)
	n.gpus[4].GetSamplesFunc = func(nvml.SamplingType, uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
		return 0, nil, nvml.ERROR_GPU_IS_LOST
	}
	s := snapshot(t, n.open(t))
	if len(s.Failed) != 1 || s.Failed[0].Index != 4 || len(s.Devices) != 7 {
		t.Fatalf("Failed %v, %d devices; want GPU 4 failed and 7 read", s.Failed, len(s.Devices))
	}
}

// TestReadingWithinASamplePeriod: a reading that finds no GPU sample newer
// than the previous one (scrapes closer than the driver's sample period)
// does not ask for process samples, of which none can be newer either:
// each process keeps its share of the last window, a process new since
// reads 0, and the shares stay within the GPU's figure.
func TestReadingWithinASamplePeriod(t *testing.T) {
	n := newNode(t)
	g := n.gpus[5] // GetUtilizationRates: 50 %
	s := &sharedGPU{now: 1000 * sec}
	s.install(g)
	s.set(map[uint32]uint32{7: 30}, 7)
	s.advance(2*sec, 30)
	b := n.open(t)
	d := snapshot(t, b).Devices[5]
	if !cmp.Equal(d.Processes[0].SMUtilization, 0.3, approx) {
		t.Fatalf("busy: PID 7 reads %v, want 0.3", d.Processes[0].SMUtilization)
	}
	asked := len(g.GetProcessUtilizationCalls())

	s.set(map[uint32]uint32{7: 30, 9: 20}, 7, 9) // PID 9 starts; no sample yet
	d = snapshot(t, b).Devices[5]
	if c := len(g.GetProcessUtilizationCalls()); c != asked {
		t.Errorf("process samples asked for %d more times with no GPU sample newer", c-asked)
	}
	if len(d.Processes) != 2 || !cmp.Equal(d.Processes[0].SMUtilization, 0.3, approx) || d.Processes[1].SMUtilization != 0 ||
		!d.Processes[1].HasSMUtilization || d.Utilization != 0.5 {
		t.Errorf("within the period: GPU %v, processes %+v; want 0.5 (NVML's last period), PID 7 at 0.3, PID 9 at 0", d.Utilization, d.Processes)
	}

	s.advance(2*sec, 50)
	d = snapshot(t, b).Devices[5]
	if c := len(g.GetProcessUtilizationCalls()); c != asked+1 {
		t.Errorf("process samples asked for %d times after a new GPU sample, want once", c-asked)
	}
	if !cmp.Equal(d.Processes[0].SMUtilization, 0.3, approx) || !cmp.Equal(d.Processes[1].SMUtilization, 0.2, approx) {
		t.Errorf("next window: processes %+v; want PID 7 at 0.3, PID 9 at 0.2", d.Processes)
	}
}

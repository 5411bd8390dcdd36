package nvmlbackend_test

import (
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	nvmlbackend "github.com/gpuslice/gpuslice/internal/gpu/nvml"
)

// TestGraphicsListReadWhenItMayHoldSomething: on a GPU whose graphics list
// was empty, the list is read again only when used memory rises past what
// the compute list accounts for, after 30 s, or when the compute list
// cannot account for memory; while it lists a process, at every reading.
// Whenever a graphics process holds memory, the reading that first sees
// that memory lists it.
func TestGraphicsListReadWhenItMayHoldSomething(t *testing.T) {
	n := newNode(t)
	clk := newClock()
	g := n.gpus[2]
	// 2 GiB used by the driver and whatever no list shows, besides the
	// compute process's 10 GiB.
	reserved := uint64(2 * gib)
	compute := []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 10 * gib}}
	var graphics []nvml.ProcessInfo
	setUsed := func() {
		used := reserved
		for _, p := range append(append([]nvml.ProcessInfo(nil), compute...), graphics...) {
			if p.UsedGpuMemory != ^uint64(0) {
				used += p.UsedGpuMemory
			}
		}
		g.MemoryInfo.Used, g.MemoryInfo.Free = used, g.MemoryInfo.Total-used
	}
	g.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return append([]nvml.ProcessInfo(nil), compute...), nvml.SUCCESS
	}
	asked := 0
	g.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		asked++
		return append([]nvml.ProcessInfo(nil), graphics...), nvml.SUCCESS
	}
	b, err := nvmlbackend.New(n, nvmlbackend.Options{XidPollTimeout: 5 * time.Millisecond, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	step := func(what string, wantAsked int, wantPIDs ...int) {
		t.Helper()
		setUsed()
		s := snapshot(t, b)
		var pids []int
		for _, p := range s.Devices[2].Processes {
			pids = append(pids, p.PID)
		}
		if asked != wantAsked || len(pids) != len(wantPIDs) {
			t.Fatalf("%s: graphics list read %d times, processes %v; want %d, %v", what, asked, pids, wantAsked, wantPIDs)
		}
		for i := range pids {
			if pids[i] != wantPIDs[i] {
				t.Fatalf("%s: processes %v, want %v", what, pids, wantPIDs)
			}
		}
		clk.advance(5 * time.Second)
	}
	step("first reading", 1, 10)
	step("nothing new", 1, 10)
	compute[0].UsedGpuMemory = 12 * gib // the compute process grows: accounted for
	step("compute grows", 1, 10)
	compute = append(compute, nvml.ProcessInfo{Pid: 11, UsedGpuMemory: gib})
	step("compute process starts", 1, 10, 11)
	graphics = []nvml.ProcessInfo{{Pid: 20, UsedGpuMemory: 4 << 20}} // Xorg-sized
	step("graphics process starts", 2, 10, 11, 20)
	step("graphics process runs", 3, 10, 11, 20)
	graphics = nil
	step("graphics process ends", 4, 10, 11)
	step("nothing new again", 4, 10, 11)
	reserved -= gib / 2 // something outside the lists frees memory
	step("unexplained memory falls", 4, 10, 11)
	reserved += 1 << 20 // and takes back less than the slack
	step("unexplained memory within the slack", 4, 10, 11)
	clk.advance(10 * time.Second) // 30 s since the last read
	step("recheck", 5, 10, 11)
	compute = append(compute, nvml.ProcessInfo{Pid: 12, UsedGpuMemory: ^uint64(0)})
	step("a process whose memory is not available", 6, 10, 11, 12)
	step("still not available", 7, 10, 11, 12)
}

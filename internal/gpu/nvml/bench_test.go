package nvmlbackend_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	nvmlbackend "github.com/gpuslice/gpuslice/internal/gpu/nvml"
	"github.com/gpuslice/gpuslice/internal/gpu/nvml/nvmltest"
)

// BenchmarkSnapshot48 is one GPU with 48 busy processes, as the H200 of
// issue 22 (48 CUDA processes in 48 of 68 pods): the backend's share of a
// scrape, with the NVML calls it makes reported as nvml-calls/op (see
// nvmltest for why calls stand for the library's cost).
func BenchmarkSnapshot48(b *testing.B) { benchmarkSnapshot48(b, true) }

// BenchmarkSnapshot48Idle is the same GPU with its 48 processes holding
// memory and running nothing (make test-gpu's cost check, and a shared
// GPU between jobs): the per-process samples are not read.
func BenchmarkSnapshot48Idle(b *testing.B) { benchmarkSnapshot48(b, false) }

func benchmarkSnapshot48(b *testing.B, busy bool) {
	g := &nvmltest.GPU{UUID: "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348", Name: "NVIDIA H200",
		MemTotal: 150 << 30, MemUsed: 40 << 30, SM: map[uint32]uint32{}}
	for i := range 48 {
		pid := uint32(100000 + 37*i)
		g.Processes = append(g.Processes, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: 600 << 20, GpuInstanceId: ^uint32(0), ComputeInstanceId: ^uint32(0)})
		if busy {
			g.SM[pid] = 1 + uint32(i%3)
		}
	}
	if busy {
		g.Util = 86
	}
	lib := nvmltest.New(g)
	be, err := nvmlbackend.New(lib, nvmlbackend.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	ctx := context.Background()
	snap := func() {
		s, err := be.Snapshot(ctx)
		if err != nil || len(s.Devices) != 1 || len(s.Devices[0].Processes) != 48 || (s.Devices[0].Processes[0].SMUtilization == 0) == busy {
			b.Fatalf("snapshot %+v, %v", s, err)
		}
	}
	snap() // the first reading, which looks the GPU up
	before := lib.Calls()
	b.ReportAllocs()
	for b.Loop() {
		snap()
	}
	b.ReportMetric(float64(lib.Calls()-before)/float64(b.N), "nvml-calls/op")
}

package plugin

import (
	"log/slog"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	mockserver "github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	nvmlbackend "github.com/gpuslice/gpuslice/internal/gpu/nvml"
)

// TestNVMLReadingFailureHealth runs the health tracker on the NVML backend
// over go-nvml's DGX A100 mock: a sensor that keeps failing must not take
// a GPU's replicas away (allocatable 0 for as long as it fails), while a
// lost GPU must.
func TestNVMLReadingFailureHealth(t *testing.T) {
	tests := []struct {
		name        string
		power       nvml.Return
		wantHealthy bool
	}{
		{"power draw keeps failing: healthy", nvml.ERROR_UNKNOWN, true},
		{"power draw unsupported: healthy", nvml.ERROR_NOT_SUPPORTED, true},
		{"GPU lost: unhealthy", nvml.ERROR_GPU_IS_LOST, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			server := dgxa100.New()
			server.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
			for _, d := range server.Devices {
				g := d.(*mockserver.Device)
				g.GetSamplesFunc = func(nvml.SamplingType, uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
					return nvml.VALUE_TYPE_UNSIGNED_INT, nil, nvml.ERROR_NOT_FOUND
				}
				g.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.SUCCESS }
				g.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 40, nvml.SUCCESS }
				g.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 100000, nvml.SUCCESS }
				g.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
				g.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
			}
			broken := server.Devices[2].(*mockserver.Device)
			broken.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, tc.power }
			b, err := nvmlbackend.New(server, nvmlbackend.Options{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })

			h := newHealthTracker(time.Minute, slog.New(slog.DiscardHandler))
			t0 := time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)
			// Readings over twice the recovery interval: a GPU failed by
			// every one of them would never recover.
			for i := range 25 {
				snap, err := b.Snapshot(t.Context())
				h.observe(t0.Add(time.Duration(i)*5*time.Second), snap, err, b.Xids())
			}
			gpus := h.gpus()
			if len(gpus) != len(server.Devices) {
				t.Fatalf("%d GPUs known, want %d", len(gpus), len(server.Devices))
			}
			for _, g := range gpus {
				want := g.UUID != broken.UUID || tc.wantHealthy
				if g.Healthy != want {
					t.Errorf("GPU %d (%s): healthy %v, want %v", g.Index, g.UUID, g.Healthy, want)
				}
			}
		})
	}
}

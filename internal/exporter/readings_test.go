package exporter

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
)

// TestUnsupportedReadingsHaveNoSeries: a reading the GPU does not give
// (power without a sensor, utilization on a MIG-enabled GPU) has no series
// at all; a 0 would read as an idle GPU or a card drawing nothing.
func TestUnsupportedReadingsHaveNoSeries(t *testing.T) {
	full := gputest.GPU(gputest.UUID(0), gputest.A6000MemoryBytes).WithUtilization(0.25)
	full.TemperatureCelsius, full.PowerWatts = 55, 120
	mig := gputest.GPU(gputest.UUID(1), gputest.A6000MemoryBytes)
	mig.TemperatureCelsius, mig.PowerWatts = 48, 90
	mig = mig.WithUnsupported(gpu.ReadingUtilization | gpu.ReadingPower)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(New(Config{GPU: gputest.NewFake(full, mig), Procfs: t.TempDir()}))
	for _, tc := range []struct {
		metric string
		uuid   string
		want   int
	}{
		{"gpuslice_gpu_utilization_ratio", full.UUID, 1},
		{"gpuslice_gpu_power_watts", full.UUID, 1},
		{"gpuslice_gpu_temperature_celsius", full.UUID, 1},
		{"gpuslice_gpu_utilization_ratio", mig.UUID, 0},
		{"gpuslice_gpu_power_watts", mig.UUID, 0},
		{"gpuslice_gpu_temperature_celsius", mig.UUID, 1},
		{"gpuslice_gpu_memory_used_bytes", mig.UUID, 1},
	} {
		if got := lines(t, reg, tc.metric, `uuid="`+tc.uuid+`"`); len(got) != tc.want {
			t.Errorf("%s{uuid=%s}: %d series %v, want %d", tc.metric, tc.uuid, len(got), got, tc.want)
		}
	}
	if got := success(t, reg, CollectorGPU); got != "1" {
		t.Errorf("gpu collector success = %s: an unsupported reading is not a failure", got)
	}
}

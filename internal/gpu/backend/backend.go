// Package backend picks a GPU backend by name, the --gpu.backend flag shared
// by the exporter and the device plugin.
package backend

import (
	"fmt"
	"log/slog"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuslice/gpuslice/internal/gpu"
	nvmlbackend "github.com/gpuslice/gpuslice/internal/gpu/nvml"
	"github.com/gpuslice/gpuslice/internal/gpu/sim"
)

// Names of the backends.
const (
	NVML = "nvml"
	Sim  = "sim"
)

// Open returns the named backend. simFile is required for "sim"; it is read
// at every snapshot, so it need not exist yet, but a missing file fails the
// scrape's gpu collector until it does. retryInit keeps an nvml backend
// whose NVML cannot be initialized (it logs why and tries again) instead of
// failing; see nvmlbackend.Options.RetryInit.
func Open(name, simFile string, log *slog.Logger, retryInit bool) (gpu.Backend, error) {
	switch name {
	case NVML:
		b, err := nvmlbackend.New(nvml.New(), nvmlbackend.Options{Logger: log, RetryInit: retryInit})
		if err != nil {
			// Not b: a nil *Backend in a gpu.Backend is not a nil interface.
			return nil, err
		}
		return b, nil
	case Sim:
		if simFile == "" {
			return nil, fmt.Errorf("--gpu.backend=sim needs --sim.file")
		}
		return sim.New(simFile), nil
	default:
		return nil, fmt.Errorf("unknown --gpu.backend %q (want %q or %q)", name, NVML, Sim)
	}
}

package plugin

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gpuslice/gpuslice/internal/podresources"
)

// Environment variables of the memory guardrails. Time-slicing cannot cap a
// container's GPU memory; these tell the frameworks that take most of the
// GPU by default (JAX/XLA preallocates 75 %, TensorFlow maps nearly all of
// it) to grow as needed instead, and JAX to stop at its share. See
// docs/plugin.md for what each one does and does not guarantee.
const (
	// EnvMemoryFraction is the share of each allocated GPU's memory the
	// container's allocator pool should stay under (guardrailFraction),
	// for applications to pass to PyTorch's
	// torch.cuda.set_per_process_memory_fraction, which no environment
	// variable sets.
	EnvMemoryFraction = "GPUSLICE_GPU_MEMORY_FRACTION"
	// EnvXLAPreallocate=false makes JAX allocate as needed instead of
	// reserving its whole pool when it starts.
	EnvXLAPreallocate = "XLA_PYTHON_CLIENT_PREALLOCATE"
	// EnvXLAMemFraction caps XLA's BFC allocator pool at this fraction of
	// the GPU's total memory, with or without preallocation.
	EnvXLAMemFraction = "XLA_CLIENT_MEM_FRACTION"
	// EnvXLAMemFractionOld is the name JAX read before
	// XLA_CLIENT_MEM_FRACTION, and still reads; older images know only it.
	EnvXLAMemFractionOld = "XLA_PYTHON_CLIENT_MEM_FRACTION"
	// EnvTFAllowGrowth=true makes TensorFlow map GPU memory as it needs it
	// instead of nearly all of it at start.
	EnvTFAllowGrowth = "TF_FORCE_GPU_ALLOW_GROWTH"
)

// GuardrailHeadroom is the part of a replica's memory share left outside the
// allocator pool: each process's CUDA context (a few hundred MiB), cuDNN and
// cuBLAS workspaces and the framework's own buffers live outside it, so a
// pool as large as the share would still push the pods past the GPU's total.
const GuardrailHeadroom = 0.10

// xlaDefaultFraction is JAX's own pool size; the guardrails never raise it.
const xlaDefaultFraction = 0.75

// ParseGuardrails reads --memory-guardrails: resource names separated by
// commas ("" turns the guardrails off). A name must be a Kubernetes
// extended resource name, domain/name, as the config's resources are.
func ParseGuardrails(s string) (map[string]bool, error) {
	out := map[string]bool{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, r := range strings.Split(s, ",") {
		r = strings.TrimSpace(r)
		domain, name, ok := strings.Cut(r, "/")
		if !ok || domain == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("memory guardrails: %q is not a resource name (want domain/name, such as nvidia.com/gpu)", r)
		}
		out[r] = true
	}
	return out, nil
}

// guardrailFraction is the fraction of each GPU's memory a container holding
// ids may fill: its share of the most shared GPU among them (1/replicas),
// less GuardrailHeadroom, never above JAX's default, rounded down to 3
// decimals so that the rounding cannot give more than the share.
func guardrailFraction(p plan, ids []string) float64 {
	replicas := 1
	for _, raw := range ids {
		id, err := podresources.ParseDeviceID(raw)
		if err != nil {
			continue // containerEnv has refused the request already
		}
		replicas = max(replicas, p.Replicas[id.UUID])
	}
	f := min((1-GuardrailHeadroom)/float64(replicas), xlaDefaultFraction)
	return math.Floor(f*1000) / 1000
}

// addGuardrails adds the guardrail variables to an allocation's env.
func addGuardrails(env map[string]string, p plan, ids []string) {
	f := strconv.FormatFloat(guardrailFraction(p, ids), 'f', 3, 64)
	env[EnvMemoryFraction] = f
	env[EnvXLAPreallocate] = "false"
	env[EnvXLAMemFraction] = f
	env[EnvXLAMemFractionOld] = f
	env[EnvTFAllowGrowth] = "true"
}

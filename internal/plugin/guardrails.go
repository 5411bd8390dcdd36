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
// it) to grow as needed instead. See docs/plugin.md for what each one does
// and does not guarantee.
const (
	// EnvMemoryFraction is the share of each allocated GPU's memory the
	// container's allocator pool should stay under (guardrailFraction),
	// for applications to pass to PyTorch's
	// torch.cuda.set_per_process_memory_fraction, which no environment
	// variable sets, or to JAX's fraction variable (below) themselves.
	EnvMemoryFraction = "GPUSLICE_GPU_MEMORY_FRACTION"
	// EnvXLAPreallocate=false makes JAX allocate as needed instead of
	// reserving its whole pool when it starts. Every jaxlib reads it, and
	// it has one name, so a value the pod or the program sets itself wins
	// and nothing can conflict with it.
	EnvXLAPreallocate = "XLA_PYTHON_CLIENT_PREALLOCATE"
	// EnvTFAllowGrowth=true makes TensorFlow map GPU memory as it needs it
	// instead of nearly all of it at start.
	EnvTFAllowGrowth = "TF_FORCE_GPU_ALLOW_GROWTH"
)

// JAX's two names for its pool's fraction of the GPU. The guardrails set
// neither (addGuardrails says why); they are named here for the tests that
// hold the plugin to that.
const (
	// EnvXLAMemFraction is the name jaxlib reads from 0.4.32 on.
	EnvXLAMemFraction = "XLA_CLIENT_MEM_FRACTION"
	// EnvXLAMemFractionOld is the name every jaxlib reads.
	EnvXLAMemFractionOld = "XLA_PYTHON_CLIENT_MEM_FRACTION"
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
//
// It sets no JAX fraction variable, though either one alone would cap JAX
// at its share, because no choice of name is safe for every program
// (jaxlib's rule, from its generate_pjrt_gpu_plugin_options, with sources
// in docs/plugin.md): jaxlib before 0.4.32 reads only
// XLA_PYTHON_CLIENT_MEM_FRACTION; from 0.4.32 (XLA of September 2024) it
// reads both names and, when both are non-empty, raises ValueError while
// it loads its CUDA plugin, and JAX then runs on the CPU. The kubelet puts
// the pod spec's env after the device plugin's (pod wins on the same name),
// but the other name can come from the pod spec, an envFrom, the image or
// the program's own os.environ before it imports jax, none of which the
// plugin sees when it answers Allocate. Whichever name the plugin set, a
// program that sets the other would leave its GPU. So the plugin offers
// the fraction as EnvMemoryFraction, which no framework reads, for a
// program to pass on under the name its JAX wants.
func addGuardrails(env map[string]string, p plan, ids []string) {
	f := strconv.FormatFloat(guardrailFraction(p, ids), 'f', 3, 64)
	env[EnvMemoryFraction] = f
	env[EnvXLAPreallocate] = "false"
	env[EnvTFAllowGrowth] = "true"
}

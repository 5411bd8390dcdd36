package realnode_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/testproc"
)

// TestPluginMemoryGuardrails: with --memory-guardrails naming the resource,
// a real container allocated a replica by the real kubelet starts with the
// JAX/XLA, TensorFlow and gpuslice variables set from its share (and neither
// of JAX's fraction names), while a variable the pod spec sets itself wins
// over the plugin's: that is how a pod opts out, as docs/plugin.md says, so
// the test holds the runtime to it.
func TestPluginMemoryGuardrails(t *testing.T) {
	need(t)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, cfg, 2)
	startPlugin(t, cfg, "--memory-guardrails="+string(gpuRes))
	waitAllocatable(t, gpuRes, 2, 60*time.Second)

	pod := fakeCUDAPod("guardrails", podOpts{args: []string{"-memory", "0s=1Gi", "-print-env"}})
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "TF_FORCE_GPU_ALLOW_GROWTH", Value: "false"}}
	p := waitRunning(t, createPod(t, pod).Name, 60*time.Second)
	var log string
	testproc.Eventually(t, 20*time.Second, 200*time.Millisecond, func() string {
		log = containerLog(t, p, "cuda")
		for _, want := range []string{
			"env NVIDIA_VISIBLE_DEVICES=" + gpuUUID,
			fmt.Sprintf("env GPUSLICE_GPU_MEMORY_BUDGET_BYTES=%d", gpuTotal/2),
			"env GPUSLICE_GPU_MEMORY_FRACTION=0.450",
			"env XLA_PYTHON_CLIENT_PREALLOCATE=false",
			"fakecuda: pid ",
		} {
			if !strings.Contains(log, want) {
				return fmt.Sprintf("container log lacks %q:\n%s", want, log)
			}
		}
		// Neither of JAX's fraction names: a program that set the other
		// one would leave the GPU (docs/plugin.md).
		for _, never := range []string{"env XLA_CLIENT_MEM_FRACTION=", "env XLA_PYTHON_CLIENT_MEM_FRACTION="} {
			if strings.Contains(log, never) {
				return fmt.Sprintf("container log has %q:\n%s", never, log)
			}
		}
		return ""
	})
	var tf []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "env TF_FORCE_GPU_ALLOW_GROWTH=") {
			tf = append(tf, l[strings.Index(l, "env "):])
		}
	}
	if want := []string{"env TF_FORCE_GPU_ALLOW_GROWTH=false"}; !slices.Equal(tf, want) {
		t.Errorf("pod spec TF_FORCE_GPU_ALLOW_GROWTH=false, device plugin true: the container sees %q, want %q", tf, want)
	}
}

package realnode_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/mps"
	"github.com/gpuslice/gpuslice/internal/testproc"
)

// TestPluginMPSLimits: gpuslice-plugin in MPS mode against a control
// daemon's directory laid out as NVIDIA's (and the chart's) daemon leaves
// it; each container started on the real kubelet gets the pipe directory
// mounted, CUDA_MPS_PIPE_DIRECTORY and its pinned limit (48 GiB / 2), and
// the simulated driver holds each client to that limit: the pod that asks
// for more gets an out-of-memory error while its neighbour keeps its memory
// and the GPU still has memory free.
func TestPluginMPSLimits(t *testing.T) {
	need(t)
	root := t.TempDir()
	for _, d := range []string{mps.PipeDir(root, string(gpuRes)), mps.LogDir(root, string(gpuRes)), mps.ShmDir(root)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(mps.StartedFile(root, string(gpuRes)), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	startPlugin(t, cfg, "--mps-root="+root)
	waitAllocatable(t, gpuRes, 2, 60*time.Second)

	limit := gpuTotal / 2
	neighbour := waitRunning(t, createPod(t, fakeCUDAPod("mps-neighbour", podOpts{args: []string{"-memory", "0s=4Gi", "-print-env"}})).Name, 60*time.Second)
	waitLog(t, neighbour, "cuda",
		"env "+mps.EnvPipeDirectory+"=/mps/nvidia.com/gpu/pipe",
		fmt.Sprintf("env %s=0=%dM", mps.EnvPinnedMemLimit, limit>>20),
		"env "+mps.EnvThreadPercentage+"=50")

	// Past its limit by 1 GiB, with 20 GiB of the GPU still free.
	capped := createPod(t, fakeCUDAPod("mps-capped", podOpts{restart: corev1.RestartPolicyNever,
		args: []string{"-memory", fmt.Sprintf("0s=1Gi,1s=%d", limit+(1<<30))}}))
	testproc.Eventually(t, 60*time.Second, 200*time.Millisecond, func() string {
		p := getPod(t, capped.Name)
		if p.Status.Phase != corev1.PodFailed {
			return fmt.Sprintf("pod %s is %s (%s), want Failed after its OOM", p.Name, p.Status.Phase, podWhy(p))
		}
		return ""
	})
	if log := containerLog(t, getPod(t, capped.Name), "cuda"); !strings.Contains(log, "CUDA out of memory") {
		t.Errorf("the capped pod's log has no OOM:\n%s", log)
	}
	if p := getPod(t, neighbour.Name); p.Status.Phase != corev1.PodRunning {
		t.Errorf("the neighbour is %s (%s) after the capped pod's OOM", p.Status.Phase, podWhy(p))
	}
	var held uint64
	for _, b := range world.driver.Processes()[gpuUUID] {
		held += b
	}
	if held != 4<<30 {
		t.Errorf("the GPU holds %d bytes after the capped pod's OOM, want the neighbour's 4 GiB", held)
	}
}

package exporter

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
	"github.com/gpuslice/gpuslice/internal/oom"
	"github.com/gpuslice/gpuslice/internal/pods"
)

// TestOOMWatchBetweenScrapes: a pod that asks for a GPU, is no longer
// listed by the kubelet (it ended), and whose crash-loop instances' logs the
// kubelet removes before the next scrape, has every OOM counted by the
// watcher, each once, with the node's only GPU blamed.
func TestOOMWatchBetweenScrapes(t *testing.T) {
	logs := t.TempDir()
	uuid := gputest.UUID(0)
	backend, _ := gputest.NewSim(t, gputest.GPU(uuid, 48<<30))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "job", UID: "u-1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "train", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodFailed},
	}
	det, err := oom.NewDetector(oom.Config{PodLogsDir: logs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { det.Close() })
	e := New(Config{GPU: backend, Pods: pods.NewStatic([]*corev1.Pod{pod}), OOM: det})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e)
	if _, err := reg.Gather(); err != nil { // learns the node's GPU
		t.Fatal(err)
	}
	ctx := context.Background()
	e.watchOnce(ctx) // baseline: nothing yet

	dir := filepath.Join(logs, "ml_job_u-1", "train")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	line := func(n int) string {
		return time.Now().UTC().Format(time.RFC3339Nano) + " stderr F torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (run " + strconv.Itoa(n) + ")\n"
	}
	for n := 0; n < 3; n++ {
		f := filepath.Join(dir, strconv.Itoa(n)+".log")
		if err := os.WriteFile(f, []byte(line(n)), 0o644); err != nil {
			t.Fatal(err)
		}
		e.watchOnce(ctx)
		// The kubelet removes the dead instance's log before any scrape.
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP gpuslice_gpu_oom_events_total ` + oomEvents.help + `
# TYPE gpuslice_gpu_oom_events_total counter
gpuslice_gpu_oom_events_total{container="train",gpu="0",kind="device",namespace="ml",pod="job",source="log",uuid="` + uuid + `"} 3
gpuslice_gpu_oom_events_total{container="train",gpu="0",kind="device",namespace="ml",pod="job",source="termination",uuid="` + uuid + `"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpuslice_gpu_oom_events_total"); err != nil {
		t.Fatal(err)
	}
}

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
	wantTrainCounts(t, reg, uuid, 3, 0)
}

// wantTrainCounts checks ml/job's train container's device OOM counters
// on GPU uuid, by source.
func wantTrainCounts(t *testing.T, reg prometheus.Gatherer, uuid string, log, term int) {
	t.Helper()
	want := `
# HELP gpuslice_gpu_oom_events_total ` + oomEvents.help + `
# TYPE gpuslice_gpu_oom_events_total counter
gpuslice_gpu_oom_events_total{container="train",gpu="0",kind="device",namespace="ml",pod="job",source="log",uuid="` + uuid + `"} ` + strconv.Itoa(log) + `
gpuslice_gpu_oom_events_total{container="train",gpu="0",kind="device",namespace="ml",pod="job",source="termination",uuid="` + uuid + `"} ` + strconv.Itoa(term) + `
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpuslice_gpu_oom_events_total"); err != nil {
		t.Fatal(err)
	}
}

// TestOOMInCrashLoopBackOffCountedOnce: run 1 of a container OOMs; its log
// (1.log) counts it. In back-off the kubelet moves run 1 itself into
// lastState and keeps restartCount at 1 (kubelet_pods.go's Waiting
// override), so its termination, quoting the same OOM, is run 1's and not
// a second event (filed as run 0, it counted again). While the container
// runs again, lastState is the run before restartCount.
func TestOOMInCrashLoopBackOffCountedOnce(t *testing.T) {
	logs := t.TempDir()
	uuid := gputest.UUID(0)
	backend, _ := gputest.NewSim(t, gputest.GPU(uuid, 48<<30))
	const oomLine = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "job", UID: "u-1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "train", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
	}
	det, err := oom.NewDetector(oom.Config{PodLogsDir: logs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { det.Close() })
	// Run 0 ended with an error that is not an OOM; run 1 runs.
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "train", RestartCount: 1, ContainerID: "containerd://b",
		State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ContainerID: "containerd://a", Reason: "Error", ExitCode: 1, FinishedAt: metav1.Now()}},
	}}}
	e := New(Config{GPU: backend, Pods: pods.NewStatic([]*corev1.Pod{pod}), OOM: det})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e)
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	e.watchOnce(ctx)

	dir := filepath.Join(logs, "ml_job_u-1", "train")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "1.log"), []byte(time.Now().UTC().Format(time.RFC3339Nano)+" stderr F "+oomLine+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.watchOnce(ctx)
	// Run 1 died; back-off.
	pod.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	pod.Status.ContainerStatuses[0].LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ContainerID: "containerd://b", Reason: "Error", ExitCode: 1, Message: oomLine + "\n", FinishedAt: metav1.Now()}}
	e.watchOnce(ctx)
	wantTrainCounts(t, reg, uuid, 1, 0)

	// Instances as filed: back-off names run 1; running again (run 2),
	// lastState is run 1.
	c := oom.Container{Namespace: "ml", Pod: "job", PodUID: "u-1", Container: "train"}
	if terms := appendTerminations(nil, c, pod); len(terms) != 1 || terms[0].Instance != 1 {
		t.Errorf("back-off: terminations %+v, want run 1's", terms)
	}
	pod.Status.ContainerStatuses[0].RestartCount = 2
	pod.Status.ContainerStatuses[0].ContainerID = "containerd://c"
	pod.Status.ContainerStatuses[0].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	if terms := appendTerminations(nil, c, pod); len(terms) != 1 || terms[0].Instance != 1 {
		t.Errorf("running again: terminations %+v, want run 1's", terms)
	}
}

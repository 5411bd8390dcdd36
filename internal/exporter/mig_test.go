package exporter

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/dashboards/metricnames"
	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/pods"
)

// staticKubelet answers PodResources from fixed lists.
type staticKubelet struct {
	list        []podresources.Allocation
	allocatable []podresources.Allocatable
}

func (k staticKubelet) List(context.Context) ([]podresources.Allocation, error) {
	return k.list, nil
}

func (k staticKubelet) Allocatable(context.Context) ([]podresources.Allocatable, error) {
	return k.allocatable, nil
}

// TestMIGSeries runs the exporter over an A100 in MIG mode under NVIDIA's
// mixed strategy, one MIG device time-sliced: allocations count on the
// physical GPU, each MIG device reports its own memory, and each
// container's memory shows per GPU and per MIG device.
func TestMIGSeries(t *testing.T) {
	const (
		mig1 = "MIG-4ec5b3ae-5a4c-5c4f-a8a5-9d0f3e8e6b11"
		mig2 = "MIG-c6d4f1f9-1ba4-5a9e-8e1f-6b3a7e9d2c22"
		gib  = uint64(1) << 30
	)
	uuid := gputest.UUID(0)
	g := gputest.GPU(uuid, 40*gib,
		gpu.Process{PID: 101, UsedMemoryBytes: 4 * gib, InMIG: true, GPUInstanceID: 1, ComputeInstanceID: 0},
		gpu.Process{PID: 102, UsedMemoryBytes: 1 * gib, InMIG: true, GPUInstanceID: 2, ComputeInstanceID: 0},
	).WithMIG(
		gpu.MIGDevice{Index: 0, UUID: mig1, Name: "NVIDIA A100-SXM4-40GB MIG 3g.20gb", GPUInstanceID: 1, ComputeInstanceID: 0,
			MemoryTotalBytes: 20 * gib, MemoryUsedBytes: 4 * gib, HasMemory: true},
		// Memory not given: no memory series, never a 0.
		gpu.MIGDevice{Index: 1, UUID: mig2, Name: "NVIDIA A100-SXM4-40GB MIG 2g.10gb", GPUInstanceID: 2, ComputeInstanceID: 0},
	)
	fake := gputest.NewFake(g)

	procfs := t.TempDir()
	var podList []*corev1.Pod
	for i, name := range []string{"train", "infer"} {
		pid := 101 + i
		uid := fmt.Sprintf("0a1b2c3d-0000-4000-8000-00000000000%d", i)
		cid := fmt.Sprintf("%064d", pid)
		dir := filepath.Join(procfs, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cg := "0::/kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-" + cid + ".scope\n"
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: types.UID(uid)}}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", ContainerID: "containerd://" + cid}}
		podList = append(podList, p)
	}
	kubelet := staticKubelet{
		list: []podresources.Allocation{
			{Namespace: "ml", Pod: "train", Container: "main", Resource: "nvidia.com/mig-3g.20gb", DeviceIDs: []string{mig1}},
			{Namespace: "ml", Pod: "infer", Container: "main", Resource: "nvidia.com/mig-2g.10gb", DeviceIDs: []string{mig2 + "::0", mig2 + "::2"}},
		},
		allocatable: []podresources.Allocatable{
			{Resource: "nvidia.com/mig-3g.20gb", DeviceIDs: []string{mig1}},
			{Resource: "nvidia.com/mig-2g.10gb", DeviceIDs: []string{mig2 + "::0", mig2 + "::1", mig2 + "::2", mig2 + "::3"}},
		},
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(New(Config{GPU: fake, Kubelet: kubelet, Pods: pods.NewStatic(podList), Procfs: procfs}))

	allocations := `
# HELP gpuslice_container_gpu_allocation Replica IDs of the GPU that the container holds.
# TYPE gpuslice_container_gpu_allocation gauge
gpuslice_container_gpu_allocation{container="main",gpu="0",namespace="ml",pod="infer",resource="nvidia.com/mig-2g.10gb",uuid="` + uuid + `"} 2
gpuslice_container_gpu_allocation{container="main",gpu="0",namespace="ml",pod="train",resource="nvidia.com/mig-3g.20gb",uuid="` + uuid + `"} 1
# HELP gpuslice_container_mig_allocation Replica IDs of the MIG device that the container holds (1 for a MIG device that is not time-sliced); the resource is on gpuslice_container_gpu_allocation.
# TYPE gpuslice_container_mig_allocation gauge
gpuslice_container_mig_allocation{container="main",gpu="0",mig_uuid="` + mig2 + `",namespace="ml",pod="infer",uuid="` + uuid + `"} 2
gpuslice_container_mig_allocation{container="main",gpu="0",mig_uuid="` + mig1 + `",namespace="ml",pod="train",uuid="` + uuid + `"} 1
# HELP gpuslice_gpu_replicas Replica IDs of the GPU that the kubelet can allocate, per resource (1 for an unshared GPU).
# TYPE gpuslice_gpu_replicas gauge
gpuslice_gpu_replicas{gpu="0",resource="nvidia.com/mig-2g.10gb",uuid="` + uuid + `"} 4
gpuslice_gpu_replicas{gpu="0",resource="nvidia.com/mig-3g.20gb",uuid="` + uuid + `"} 1
# HELP gpuslice_gpu_replicas_allocated Replica IDs of the GPU allocated to containers, per resource.
# TYPE gpuslice_gpu_replicas_allocated gauge
gpuslice_gpu_replicas_allocated{gpu="0",resource="nvidia.com/mig-2g.10gb",uuid="` + uuid + `"} 2
gpuslice_gpu_replicas_allocated{gpu="0",resource="nvidia.com/mig-3g.20gb",uuid="` + uuid + `"} 1
`
	allocationMetrics := []string{"gpuslice_container_gpu_allocation", "gpuslice_container_mig_allocation",
		"gpuslice_gpu_replicas", "gpuslice_gpu_replicas_allocated"}
	want := allocations + `
# HELP gpuslice_container_gpu_memory_used_bytes GPU memory used by the container's processes on this physical GPU, counted once however many replica IDs it holds.
# TYPE gpuslice_container_gpu_memory_used_bytes gauge
gpuslice_container_gpu_memory_used_bytes{container="main",gpu="0",namespace="ml",pod="infer",uuid="` + uuid + `"} 1.073741824e+09
gpuslice_container_gpu_memory_used_bytes{container="main",gpu="0",namespace="ml",pod="train",uuid="` + uuid + `"} 4.294967296e+09
# HELP gpuslice_container_mig_memory_used_bytes GPU memory used by the container's processes in the MIG device's instance.
# TYPE gpuslice_container_mig_memory_used_bytes gauge
gpuslice_container_mig_memory_used_bytes{container="main",gpu="0",mig_uuid="` + mig2 + `",namespace="ml",pod="infer",uuid="` + uuid + `"} 1.073741824e+09
gpuslice_container_mig_memory_used_bytes{container="main",gpu="0",mig_uuid="` + mig1 + `",namespace="ml",pod="train",uuid="` + uuid + `"} 4.294967296e+09
# HELP gpuslice_mig_info Information about a MIG device of a MIG-enabled GPU; always 1.
# TYPE gpuslice_mig_info gauge
gpuslice_mig_info{compute_instance="0",gpu="0",gpu_instance="1",mig_uuid="` + mig1 + `",name="NVIDIA A100-SXM4-40GB MIG 3g.20gb",uuid="` + uuid + `"} 1
gpuslice_mig_info{compute_instance="0",gpu="0",gpu_instance="2",mig_uuid="` + mig2 + `",name="NVIDIA A100-SXM4-40GB MIG 2g.10gb",uuid="` + uuid + `"} 1
# HELP gpuslice_mig_memory_total_bytes Memory of the MIG device's GPU instance, its hardware share of the GPU's.
# TYPE gpuslice_mig_memory_total_bytes gauge
gpuslice_mig_memory_total_bytes{gpu="0",mig_uuid="` + mig1 + `",uuid="` + uuid + `"} 2.147483648e+10
# HELP gpuslice_mig_memory_used_bytes Memory in use in the MIG device's GPU instance, by any process.
# TYPE gpuslice_mig_memory_used_bytes gauge
gpuslice_mig_memory_used_bytes{gpu="0",mig_uuid="` + mig1 + `",uuid="` + uuid + `"} 4.294967296e+09
`
	metrics := append(slices.Clone(allocationMetrics), "gpuslice_container_gpu_memory_used_bytes",
		"gpuslice_container_mig_memory_used_bytes", "gpuslice_mig_info", "gpuslice_mig_memory_total_bytes", "gpuslice_mig_memory_used_bytes")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), metrics...); err != nil {
		t.Error(err)
	}
	// The new families follow Prometheus' naming rules.
	text, err := testutil.CollectAndFormat(reg, expfmt.TypeTextPlain)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("promtool", "check", "metrics")
	cmd.Stdin = bytes.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
	// Every MIG family is in the list the dashboards are checked against.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.Contains(mf.GetName(), "mig") && !slices.Contains(metricnames.ExporterMIG, mf.GetName()) {
			t.Errorf("%s is not in dashboards/metricnames.ExporterMIG", mf.GetName())
		}
	}

	// The GPU's reading fails: its MIG devices are not listed now, but the
	// allocations on them still count on it, under the same labels.
	fake.Set(g.WithError("GPU is lost"))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(allocations), allocationMetrics...); err != nil {
		t.Errorf("with the GPU reading failed: %v", err)
	}
}

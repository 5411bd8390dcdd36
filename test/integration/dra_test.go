package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/test/simnode"
)

const draDriver = "gpu.nvidia.com"

// gpuDevice is a device as NVIDIA's DRA driver publishes a whole GPU.
func gpuDevice(name, uuid string) resourcev1.Device {
	s := func(v string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: &v} }
	return resourcev1.Device{Name: name, Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		"type": s("gpu"), "uuid": s(uuid), "productName": s("NVIDIA RTX A6000"),
	}}
}

// allocatedClaim creates a ResourceClaim and allocates it to one device the
// way the scheduler does (status.allocation), and returns its devices as the
// kubelet lists them in PodResources once a pod runs with it.
func allocatedClaim(t *testing.T, c kubernetes.Interface, ns, name, pool, device string) []podresources.ClaimDevice {
	t.Helper()
	ctx := context.Background()
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: draDriver},
		}}}},
	}
	created, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating ResourceClaim %s/%s: %v", ns, name, err)
	}
	created.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
		Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: draDriver, Pool: pool, Device: device}},
	}}
	got, err := c.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("allocating ResourceClaim %s/%s: %v", ns, name, err)
	}
	var out []podresources.ClaimDevice
	for _, r := range got.Status.Allocation.Devices.Results {
		out = append(out, podresources.ClaimDevice{ClaimNamespace: ns, ClaimName: name, Driver: r.Driver, Pool: r.Pool, Device: r.Device})
	}
	return out
}

// TestExporterDRA: GPUs allocated by DRA ResourceClaims (real ResourceSlice
// and ResourceClaim objects in a real API server) are attributed to their
// pods through the kubelet's dynamic_resources, two pods sharing one claim
// included; a GPU whose slice appears later is attributed once the
// exporter's ResourceSlice watch sees it.
func TestExporterDRA(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const node = "dra-node"
	n, err := simnode.New(node, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	g0, g1 := simnode.GPUUUID(node, 0), simnode.GPUUUID(node, 1)
	n.GPUs = []*simnode.GPU{
		{UUID: g0, MemoryBytes: simnode.A6000Bytes, Utilization: 0.5},
		{UUID: g1, MemoryBytes: simnode.A6000Bytes, Utilization: 0.2},
	}
	n.Pods = []*simnode.Pod{
		{Namespace: "ml", Name: "infer-a", Containers: []*simnode.Container{{Name: "srv",
			Processes: []simnode.Process{{PID: 101, GPU: g0, MemoryBytes: 4 << 30, SM: 0.2}}}}},
		{Namespace: "ml", Name: "infer-b", Containers: []*simnode.Container{{Name: "srv",
			Processes: []simnode.Process{{PID: 201, GPU: g0, MemoryBytes: 2 << 30, SM: 0.1}}}}},
		{Namespace: "ml", Name: "train", Containers: []*simnode.Container{{Name: "main",
			Processes: []simnode.Process{{PID: 301, GPU: g1, MemoryBytes: 8 << 30, SM: 0.6}}}}},
		{Namespace: "ml", Name: "infer-c", Containers: []*simnode.Container{{Name: "srv"}}},
	}
	env.CreateNamespace(t, "ml")

	// The driver has published gpu-0 only so far.
	nodeName := node
	slice := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.nvidia.com"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: draDriver, NodeName: &nodeName,
			Pool:    resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{gpuDevice("gpu-0", g0)},
		},
	}
	if slice, err = env.Client.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Another node's slice names the same device: not this node's GPU.
	other := "other-node"
	if _, err := env.Client.ResourceV1().ResourceSlices().Create(ctx, &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "other-gpu.nvidia.com"},
		Spec: resourcev1.ResourceSliceSpec{Driver: draDriver, NodeName: &other,
			Pool:    resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{gpuDevice("gpu-1", simnode.GPUUUID(other, 1))}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	shared := allocatedClaim(t, env.Client, "ml", "shared-gpu", node, "gpu-0")
	n.Pods[0].Containers[0].Claims = shared
	n.Pods[1].Containers[0].Claims = shared
	n.Pods[3].Containers[0].Claims = shared
	n.Pods[2].Containers[0].Claims = allocatedClaim(t, env.Client, "ml", "train-gpu", node, "gpu-1")
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Register(ctx, env.Client); err != nil {
		t.Fatal(err)
	}

	// The exporter runs with only the rights of deploy/rbac/exporter.yaml.
	env.CreateNamespace(t, "gpuslice")
	env.Apply(t, filepath.Join("..", "..", "deploy", "rbac", "exporter.yaml"))
	sa := env.KubeconfigAs(t, t.TempDir(), "system:serviceaccount:gpuslice:gpuslice-exporter")
	addr := startSimExporter(t, env, n, "--kubeconfig="+sa)
	var m metrics
	expect := func(name string, labels map[string]string, want float64) string {
		got, ok := m.value(name, labels)
		if !ok || got != want {
			return fmt.Sprintf("%s%v = %v (found %v), want %v\n%s", name, labels, got, ok, want, m.dump(name))
		}
		return ""
	}
	ctr := func(pod, c, uuid string) map[string]string {
		return map[string]string{"namespace": "ml", "pod": pod, "container": c, "uuid": uuid}
	}
	poll := func(what string, checks func() []string) {
		t.Helper()
		eventually(t, 20*time.Second, func() string {
			mfs, err := scrape("http://" + addr + "/metrics")
			if err != nil {
				return err.Error()
			}
			m = mfs
			for _, c := range checks() {
				if c != "" {
					return what + ": " + c
				}
			}
			return ""
		})
	}
	alloc := func(pod, c, uuid string) map[string]string {
		l := ctr(pod, c, uuid)
		l["resource"] = draDriver
		return l
	}
	poll("the shared claim's GPU attributed to both pods", func() []string {
		return []string{
			expect("gpuslice_exporter_collect_success", map[string]string{"collector": "podresources"}, 1),
			expect("gpuslice_container_gpu_allocation", alloc("infer-a", "srv", g0), 1),
			expect("gpuslice_container_gpu_allocation", alloc("infer-b", "srv", g0), 1),
			expect("gpuslice_container_gpu_memory_used_bytes", ctr("infer-a", "srv", g0), 4*gib),
			expect("gpuslice_container_gpu_memory_used_bytes", ctr("infer-b", "srv", g0), 2*gib),
			// One device, however many pods share its claim.
			expect("gpuslice_gpu_replicas_allocated", map[string]string{"uuid": g0, "resource": draDriver}, 1),
		}
	})
	if c := m.count("gpuslice_container_gpu_allocation", map[string]string{"pod": "train"}); c != 0 {
		t.Fatalf("train's GPU is in no slice of this node yet, but it has %d allocation series:\n%s", c, m.dump("gpuslice_container_gpu_allocation"))
	}

	// A CUDA OOM in a pod on the shared claim counts against its GPU. The
	// pod failed while loading, before any process of it showed on the
	// GPU: only the claim tells which GPU it had.
	if err := n.AppendLog(n.Pods[3], n.Pods[3].Containers[0], "loading model", simnode.PyTorchOOM); err != nil {
		t.Fatal(err)
	}
	poll("OOM on the claim's GPU", func() []string {
		return []string{expect("gpuslice_gpu_oom_events_total", map[string]string{"pod": "infer-c", "uuid": g0, "source": "log", "kind": "device"}, 1)}
	})

	// The driver publishes gpu-1: a new pool generation.
	slice.Spec.Pool.Generation = 2
	slice.Spec.Devices = append(slice.Spec.Devices, gpuDevice("gpu-1", g1))
	if _, err := env.Client.ResourceV1().ResourceSlices().Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the later GPU attributed", func() []string {
		return []string{
			expect("gpuslice_container_gpu_allocation", alloc("train", "main", g1), 1),
			expect("gpuslice_container_gpu_memory_used_bytes", ctr("train", "main", g1), 8*gib),
			expect("gpuslice_container_gpu_allocation", alloc("infer-a", "srv", g0), 1),
		}
	})
}

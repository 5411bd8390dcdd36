package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/test/simnode"
)

const gib = float64(simnode.GiB)

// TestExporterOnSimulatedNode runs gpuslice-exporter as a process on the
// simulated node, with pods in a real kube-apiserver (the default
// --pods.source=apiserver informer) and a fake kubelet over a real unix
// socket, and walks through the scenarios of a shared GPU node.
func TestExporterOnSimulatedNode(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	n, err := simnode.New("gpu-node-1", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	g0, g1 := simnode.GPUUUID("gpu-node-1", 0), simnode.GPUUUID("gpu-node-1", 1)
	n.GPUs = []*simnode.GPU{
		{UUID: g0, MemoryBytes: simnode.A6000Bytes, Replicas: 6, Utilization: 0.5, Temperature: 60, PowerWatts: 150},
		{UUID: g1, MemoryBytes: simnode.A6000Bytes, Replicas: 4, Utilization: 0.2, Temperature: 55, PowerWatts: 90,
			HostProcesses: []simnode.Process{{PID: 900, GPU: g1, MemoryBytes: 512 << 20, SM: 0.01}, {PID: 777, GPU: g1, MemoryBytes: 2 << 30}}},
	}
	n.Pods = []*simnode.Pod{
		{Namespace: "ml", Name: "train-a", Containers: []*simnode.Container{{Name: "main",
			Replicas:  map[string][]int{g0: {0, 1}},
			Processes: []simnode.Process{{PID: 101, GPU: g0, MemoryBytes: 4 << 30, SM: 0.4}}}}},
		{Namespace: "ml", Name: "train-b", Containers: []*simnode.Container{{Name: "main",
			Replicas: map[string][]int{g0: {2, 3}},
			Processes: []simnode.Process{
				{PID: 201, GPU: g0, MemoryBytes: 2 << 30, SM: 0.1},
				{PID: 202, GPU: g0, MemoryBytes: 1 << 30, SM: 0.05}}}}},
		{Namespace: "media", Name: "wide", Containers: []*simnode.Container{{Name: "enc",
			Replicas: map[string][]int{g0: {4}, g1: {0}},
			Processes: []simnode.Process{
				{PID: 301, GPU: g0, MemoryBytes: 1 << 30, SM: 0.1},
				{PID: 301, GPU: g1, MemoryBytes: 3 << 30, SM: 0.2}}}}},
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Register(ctx, env.Client); err != nil {
		t.Fatal(err)
	}
	// PID 777 is listed by the GPU but exits before /proc is read.
	if err := os.RemoveAll(filepath.Join(n.Procfs(), "777")); err != nil {
		t.Fatal(err)
	}

	url := "http://" + startSimExporter(t, env, n) + "/metrics"
	var m metrics
	poll := func(t *testing.T, what string, cond func(metrics) string) {
		t.Helper()
		eventually(t, 20*time.Second, func() string {
			mfs, err := scrape(url)
			if err != nil {
				return err.Error()
			}
			m = mfs
			if msg := cond(m); msg != "" {
				return what + ": " + msg
			}
			return ""
		})
	}
	expect := func(name string, labels map[string]string, want float64) string {
		got, ok := m.value(name, labels)
		if !ok || got != want {
			return fmt.Sprintf("%s%v = %v (found %v), want %v\n%s", name, labels, got, ok, want, m.dump(name))
		}
		return ""
	}
	all := func(checks ...string) string {
		for _, c := range checks {
			if c != "" {
				return c
			}
		}
		return ""
	}
	ctr := func(ns, pod, c, uuid string) map[string]string {
		return map[string]string{"namespace": ns, "pod": pod, "container": c, "uuid": uuid}
	}
	success := func(collector string, want float64) string {
		return expect("gpuslice_exporter_collect_success", map[string]string{"collector": collector}, want)
	}

	t.Run("attribution", func(t *testing.T) {
		poll(t, "every collector healthy and pods named", func(m metrics) string {
			return all(
				success("gpu", 1), success("podresources", 1), success("pods", 1), success("procfs", 1), success("oom", 1),
				// Two replica IDs each, memory counted once.
				expect("gpuslice_container_gpu_memory_used_bytes", ctr("ml", "train-a", "main", g0), 4*gib),
				expect("gpuslice_container_gpu_allocation", ctr("ml", "train-a", "main", g0), 2),
				// Two processes in one container.
				expect("gpuslice_container_gpu_memory_used_bytes", ctr("ml", "train-b", "main", g0), 3*gib),
				expect("gpuslice_container_gpu_processes", ctr("ml", "train-b", "main", g0), 2),
				// A pod on two GPUs.
				expect("gpuslice_container_gpu_memory_used_bytes", ctr("media", "wide", "enc", g0), 1*gib),
				expect("gpuslice_container_gpu_memory_used_bytes", ctr("media", "wide", "enc", g1), 3*gib),
				// The host process and the vanished one (listed by the GPU
				// reading, so in its used memory) are unattributed.
				expect("gpuslice_unattributed_gpu_memory_used_bytes", map[string]string{"uuid": g1}, 2.5*gib),
				expect("gpuslice_unattributed_gpu_memory_used_bytes", map[string]string{"uuid": g0}, 0),
				expect("gpuslice_gpu_replicas", map[string]string{"uuid": g0, "resource": "nvidia.com/gpu"}, 6),
				expect("gpuslice_gpu_replicas_allocated", map[string]string{"uuid": g0}, 5),
				expect("gpuslice_gpu_replicas_allocated", map[string]string{"uuid": g1}, 1),
			)
		})
	})

	t.Run("kubelet socket removed and back", func(t *testing.T) {
		n.PodResources().Stop()
		poll(t, "podresources collector fails, the scrape still answers", func(m metrics) string {
			if c := m.count("gpuslice_container_gpu_allocation", nil); c != 0 {
				return fmt.Sprintf("%d allocation series without a kubelet", c)
			}
			return all(success("podresources", 0), success("gpu", 1),
				expect("gpuslice_container_gpu_memory_used_bytes", ctr("ml", "train-a", "main", g0), 4*gib))
		})
		if err := n.PodResources().Restart(); err != nil {
			t.Fatal(err)
		}
		poll(t, "reconnected", func(m metrics) string {
			return all(success("podresources", 1), expect("gpuslice_container_gpu_allocation", ctr("ml", "train-a", "main", g0), 2))
		})
	})

	t.Run("CUDA OOM in a log counts once, also across rotation", func(t *testing.T) {
		p, _ := n.Pod("ml", "train-b")
		c := p.Containers[0]
		oomLabels := map[string]string{"namespace": "ml", "pod": "train-b", "container": "main", "uuid": g0, "source": "log", "kind": "device"}
		t0 := time.Now()
		if err := n.AppendLogAt(t0, p, c, "epoch 3 step 120", simnode.PyTorchOOM); err != nil {
			t.Fatal(err)
		}
		poll(t, "first OOM", func(m metrics) string { return expect("gpuslice_gpu_oom_events_total", oomLabels, 1) })
		// The kubelet rotates the log: the counted line now sits in the
		// rotated file and must not count again.
		rotated := n.LogFile(p, c) + "." + t0.UTC().Format("20060102-150405")
		if err := os.Rename(n.LogFile(p, c), rotated); err != nil {
			t.Fatal(err)
		}
		if err := n.AppendLogAt(t0.Add(time.Second), p, c, "resuming from checkpoint"); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			poll(t, "after rotation", func(m metrics) string { return expect("gpuslice_gpu_oom_events_total", oomLabels, 1) })
		}
		// A new OOM in the new file counts.
		if err := n.AppendLogAt(t0.Add(time.Minute), p, c, "RuntimeError: CUDA error: out of memory"); err != nil {
			t.Fatal(err)
		}
		poll(t, "second OOM", func(m metrics) string { return expect("gpuslice_gpu_oom_events_total", oomLabels, 2) })
	})

	t.Run("OOM from a termination message", func(t *testing.T) {
		p, _ := n.Pod("ml", "train-a")
		p.Containers[0].RestartCount = 1
		p.Containers[0].LastTermination = &corev1.ContainerStateTerminated{
			ExitCode: 1, Reason: "Error", FinishedAt: metav1.Now(),
			Message: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
		}
		if err := n.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := n.PushStatus(ctx, env.Client); err != nil {
			t.Fatal(err)
		}
		poll(t, "termination OOM", func(m metrics) string {
			return expect("gpuslice_gpu_oom_events_total", map[string]string{"pod": "train-a", "uuid": g0, "source": "termination", "kind": "device"}, 1)
		})
	})

	t.Run("an NVML error on one GPU keeps the other's series", func(t *testing.T) {
		n.GPUs[1].Error = "GPU is lost"
		if err := n.Sync(); err != nil {
			t.Fatal(err)
		}
		poll(t, "GPU 1 failing", func(m metrics) string {
			if c := m.count("gpuslice_gpu_memory_used_bytes", map[string]string{"uuid": g1}); c != 0 {
				return "the failing GPU still has a memory series"
			}
			return all(success("gpu", 0),
				expect("gpuslice_gpu_memory_used_bytes", map[string]string{"uuid": g0}, 8*gib),
				expect("gpuslice_container_gpu_memory_used_bytes", ctr("ml", "train-a", "main", g0), 4*gib))
		})
	})
}

// startSimExporter runs gpuslice-exporter on the simulated node, its pods
// from the API server, and returns its address. args come last and so
// override the defaults (a flag given twice keeps its last value).
func startSimExporter(t *testing.T, env *testenv.Env, n *simnode.Node, args ...string) string {
	t.Helper()
	addr := freeAddr(t)
	start(t, binary(t, "cmd/exporter"), append([]string{
		"--web.listen-address=" + addr,
		"--gpu.backend=sim", "--sim.file=" + n.SimFile(),
		"--path.procfs=" + n.Procfs(), "--path.pod-logs=" + n.PodLogs(),
		"--kubelet.pod-resources-socket=" + n.PodResourcesSocket(),
		"--pods.source=apiserver", "--kubeconfig=" + env.Kubeconfig(t, t.TempDir()), "--node-name=" + n.Name,
	}, args...)...)
	return addr
}

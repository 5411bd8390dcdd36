package realnode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpuslice/gpuslice/internal/testproc"
)

// simCDISpec is a CDI spec for the simulated GPU, in the shape nvidia-ctk
// cdi generate writes for a real one: a device per UUID and per index, the
// device "all", and common edits for what every GPU container needs (the
// driver's libnvidia-ml.so.1, here the simulated one at lib). The simulated
// GPU's "device node" is the driver directory plus the selection fakecuda
// reads (NVIDIA_VISIBLE_DEVICES); GPUSLICE_CDI_DEVICE tells which spec entry
// was applied. Each of extra ("HOSTPATH=CONTAINERPATH") is one more file
// mounted read-only into every GPU container, as the spec mounts the
// driver's programs (nvidia-smi, nvidia-cuda-mps-control, …) on a real node.
func simCDISpec(lib string, extra ...string) string {
	dev := func(name, visible string) string {
		return fmt.Sprintf("  - name: %q\n    containerEdits:\n      env: [NVIDIA_VISIBLE_DEVICES=%s, GPUSLICE_CDI_DEVICE=nvidia.com/gpu=%s]\n", name, visible, name)
	}
	return "cdiVersion: \"0.5.0\"\nkind: nvidia.com/gpu\ndevices:\n" + dev(gpuUUID, gpuUUID) + dev("0", gpuUUID) + dev("all", "all") +
		fmt.Sprintf("containerEdits:\n  mounts:\n    - {hostPath: %s, containerPath: %s, options: [rbind, ro]}\n", simGPUPath, simGPUPath) +
		fmt.Sprintf("    - {hostPath: %s, containerPath: %s, options: [ro, nosuid, nodev, bind]}\n", lib, nvmlContainerPath) +
		extraMounts(extra)
}

func extraMounts(extra []string) string {
	var b strings.Builder
	for _, m := range extra {
		host, ctr, _ := strings.Cut(m, "=")
		fmt.Fprintf(&b, "    - {hostPath: %s, containerPath: %s, options: [ro, nosuid, nodev, bind]}\n", host, ctr)
	}
	return b.String()
}

// nvmlContainerPath is where the NVIDIA container toolkit puts the driver's
// NVML in a container (Debian/Ubuntu layout), on the loader's search path.
const nvmlContainerPath = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"

// writeSimCDISpec puts simCDISpec in the node's CDI spec directory, as
// `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml` does on a GPU
// node, until the end of the test; extra as simCDISpec's.
func writeSimCDISpec(t *testing.T, extra ...string) {
	t.Helper()
	n := world.node
	if n.CDISpecDir == "" {
		t.Fatal("the node has no CDI runtime: NVIDIA's nvidia-container-runtime.cdi is not built (run `make test-bins`, which runs hack/nvidia-bins.sh)")
	}
	spec := filepath.Join(n.CDISpecDir, "gpuslice-sim.yaml")
	if err := os.WriteFile(spec, []byte(simCDISpec(nvmlLib(t), extra...)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(spec) })
}

// runtimeClass creates a RuntimeClass for the test.
func runtimeClass(t *testing.T, name, handler string) {
	t.Helper()
	if handler == "" {
		t.Fatalf("the node has no runtime handler for RuntimeClass %s: NVIDIA's nvidia-container-runtime.cdi is not built (run `make test-bins`, which runs hack/nvidia-bins.sh)", name)
	}
	ctx := context.Background()
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: handler}
	if _, err := world.node.Client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = world.node.Client.NodeV1().RuntimeClasses().Delete(ctx, name, metav1.DeleteOptions{}) })
}

// TestPluginCDIOnRealNode: gpuslice-plugin with deviceListStrategy
// cdi-annotations names the GPU as a CDI device; the real kubelet hands the
// annotation to containerd, which passes it to NVIDIA's container runtime
// in CDI mode (the nvidia-cdi handler), which applies the spec. The pod
// mounts nothing itself: the fake-CUDA process reaches the simulated driver
// only through the spec's mount and selection. deviceIDStrategy index,
// changed live, names the GPU "nvidia.com/gpu=0" for the next pod.
func TestPluginCDIOnRealNode(t *testing.T) {
	n := need(t)
	writeSimCDISpec(t)
	rcName := "nvidia-cdi"
	runtimeClass(t, rcName, n.CDIRuntimeHandler)

	cfg := filepath.Join(t.TempDir(), "config.yaml")
	writeCDIConfig := func(idStrategy string) {
		data := "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-annotations\n    deviceIDStrategy: " + idStrategy +
			"\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
		if err := os.WriteFile(cfg+".tmp", []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(cfg+".tmp", cfg); err != nil {
			t.Fatal(err)
		}
	}
	writeCDIConfig("uuid")
	_, addr := startPlugin(t, cfg)
	waitAllocatable(t, gpuRes, 2, 60*time.Second)

	run := func(name, cdiName string) {
		t.Helper()
		pod := fakeCUDAPod(name, podOpts{args: []string{"-memory", "0s=1Gi", "-print-env"}})
		pod.Spec.RuntimeClassName = &rcName
		pod.Spec.Volumes, pod.Spec.Containers[0].VolumeMounts = nil, nil
		p := waitRunning(t, createPod(t, pod).Name, 60*time.Second)
		waitLog(t, p, "cuda",
			"env GPUSLICE_CDI_DEVICE="+cdiName,
			"env NVIDIA_VISIBLE_DEVICES="+gpuUUID,
			fmt.Sprintf("env GPUSLICE_GPU_MEMORY_BUDGET_BYTES=%d", gpuTotal/2),
			"fakecuda: pid ")
		// What containerd gave the runtime, before the CDI edits: the
		// plugin's annotation and budget, and no NVIDIA_VISIBLE_DEVICES
		// (which NVIDIA's runtime would also take as a device request), so
		// the selection the container saw came from the spec alone.
		spec := criSpec(t, n.ContainerdSock, p.Status.ContainerStatuses[0].ContainerID)
		var requests []string
		for k, v := range spec.Annotations {
			if strings.HasPrefix(k, "cdi.k8s.io/gpuslice-plugin_") {
				requests = append(requests, v)
			}
		}
		if len(requests) != 1 || requests[0] != cdiName {
			t.Errorf("CDI annotations reaching the runtime: %q, want one of %q (annotations %v)", requests, cdiName, spec.Annotations)
		}
		for _, kv := range spec.Process.Env {
			if strings.HasPrefix(kv, "NVIDIA_VISIBLE_DEVICES=") {
				t.Errorf("the plugin set %s with only CDI strategies", kv)
			}
		}
	}
	run("cdi-uuid", "nvidia.com/gpu="+gpuUUID)

	writeCDIConfig("index")
	// The plugin applies a new config at once; its reload counter says when.
	testproc.Eventually(t, 20*time.Second, 200*time.Millisecond, func() string {
		body, err := scrape(addr)
		if err != nil {
			return err.Error()
		}
		if v, _ := sample(body, "gpuslice_plugin_reloads_total"); v != "2" {
			return fmt.Sprintf("gpuslice_plugin_reloads_total = %q, want 2 (the plugin has not read the new config)", v)
		}
		return ""
	})
	run("cdi-index", "nvidia.com/gpu=0")
}

// ociSpec is the part of a container's OCI spec the tests read.
type ociSpec struct {
	Process struct {
		Env []string `json:"env"`
	} `json:"process"`
	Mounts []struct {
		Destination string `json:"destination"`
	} `json:"mounts"`
	Annotations map[string]string `json:"annotations"`
}

// criSpec is the OCI spec containerd generated for a container (CRI
// ContainerStatus, verbose), as it went to the runtime handler.
func criSpec(t *testing.T, sock, containerID string) ociSpec {
	t.Helper()
	spec, _ := criContainer(t, sock, containerID)
	return spec
}

// criContainer is criSpec and the host PID of the container's process.
func criContainer(t *testing.T, sock, containerID string) (ociSpec, int) {
	t.Helper()
	conn := criConn(t, sock)
	_, id, _ := strings.Cut(containerID, "://")
	st, err := cri.NewRuntimeServiceClient(conn).ContainerStatus(context.Background(), &cri.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatalf("CRI ContainerStatus %s: %v", id, err)
	}
	var info struct {
		Pid         int     `json:"pid"`
		RuntimeSpec ociSpec `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		t.Fatalf("CRI ContainerStatus %s: info: %v", id, err)
	}
	return info.RuntimeSpec, info.Pid
}

// sandboxHandler is the runtime handler containerd runs the pod's sandbox
// with (the RuntimeClass's handler, or "" for the default runtime).
func sandboxHandler(t *testing.T, sock string, pod *corev1.Pod) string {
	t.Helper()
	resp, err := cri.NewRuntimeServiceClient(criConn(t, sock)).ListPodSandbox(context.Background(), &cri.ListPodSandboxRequest{
		Filter: &cri.PodSandboxFilter{
			State:         &cri.PodSandboxStateValue{State: cri.PodSandboxState_SANDBOX_READY},
			LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(pod.UID)},
		}})
	if err != nil {
		t.Fatalf("CRI ListPodSandbox: %v", err)
	}
	if len(resp.Items) != 1 {
		t.Fatalf("CRI ListPodSandbox: %d ready sandboxes of pod %s, want 1", len(resp.Items), pod.Name)
	}
	return resp.Items[0].RuntimeHandler
}

func criConn(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

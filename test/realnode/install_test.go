package realnode_test

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/internal/testproc"
	"github.com/gpuslice/gpuslice/test/realnode"
)

const (
	installNS = "gpuslice"
	release   = "gpuslice"
	// Ports of their own: the pods share the node's network namespace with
	// every other program on this machine.
	exporterPort = 19846
	tunerPort    = 19847
	pluginPort   = 19848
)

// installValues adapts the chart to this node, as a homelab user adapts it
// to theirs: the image imported into the node's containerd (never pulled),
// the kubelet's root dir, the NVML library and the GPU's device directory
// mounted as the NVIDIA container toolkit mounts them, and host networking
// with the API server's address in place of a pod network (this node has
// none). The tuner runs in plugin mode against gpuslice-plugin, in dry run.
func installValues(n *realnode.Node, lib string) string {
	api, _ := url.Parse(n.Config.Host)
	apiEnv := fmt.Sprintf(`
    - {name: KUBERNETES_SERVICE_HOST, value: %q}
    - {name: KUBERNETES_SERVICE_PORT, value: %q}`, api.Hostname(), api.Port())
	gpuEnv := apiEnv + fmt.Sprintf(`
    - {name: GPUSLICE_SIM_FILE, value: %q}`, simGPUPath+"/gpus.yaml")
	gpuVolumes := fmt.Sprintf(`
  extraVolumes:
    - {name: nvml, hostPath: {path: %q, type: File}}
    - {name: gpu, hostPath: {path: %q, type: Directory}}
  extraVolumeMounts:
    - {name: nvml, mountPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1, readOnly: true}
    - {name: gpu, mountPath: %q, readOnly: true}`, lib, simGPUPath, simGPUPath)
	return fmt.Sprintf(`image:
  pullPolicy: Never
kubeletRootDir: %q
devicePluginDir: %q
podLogsDir: %q
exporter:
  hostNetwork: true
  port: %d
  extraEnv:%s%s
plugin:
  enabled: true
  hostNetwork: true
  port: %d
  extraArgs: [--kubelet.pod-resources-interval=1s, --health.interval=1s]
  extraEnv:%s%s
tuner:
  hostNetwork: true
  port: %d
  mode: plugin
  extraEnv:%s
  config:
    dryRun: true
    interval: 1s
    apply: {verifyTimeout: 60s}
    policy:
      minReplicas: 2
      maxReplicas: 4
      window: 2m
      cooldown: 10m
      pressureWindow: 2s
      sampleInterval: 1s
`, n.KubeletRootDir, n.DevicePluginDir, n.PodLogsDir,
		exporterPort, gpuEnv, gpuVolumes,
		pluginPort, gpuEnv, gpuVolumes,
		tunerPort, apiEnv)
}

// helm runs the helm binary hack/helm.sh built against the node.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	bin := testproc.Hack(t, "helm.sh")
	// Not t.Context(): cleanups uninstall after it is cancelled.
	cmd := exec.CommandContext(context.Background(), bin, append(args, "--kubeconfig", world.node.Kubeconfig)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestHelmInstall installs deploy/helm/gpuslice on the real node with the
// image `make image` builds here, and runs the product from it: every
// program is a pod of the chart, under its ServiceAccount and the chart's
// RBAC (the API server runs ServiceAccount admission and RBAC). The exporter
// reads the GPU through libnvidia-ml and attributes fake-CUDA pods;
// gpuslice-plugin registers with the kubelet from its container; a real
// Prometheus discovers the exporter as the chart's PodMonitor does and fires
// GPUSliceOOM on a real OOM; the tuner first only records what it would do,
// then, after `helm upgrade` turns dry run off, applies; a further upgrade
// keeps what the tuner wrote; uninstall leaves the node's labels.
func TestHelmInstall(t *testing.T) {
	n := need(t)
	ctx := context.Background()
	lib := nvmlLib(t)
	testproc.Hack(t, "helm.sh")

	// 1. The image, as `make image image-import` makes it.
	tar := filepath.Join(t.TempDir(), "gpuslice.tar")
	build := exec.CommandContext(ctx, "bash", filepath.Join(realnode.Repo(), "hack", "image.sh"), tar)
	build.Dir = realnode.Repo()
	out, err := build.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/image.sh: %v\n%s", err, out)
	}
	var image string
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "IMAGE="); ok {
			image = v
		}
	}
	if image == "" {
		t.Fatalf("hack/image.sh printed no IMAGE=:\n%s", out)
	}
	if out, err := exec.CommandContext(ctx, "ctr", "--address", n.ContainerdSock, "-n", "k8s.io", "images", "import", tar).CombinedOutput(); err != nil {
		t.Fatalf("importing %s: %v\n%s", image, err, out)
	}

	// 2. The node as the README's walk-through leaves it: labelled as a GPU node.
	labelNode(t, "nvidia.com/gpu.present", "true")
	t.Cleanup(func() { labelNode(t, "nvidia.com/gpu.present", "") })
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(installValues(n, lib)), 0o644); err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(realnode.Repo(), "deploy", "helm", "gpuslice")
	helm(t, "install", release, chart, "-n", installNS, "--create-namespace", "-f", values, "--wait", "--timeout", "4m")
	uninstalled := false
	t.Cleanup(func() {
		if t.Failed() {
			logInstalledPods(t)
		}
		if !uninstalled {
			helm(t, "uninstall", release, "-n", installNS, "--wait", "--timeout", "2m")
		}
		// What uninstall keeps on purpose (the label, the tuner's record)
		// would hold the next test's tuner in its cooldown.
		untuneNode(t)
		waitAllocatable(t, gpuRes, 0, 60*time.Second)
	})

	pods := installedPods(t)
	for comp, sa := range map[string]string{"exporter": "gpuslice-exporter", "plugin": "gpuslice-plugin", "tuner": "gpuslice-tuner"} {
		p, ok := pods[comp]
		if !ok {
			t.Fatalf("no running %s pod; have %v", comp, pods)
		}
		if p.Spec.ServiceAccountName != sa {
			t.Errorf("%s runs as ServiceAccount %q, want the chart's %s", comp, p.Spec.ServiceAccountName, sa)
		}
		if c := p.Spec.Containers[0]; c.Image != image {
			t.Errorf("%s runs image %s, want the one built here, %s", comp, c.Image, image)
		}
	}

	// 3. gpuslice-plugin registered from its container: the chart's default
	// config advertises 4 replicas of the one GPU.
	waitAllocatable(t, gpuRes, 4, 90*time.Second)

	// 4. A real Prometheus scrapes the exporter and the tuner as the chart's
	// PodMonitors select them: the release's pods of each component, their
	// container port named metrics, the node name as label node. (Debian's
	// Prometheus has no kubernetes_sd, so the test discovers the pods through
	// the API the same way and writes static targets.)
	target := func(comp string) string {
		p := pods[comp]
		for _, c := range p.Spec.Containers {
			for _, port := range c.Ports {
				if port.Name == "metrics" {
					return fmt.Sprintf(`
  - job_name: %s/gpuslice-%s
    static_configs:
      - targets: ["%s:%d"]
        labels: {node: %q}
`, installNS, comp, p.Status.PodIP, port.ContainerPort, p.Spec.NodeName)
				}
			}
		}
		t.Fatalf("%s pod %s has no container port named metrics", comp, p.Name)
		return ""
	}
	prom := runPrometheus(t, target("exporter")+target("tuner"), fmt.Sprintf(`up{job="%s/gpuslice-exporter",node=%q}`, installNS, n.Name))

	// 5. Attribution: the exporter in its pod sees the GPU through
	// libnvidia-ml and maps a fake-CUDA pod's host PID to the pod.
	createPod(t, fakeCUDAPod("inst-a1", podOpts{args: []string{"-memory", "0s=20Gi", "-quiet"}}))
	waitRunning(t, "inst-a1", 60*time.Second)
	testproc.Eventually(t, 60*time.Second, 500*time.Millisecond, func() string {
		q := fmt.Sprintf(`gpuslice_container_gpu_memory_used_bytes{namespace=%q,pod="inst-a1",container="cuda",uuid=%q,node=%q}`, namespace, gpuUUID, n.Name)
		v, msg := prom.query(q)
		if msg != "" || int64(v) != 20*gib {
			return fmt.Sprintf("%s = %v %s", q, v, msg)
		}
		return ""
	})

	// 6. A real OOM: a second pod grows past what a1 left. The exporter
	// counts it from /var/log/pods, GPUSliceOOM fires, and the tuner, in dry
	// run, only records that it would lower the replicas.
	// It holds 26 GiB next to a1's 20 (46 of 48: a full GPU) long enough for
	// the tuner's samples, then fails to grow: an OOM the policy lowers for,
	// unlike one with most of the GPU free (issue 9's proportionate policy).
	fullGPU := []string{"-memory", "0s=1Gi,3s=26Gi,15s=30Gi", "-quiet"}
	createPod(t, fakeCUDAPod("inst-oom1", podOpts{restart: corev1.RestartPolicyNever, args: fullGPU}))
	testproc.Eventually(t, 90*time.Second, 500*time.Millisecond, func() string {
		_, msg := prom.firing("GPUSliceOOM", map[string]string{"node": n.Name, "pod": "inst-oom1", "container": "cuda"})
		return msg
	})
	testproc.Eventually(t, 60*time.Second, 500*time.Millisecond, func() string { return nodeEvent(t, "ReplicasLowered", "would be lowered", "4 -> 2") })
	if l := configLabel(t); l != "" {
		t.Errorf("in dry run the tuner labelled the node %s=%q", configLbl, l)
	}
	if got := allocatable(t, gpuRes); got != 4 {
		t.Errorf("in dry run the allocatable count changed to %d", got)
	}
	if v, msg := prom.query(`gpuslice_tuner_leader`); msg != "" || v != 1 {
		t.Errorf("gpuslice_tuner_leader = %v %s, want 1 (its Lease under the chart's Role)", v, msg)
	}

	// 7. helm upgrade: dry run off. The tuner's pod rolls; the next OOM
	// makes it lower the count for real, through the plugin's ConfigMap and
	// the node's label, which only its RBAC allows.
	helm(t, "upgrade", release, chart, "-n", installNS, "--reuse-values", "--set", "tuner.config.dryRun=false", "--wait", "--timeout", "3m")
	waitRolled(t, "tuner")
	// Two replicas were allocated at the OOM (a1's and oom2's): the policy
	// lowers to one less, held at minReplicas 2.
	createPod(t, fakeCUDAPod("inst-oom2", podOpts{restart: corev1.RestartPolicyNever, args: fullGPU}))
	testproc.Eventually(t, 90*time.Second, 500*time.Millisecond, func() string {
		if l := configLabel(t); l != "gpuslice-2" {
			return fmt.Sprintf("node label %s=%q, want gpuslice-2 after the OOM", configLbl, l)
		}
		return ""
	})
	waitAllocatable(t, gpuRes, 2, 60*time.Second)

	// 8. An upgrade that changes nothing the tuner owns keeps its state:
	// the named config it added, the label, the lowered count, the pod.
	helm(t, "upgrade", release, chart, "-n", installNS, "--reuse-values", "--set", "exporter.log.level=debug", "--wait", "--timeout", "3m")
	cm, err := n.Client.CoreV1().ConfigMaps(installNS).Get(ctx, "gpuslice-plugin-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cm.Data["gpuslice-2"]; !ok {
		t.Errorf("after helm upgrade the plugin ConfigMap lost the tuner's gpuslice-2 config: keys %v", slices.Sorted(maps.Keys(cm.Data)))
	}
	if l := configLabel(t); l != "gpuslice-2" {
		t.Errorf("after helm upgrade the node label is %q, want gpuslice-2", l)
	}
	time.Sleep(12 * time.Second) // one node-status update after the plugin restarted
	waitAllocatable(t, gpuRes, 2, 60*time.Second)
	if p := getPod(t, "inst-a1"); p.Status.Phase != corev1.PodRunning {
		t.Errorf("the upgrade disturbed inst-a1: %s", podWhy(p))
	}

	// 9. helm uninstall removes the release's objects; the node's labels
	// (the user's gpu.present, the tuner's config label) stay, as the
	// README says.
	helm(t, "uninstall", release, "-n", installNS, "--wait", "--timeout", "2m")
	uninstalled = true
	if _, err := n.Client.CoreV1().ConfigMaps(installNS).Get(ctx, "gpuslice-plugin-config", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after uninstall the chart's plugin ConfigMap: %v, want NotFound", err)
	}
	node, err := n.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Labels["nvidia.com/gpu.present"] != "true" || node.Labels[configLbl] != "gpuslice-2" {
		t.Errorf("after uninstall the node's labels are %v, want gpu.present and %s kept", node.Labels, configLbl)
	}
}

func labelNode(t *testing.T, key, value string) {
	t.Helper()
	v := "null"
	if value != "" {
		v = fmt.Sprintf("%q", value)
	}
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, key, v))
	if _, err := world.node.Client.CoreV1().Nodes().Patch(context.Background(), world.node.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// installedPods are the release's running pods by component.
func installedPods(t *testing.T) map[string]*corev1.Pod {
	t.Helper()
	list, err := world.node.Client.CoreV1().Pods(installNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*corev1.Pod{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			out[p.Labels["app.kubernetes.io/component"]] = p
		}
	}
	return out
}

// waitRolled waits until the component has exactly one pod, running and ready.
func waitRolled(t *testing.T, comp string) {
	t.Helper()
	testproc.Eventually(t, 120*time.Second, 500*time.Millisecond, func() string {
		list, err := world.node.Client.CoreV1().Pods(installNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + comp})
		if err != nil {
			return err.Error()
		}
		if len(list.Items) != 1 || list.Items[0].Status.Phase != corev1.PodRunning {
			return fmt.Sprintf("%d %s pods, want one running", len(list.Items), comp)
		}
		return ""
	})
}

func logInstalledPods(t *testing.T) {
	list, err := world.node.Client.CoreV1().Pods(installNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return
	}
	for i := range list.Items {
		p := &list.Items[i]
		t.Logf("pod %s: %s (%s)", p.Name, p.Status.Phase, podWhy(p))
		for _, c := range p.Spec.Containers {
			t.Logf("--- %s/%s (last 30 lines) ---\n%s", p.Name, c.Name, testproc.Tail(containerLog(t, p, c.Name), 30))
		}
	}
}

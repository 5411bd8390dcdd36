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
	"sync"
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
// the NVIDIA runtime class (README step 1: here NVIDIA's runtime injects the
// simulated GPU's NVML and driver directory from the node's CDI spec, as it
// injects a real driver's), the kubelet's root dir, and host networking with
// the API server's address in place of a pod network (this node has none).
// The tuner runs in plugin mode against gpuslice-plugin, in dry run.
func installValues(n *realnode.Node) string {
	var env strings.Builder
	for _, e := range apiServerEnv(n) {
		fmt.Fprintf(&env, "\n    - {name: %q, value: %q}", e.Name, e.Value)
	}
	return fmt.Sprintf(`image:
  pullPolicy: Never
runtimeClassName: %s
kubeletRootDir: %q
devicePluginDir: %q
podLogsDir: %q
exporter:
  hostNetwork: true
  port: %d
  extraEnv:%s
plugin:
  enabled: true
  hostNetwork: true
  port: %d
  extraArgs: [--kubelet.pod-resources-interval=1s, --health.interval=1s]
  extraEnv:%s
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
`, nvidiaRuntimeClass, n.KubeletRootDir, n.DevicePluginDir, n.PodLogsDir,
		exporterPort, env.String(), pluginPort, env.String(), tunerPort, env.String())
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
// RBAC (the API server runs ServiceAccount admission and RBAC), the
// exporter and plugin with runtimeClassName nvidia, so that NVIDIA's
// container runtime gives them NVML. The exporter reads the GPU through
// libnvidia-ml and attributes fake-CUDA pods; gpuslice-plugin registers
// with the kubelet from its container; a real Prometheus discovers the
// exporter as the chart's PodMonitor does and fires GPUSliceOOM on a real
// OOM, and a real Alertmanager running the shipped example configuration
// routes it to its gpu-oom receiver; the tuner first only records what it
// would do, then, after `helm upgrade` turns dry run off, applies; a further
// upgrade keeps what the tuner wrote; uninstall leaves the node's labels.
func TestHelmInstall(t *testing.T) {
	n := need(t)
	ctx := context.Background()
	testproc.Hack(t, "helm.sh")

	// 1. The image, as `make image image-import` makes it.
	image := gpusliceImage(t)

	// 2. The node as the README's walk-through leaves it: the NVIDIA
	// runtime class, the node labelled as a GPU node.
	prepareGPUNode(t)
	// Other tests use the namespace too (the tuner's Lease, a plugin
	// ConfigMap): this install starts from none.
	removeInstallNamespace(t)
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(installValues(n)), 0o644); err != nil {
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
		removeInstallNamespace(t)
		// What uninstall keeps on purpose (the label, the tuner's record)
		// would hold the next test's tuner in its cooldown.
		untuneNode(t)
		waitAllocatable(t, gpuRes, 0, 60*time.Second)
	})

	pods := checkInstalled(t, image)

	// 3. gpuslice-plugin registered from its container: the chart's default
	// config advertises 4 replicas of the one GPU.
	waitAllocatable(t, gpuRes, 4, 90*time.Second)

	// 4. A real Prometheus scrapes the exporter and the tuner as the chart's
	// PodMonitors select them: the release's pods of each component, their
	// container port named metrics, the node name as label node. (Debian's
	// Prometheus has no kubernetes_sd, so the test discovers the pods through
	// the API the same way and writes static targets.) It sends its alerts
	// to a real Alertmanager running the shipped example configuration.
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
	am := runAlertmanager(t)
	prom := runPrometheus(t, target("exporter")+target("tuner"), fmt.Sprintf(`up{job="%s/gpuslice-exporter",node=%q}`, installNS, n.Name), am.addr)

	// 5. Attribution: the exporter in its pod sees the GPU through
	// libnvidia-ml and maps a fake-CUDA pod's host PID to the pod.
	runAttributed(t, "inst-a1", prom.series)
	noForbidden(t, pods)

	// 6. A real OOM: a second pod grows past what a1 left. The exporter
	// counts it from /var/log/pods, GPUSliceOOM fires and reaches
	// Alertmanager, and the tuner, in dry run, only records that it would
	// lower the replicas.
	// It holds 26 GiB next to a1's 20 (46 of 48: a full GPU) long enough for
	// the tuner's samples, then fails to grow: an OOM the policy lowers for,
	// unlike one with most of the GPU free (issue 9's proportionate policy).
	fullGPU := []string{"-memory", "0s=1Gi,3s=26Gi,15s=30Gi", "-quiet"}
	createPod(t, fakeCUDAPod("inst-oom1", podOpts{restart: corev1.RestartPolicyNever, args: fullGPU}))
	oomLabels := map[string]string{"node": n.Name, "namespace": namespace, "pod": "inst-oom1", "container": "cuda"}
	testproc.Eventually(t, 90*time.Second, 500*time.Millisecond, func() string {
		_, msg := prom.firing("GPUSliceOOM", oomLabels)
		return msg
	})
	// The alert as Alertmanager has it: the rule's labels and the series',
	// routed by the example's route to the gpu-oom receiver.
	wantOOM := maps.Clone(oomLabels)
	maps.Copy(wantOOM, map[string]string{"alertname": "GPUSliceOOM", "severity": "warning", "uuid": gpuUUID,
		"source": "log", "job": installNS + "/gpuslice-exporter"})
	testproc.Eventually(t, 30*time.Second, 500*time.Millisecond, func() string {
		return am.active("GPUSliceOOM", wantOOM, "gpu-oom")
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
	// The gpu-oom receiver's webhook got the notification (after the
	// route's group_wait of 10 s), and no other receiver.
	testproc.Eventually(t, 60*time.Second, 500*time.Millisecond, func() string {
		return am.notified("gpu-oom", "GPUSliceOOM", wantOOM)
	})
	if got := am.notifiedOf("GPUSliceOOM"); !slices.Equal(got, []string{"gpu-oom"}) {
		t.Errorf("GPUSliceOOM notified to receivers %v, want [gpu-oom]", got)
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

// nvidiaRuntimeClass is the RuntimeClass k3s creates for the NVIDIA
// container runtime, and the chart README's walk-through sets.
const nvidiaRuntimeClass = "nvidia"

var builtImage struct {
	once sync.Once
	ref  string
	err  error
}

// gpusliceImage builds the image as `make image` does (hack/image.sh: no
// container engine, no registry) and imports it into the node's containerd
// as `make image-import` (`k3s ctr images import` on k3s) does, once per
// test binary; it returns the image's reference, the chart's default.
func gpusliceImage(t *testing.T) string {
	t.Helper()
	n := world.node
	builtImage.once.Do(func() {
		tar := filepath.Join(t.TempDir(), "gpuslice.tar")
		build := exec.Command("bash", filepath.Join(realnode.Repo(), "hack", "image.sh"), tar)
		build.Dir = realnode.Repo()
		out, err := build.CombinedOutput()
		if err != nil {
			builtImage.err = fmt.Errorf("hack/image.sh: %w\n%s", err, out)
			return
		}
		for _, l := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(l, "IMAGE="); ok {
				builtImage.ref = v
			}
		}
		if builtImage.ref == "" {
			builtImage.err = fmt.Errorf("hack/image.sh printed no IMAGE=:\n%s", out)
			return
		}
		if out, err := exec.Command("ctr", "--address", n.ContainerdSock, "-n", "k8s.io", "images", "import", tar).CombinedOutput(); err != nil {
			builtImage.err = fmt.Errorf("importing %s: %w\n%s", builtImage.ref, err, out)
		}
	})
	if builtImage.err != nil {
		t.Fatal(builtImage.err)
	}
	return builtImage.ref
}

// prepareGPUNode does on the node what the chart README's k3s walk-through
// does before installing: the NVIDIA container runtime and its RuntimeClass
// nvidia (step 1; here the runtime's devices and NVML come from the
// simulated GPU's CDI spec), and the node labelled as a GPU node (step 3).
// All of it is undone at the end of the test.
func prepareGPUNode(t *testing.T) {
	t.Helper()
	writeSimCDISpec(t)
	runtimeClass(t, nvidiaRuntimeClass, world.node.NVIDIARuntimeHandler)
	labelNode(t, "nvidia.com/gpu.present", "true")
	t.Cleanup(func() { labelNode(t, "nvidia.com/gpu.present", "") })
}

// apiServerEnv points the in-cluster clients of pods at the API server's
// address: this node has no pod network and no Service proxy, so its pods
// run with host networking and reach the API server as any node without a
// working proxy to the kubernetes Service would.
func apiServerEnv(n *realnode.Node) []corev1.EnvVar {
	api, _ := url.Parse(n.Config.Host)
	return []corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: api.Hostname()}, {Name: "KUBERNETES_SERVICE_PORT", Value: api.Port()}}
}

// checkInstalled waits until the release's exporter, plugin and tuner each
// have a running, ready pod and checks how they run: from the image built
// here, as the release's ServiceAccounts, and the exporter and plugin under
// RuntimeClass nvidia, that is, in a sandbox containerd started with the
// nvidia handler, whose runtime (NVIDIA's, in CDI mode) put libnvidia-ml.so.1
// into the container: neither the pod spec nor the spec containerd handed
// to the runtime mounts it, and the running container has it.
func checkInstalled(t *testing.T, image string) map[string]*corev1.Pod {
	t.Helper()
	n := world.node
	var pods map[string]*corev1.Pod
	testproc.Eventually(t, 3*time.Minute, time.Second, func() string {
		pods = installedPods(t)
		for _, comp := range []string{"exporter", "plugin", "tuner"} {
			p, ok := pods[comp]
			if !ok {
				return fmt.Sprintf("no running %s pod (have %v)", comp, slices.Sorted(maps.Keys(pods)))
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
					return fmt.Sprintf("%s pod %s not ready: %s", comp, p.Name, podWhy(p))
				}
			}
		}
		return ""
	})
	for comp, p := range pods {
		if sa := "gpuslice-" + comp; p.Spec.ServiceAccountName != sa {
			t.Errorf("%s runs as ServiceAccount %q, want the release's %s", comp, p.Spec.ServiceAccountName, sa)
		}
		if c := p.Spec.Containers[0]; c.Image != image {
			t.Errorf("%s runs image %s, want the one built here, %s", comp, c.Image, image)
		}
		if comp == "tuner" {
			continue
		}
		if rc := p.Spec.RuntimeClassName; rc == nil || *rc != nvidiaRuntimeClass {
			t.Errorf("%s pod has runtimeClassName %v, want %s", comp, rc, nvidiaRuntimeClass)
			continue
		}
		if h := sandboxHandler(t, n.ContainerdSock, p); h != n.NVIDIARuntimeHandler {
			t.Errorf("%s pod's sandbox runs with runtime handler %q, want %q", comp, h, n.NVIDIARuntimeHandler)
		}
		for _, c := range p.Spec.Containers {
			for _, m := range c.VolumeMounts {
				if m.MountPath == nvmlContainerPath {
					t.Errorf("%s pod mounts %s itself: the runtime is to put it there", comp, nvmlContainerPath)
				}
			}
		}
		spec, pid := criContainer(t, n.ContainerdSock, p.Status.ContainerStatuses[0].ContainerID)
		for _, m := range spec.Mounts {
			if m.Destination == nvmlContainerPath {
				t.Errorf("containerd's spec for the %s container already mounts %s", comp, nvmlContainerPath)
			}
		}
		mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		if err != nil {
			t.Fatalf("%s container (pid %d): %v", comp, pid, err)
		}
		if !strings.Contains(string(mounts), " "+nvmlContainerPath+" ") {
			t.Errorf("the %s container (pid %d) has no %s mounted: NVIDIA's runtime did not inject it\n%s", comp, pid, nvmlContainerPath, mounts)
		}
	}
	return pods
}

// metricReader reads one series (name, with labels among its labels) of
// the installed programs' metrics: through Prometheus or a direct scrape.
type metricReader func(name string, labels map[string]string) (float64, string)

// runAttributed starts a fake-CUDA pod holding 20 GiB of the GPU on one
// replica and waits until the installed exporter reports both, as read
// gives them: it sees the GPU through NVML, maps the pod's host PID to the
// pod (memory), and reads the kubelet's PodResources (the replica it holds).
func runAttributed(t *testing.T, name string, read metricReader) {
	t.Helper()
	createPod(t, fakeCUDAPod(name, podOpts{args: []string{"-memory", "0s=20Gi", "-quiet"}}))
	waitRunning(t, name, 60*time.Second)
	container := map[string]string{"namespace": namespace, "pod": name, "container": "cuda", "uuid": gpuUUID, "node": world.node.Name}
	held := maps.Clone(container)
	held["resource"] = string(gpuRes)
	testproc.Eventually(t, 60*time.Second, 500*time.Millisecond, func() string {
		for _, c := range []struct {
			metric string
			labels map[string]string
			want   float64
		}{
			{"gpuslice_container_gpu_memory_used_bytes", container, float64(20 * gib)},
			{"gpuslice_container_gpu_allocation", held, 1},
		} {
			if v, msg := read(c.metric, c.labels); msg != "" || v != c.want {
				return fmt.Sprintf("%s%v as the installed exporter reports it: %v %s, want %v", c.metric, c.labels, v, msg, c.want)
			}
		}
		return ""
	})
}

// noForbidden fails the test when an installed program logged that the API
// server refused it something: the RBAC the install ships is short.
func noForbidden(t *testing.T, pods map[string]*corev1.Pod) {
	t.Helper()
	for comp, p := range pods {
		for _, line := range strings.Split(containerLog(t, p, p.Spec.Containers[0].Name), "\n") {
			if strings.Contains(line, "forbidden") {
				t.Errorf("%s was refused by the API server: %s", comp, line)
			}
		}
	}
}

// removeInstallNamespace deletes the install's namespace (what helm
// uninstall and `kubectl delete -f` leave: the namespace, the tuner's Lease,
// Events) and waits until it is gone, so the next install starts from none.
func removeInstallNamespace(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	nss := world.node.Client.CoreV1().Namespaces()
	if err := nss.Delete(ctx, installNS, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting namespace %s: %v", installNS, err)
		return
	}
	testproc.Eventually(t, 2*time.Minute, 500*time.Millisecond, func() string {
		if _, err := nss.Get(ctx, installNS, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("namespace %s not gone yet (%v)", installNS, err)
		}
		return ""
	})
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
	t.Logf("--- NVIDIA container runtime log (last 20 lines) ---\n%s", testproc.Tail(readLog(filepath.Join(world.node.LogsDir, "nvidia-container-runtime.log")), 20))
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

func readLog(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

package realnode_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/gpuslice/gpuslice/internal/mps"
	"github.com/gpuslice/gpuslice/internal/testproc"
	"github.com/gpuslice/gpuslice/test/realnode"
	"github.com/gpuslice/gpuslice/test/simgpu"
)

// mpsServerMemory is what test/simgpu/fakemps's server holds on the GPU.
const mpsServerMemory = 66 << 20

// TestPluginMPSLimits runs a whole MPS setup on the real node: the chart's
// mps-control-daemon DaemonSet, gpuslice-plugin in MPS mode, fake-CUDA
// clients and gpuslice-exporter.
//
// The daemon is the chart's template as rendered by helm (only its image,
// mps.root and the runtime class set for this node), a pod of the real
// DaemonSet controller with the privileges, hostPID and host directories of
// NVIDIA's mps-control-daemon layout: its init container mounts the clients'
// /dev/shm tmpfs on the host through Bidirectional propagation, its script
// sets EXCLUSIVE_PROCESS, starts nvidia-cuda-mps-control -d per resource
// with the pipe and log directories under mps.root and writes .started, and
// the kubelet runs its readiness and liveness probes. What is simulated:
// the driver's programs, which NVIDIA's runtime mounts into the daemon from
// the simulated GPU's CDI spec as it mounts a real driver's. They are
// test/simgpu/fakemps: a control daemon that answers the probes' and the
// script's commands on a socket in the pipe directory and starts an
// "nvidia-cuda-mps-server" process that opens the simulated GPU, holds
// 66 MiB there and is listed as its MPS server (the sim file's mpsServer),
// and an nvidia-smi whose -c succeeds without a compute mode to set. The
// clients only ask the daemon for its server (a client without a daemon
// fails); the simulated driver, not the server, holds each to its pinned
// limit.
//
// gpuslice-plugin, given the same root, mounts the pipe directory into each
// container it allocates with CUDA_MPS_PIPE_DIRECTORY and its pinned limit
// (48 GiB / 2): the pod that asks for more gets an out-of-memory error while
// its neighbour keeps its memory and the GPU still has memory free. The
// exporter attributes each client's memory to its pod, the server's to
// gpuslice_gpu_mps_server_memory_used_bytes (no pod's, not unattributed),
// gives each client its limit and no utilization, and counts the capped
// pod's OOM once, of kind process-cap. The readiness probe follows
// .started; the DaemonSet's deletion quits the daemon and its server.
func TestPluginMPSLimits(t *testing.T) {
	need(t)
	root := mpsRoot(t)
	daemon := startMPSDaemon(t, root)
	res := string(gpuRes)
	servers := world.driver.MPSServers()[gpuUUID]
	if len(servers) != 1 {
		t.Fatalf("MPS servers on the GPU: %v, want the daemon's one", world.driver.MPSServers())
	}
	server := servers[0]
	if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", server)); !strings.HasPrefix(string(cmdline), mps.ServerComm+"\x00") {
		t.Errorf("the MPS server's cmdline is %q", cmdline)
	}
	if log := readLog(filepath.Join(mps.LogDir(root, res), "control.log")); !strings.Contains(log, fmt.Sprintf("Server %d started", server)) {
		t.Errorf("the control daemon's log on the host does not name its server %d:\n%s", server, log)
	}
	if !hasTmpfs(filepath.Join(root, "shm")) {
		t.Errorf("no tmpfs at %s/shm on the host: the init container's Bidirectional mount did not reach it", root)
	}
	waitLog(t, daemon, "mps-control-daemon",
		"Set compute mode to EXCLUSIVE_PROCESS for GPU "+gpuUUID,
		"MPS control daemons up for: "+res)

	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, exporter := startExporter(t)
	oomScrapes := newScraper(exporter, 500*time.Millisecond)
	t.Cleanup(oomScrapes.close)
	startPlugin(t, cfg, "--mps-root="+root)
	waitAllocatable(t, gpuRes, 2, 60*time.Second)

	limit := gpuTotal / 2
	neighbour := waitRunning(t, createPod(t, fakeCUDAPod("mps-neighbour", podOpts{args: []string{"-memory", "0s=4Gi", "-sm", "0.4", "-print-env"}})).Name, 60*time.Second)
	waitLog(t, neighbour, "cuda",
		"env "+mps.EnvPipeDirectory+"=/mps/nvidia.com/gpu/pipe",
		fmt.Sprintf("env %s=0=%dM", mps.EnvPinnedMemLimit, limit>>20),
		"env "+mps.EnvThreadPercentage+"=50",
		fmt.Sprintf("MPS client of server pid %d", server))

	gpu := `uuid="` + gpuUUID + `"`
	testproc.Eventually(t, 60*time.Second, 500*time.Millisecond, func() string {
		s, err := scrape(exporter)
		if err != nil {
			return err.Error()
		}
		pod := []string{`namespace="default"`, `pod="mps-neighbour"`, `container="cuda"`, gpu}
		if v, ok := sample(s, "gpuslice_container_gpu_memory_used_bytes", pod...); !ok || !sameFloat(v, 4*gib) {
			return fmt.Sprintf("the neighbour's memory %q (found %v), want 4 GiB\n%s", v, ok, grep(s, "gpuslice_container_gpu_memory_used_bytes"))
		}
		if v, ok := sample(s, "gpuslice_container_gpu_memory_limit_bytes", pod...); !ok || !sameFloat(v, int64(limit)) {
			return fmt.Sprintf("the neighbour's limit %q (found %v), want the plugin's %d\n%s", v, ok, limit, grep(s, "gpuslice_container_gpu_memory_limit_bytes"))
		}
		if v, ok := sample(s, "gpuslice_gpu_mps_server_memory_used_bytes", gpu); !ok || !sameFloat(v, mpsServerMemory) {
			return fmt.Sprintf("the MPS server's memory %q (found %v), want 66 MiB\n%s", v, ok, grep(s, "gpuslice_gpu_mps_server"))
		}
		if v, ok := sample(s, "gpuslice_unattributed_gpu_memory_used_bytes", gpu); ok && !sameFloat(v, 0) {
			return fmt.Sprintf("unattributed memory %s, want none (the server's is its own series)", v)
		}
		if v, ok := sample(s, "gpuslice_container_gpu_memory_used_bytes", `pod="`+daemon.Name+`"`); ok {
			return fmt.Sprintf("the daemon's pod is given the server's memory: %s", v)
		}
		return ""
	})
	if s, err := scrape(exporter); err != nil {
		t.Fatal(err)
	} else if l := grep(s, "gpuslice_container_gpu_utilization_ratio"); strings.Contains(l, `pod="mps-neighbour"`) {
		t.Errorf("the MPS client has a utilization series (NVML samples only the server):\n%s", l)
	}

	// Past its limit by 1 GiB, with 20 GiB of the GPU still free; after the
	// exporter has seen it as a client.
	capped := createPod(t, fakeCUDAPod("mps-capped", podOpts{restart: corev1.RestartPolicyNever,
		args: []string{"-memory", fmt.Sprintf("0s=1Gi,6s=%d", limit+(1<<30))}}))
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
	for pid, b := range world.driver.Processes()[gpuUUID] {
		if pid != server {
			held += b
		}
	}
	if held != 4<<30 {
		t.Errorf("the GPU's clients hold %d bytes after the capped pod's OOM, want the neighbour's 4 GiB", held)
	}
	testproc.Eventually(t, 30*time.Second, 500*time.Millisecond, func() string {
		s, err := scrape(exporter)
		if err != nil {
			return err.Error()
		}
		if got := oomSum(s, `pod="mps-capped"`); got != 1 {
			return fmt.Sprintf("the capped pod's OOMs: %v, want 1\n%s", got, grep(s, "gpuslice_gpu_oom_events_total"))
		}
		if got := oomSum(s, `pod="mps-capped"`, `kind="process-cap"`, gpu); got != 1 {
			return fmt.Sprintf("the capped pod's OOM is not of kind process-cap on the GPU\n%s", grep(s, "gpuslice_gpu_oom_events_total"))
		}
		if _, ok := sample(s, "gpuslice_gpu_oom_events_total", `pod="mps-neighbour"`); !ok {
			return "the neighbour has no OOM counter"
		}
		if got := oomSum(s, `pod="mps-neighbour"`); got != 0 {
			return fmt.Sprintf("the neighbour's OOMs: %v, want 0\n%s", got, grep(s, "gpuslice_gpu_oom_events_total"))
		}
		return ""
	})
	if got := oomScrapes.count("mps-capped"); got != 1 {
		t.Errorf("scraped every 500 ms, the capped pod's OOM counters rose by %v, want 1", got)
	}

	// The readiness probe asks for .started, as gpuslice-plugin does before
	// it allocates; the liveness probe has passed all along.
	started := mps.StartedFile(root, res)
	if err := os.Remove(started); err != nil {
		t.Fatal(err)
	}
	waitReady(t, daemon.Name, false, 45*time.Second)
	if err := os.WriteFile(started, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitReady(t, daemon.Name, true, 45*time.Second)
	probes := probeEvents(t, daemon.Name)
	if !strings.Contains(probes, "Readiness probe failed") {
		t.Errorf("no failed readiness probe while .started was missing; events:\n%s", probes)
	}
	if strings.Contains(probes, "Liveness probe failed") {
		t.Errorf("the liveness probe failed:\n%s", probes)
	}
	if p := getPod(t, daemon.Name); len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the daemon restarted: %+v", p.Status.ContainerStatuses)
	}
	if log := readLog(filepath.Join(mps.LogDir(root, res), "control.log")); strings.Count(log, "Cmd: get_default_active_thread_percentage") < 2 {
		t.Errorf("the probes did not reach the control daemon:\n%s", log)
	}

	// Deleting the DaemonSet stops the daemon as the script's trap does:
	// .started gone, quit sent, the server gone from the GPU.
	stopMPSDaemon(t)
	if _, err := os.Stat(started); err == nil {
		t.Errorf("%s is left after the daemon stopped", started)
	}
	if _, err := os.Stat(filepath.Join(mps.PipeDir(root, res), simgpu.MPSControlSocket)); err == nil {
		t.Error("the control socket is left after the daemon stopped")
	}
	if s := world.driver.MPSServers(); len(s) > 0 {
		t.Errorf("MPS servers %v after the daemon stopped", s)
	}
	if log := readLog(filepath.Join(mps.LogDir(root, res), "control.log")); !strings.Contains(log, "Cmd: quit") {
		t.Errorf("the daemon was not sent quit:\n%s", log)
	}
}

// oomSum adds up the OOM counters whose labels contain all of want.
func oomSum(scrape string, want ...string) float64 {
	var sum float64
	for _, line := range strings.Split(scrape, "\n") {
		if !strings.HasPrefix(line, "gpuslice_gpu_oom_events_total{") {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(line, w)
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); ok && err == nil {
			sum += v
		}
	}
	return sum
}

// mpsRoot is the host directory of the MPS daemon (the chart's mps.root),
// a shared mount of its own: the daemon's init container mounts the
// clients' tmpfs under it with Bidirectional propagation, which containerd
// allows only on a shared mount (systemd makes / shared on a real node;
// this machine's / is private). It is unmounted at the end of the test.
func mpsRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if err := syscall.Mount(root, root, "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mounting %s: %v", root, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(root, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", root, err)
		}
	})
	if err := syscall.Mount("", root, "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		t.Fatalf("making %s shared: %v", root, err)
	}
	return root
}

// hasTmpfs reports whether a tmpfs is mounted at dir in this mount
// namespace (the node's).
func hasTmpfs(dir string) bool {
	for _, l := range strings.Split(readLog("/proc/self/mountinfo"), "\n") {
		f := strings.Fields(l)
		for i, x := range f {
			if x == "-" && len(f) > i+1 && len(f) > 4 && f[4] == dir && f[i+1] == "tmpfs" {
				return true
			}
		}
	}
	return false
}

// startMPSDaemon runs the chart's mps-control-daemon DaemonSet on the node
// with its host directory at root, and waits for its pod to be ready. The
// node is prepared as for the chart (prepareGPUNode), with the simulated
// driver programs of test/simgpu/fakemps in the CDI spec.
func startMPSDaemon(t *testing.T, root string) *corev1.Pod {
	t.Helper()
	n := world.node
	ctx := context.Background()
	fake := testproc.BuildStatic(t, "test/simgpu/fakemps")
	var progs []string
	for _, p := range []string{"nvidia-cuda-mps-control", mps.ServerComm, "nvidia-smi"} {
		progs = append(progs, fake+"=/usr/bin/"+p)
	}
	writeSimCDISpec(t, progs...)
	runtimeClass(t, nvidiaRuntimeClass, n.NVIDIARuntimeHandler)
	labelNode(t, "nvidia.com/gpu.present", "true")
	t.Cleanup(func() { labelNode(t, "nvidia.com/gpu.present", "") })

	// The chart as a user sets it for MPS, on an image this node has (a
	// POSIX shell and mount(8), as the chart asks).
	rendered := helm(t, "template", "rn-mps", filepath.Join(realnode.Repo(), "deploy", "helm", "gpuslice"), "-n", namespace,
		"--show-only", "templates/mps-control-daemon.yaml",
		"--set", "mps.enabled=true", "--set", "mps.root="+root,
		// The chart renders the daemon only beside gpuslice-plugin with an
		// MPS config (EXCLUSIVE_PROCESS leaves other processes no context).
		"--set", "plugin.enabled=true",
		"--set-json", `plugin.config.default="version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"`,
		"--set", "mps.image.repository=realnode.local/busybox", "--set", "mps.image.tag=1.35", "--set", "mps.image.pullPolicy=Never",
		"--set", "runtimeClassName="+nvidiaRuntimeClass)
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal([]byte(rendered), &ds); err != nil {
		t.Fatalf("the rendered DaemonSet: %v\n%s", err, rendered)
	}
	if ds.Kind != "DaemonSet" {
		t.Fatalf("helm rendered no DaemonSet:\n%s", rendered)
	}
	if _, err := n.Client.AppsV1().DaemonSets(namespace).Create(ctx, &ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopMPSDaemon(t) })
	sel := labels.SelectorFromSet(ds.Spec.Selector.MatchLabels).String()
	var pod *corev1.Pod
	testproc.Eventually(t, 90*time.Second, 500*time.Millisecond, func() string {
		pods, err := n.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return err.Error()
		}
		if len(pods.Items) != 1 {
			got, _ := n.Client.AppsV1().DaemonSets(namespace).Get(ctx, ds.Name, metav1.GetOptions{})
			return fmt.Sprintf("%d daemon pods, want 1 (DaemonSet status %+v)", len(pods.Items), got.Status)
		}
		pod = &pods.Items[0]
		if !podReady(pod) {
			return fmt.Sprintf("the daemon's pod %s is not ready: %s %s\n--- mount-shm ---\n%s\n--- mps-control-daemon ---\n%s\n--- control.log ---\n%s",
				pod.Name, pod.Status.Phase, podWhy(pod), testproc.Tail(containerLog(t, pod, "mount-shm"), 10), testproc.Tail(containerLog(t, pod, "mps-control-daemon"), 10),
				testproc.Tail(readLog(filepath.Join(mps.LogDir(root, string(gpuRes)), "control.log")), 10))
		}
		return ""
	})
	if _, err := os.Stat(mps.StartedFile(root, string(gpuRes))); err != nil {
		t.Fatalf("the daemon's pod is ready without %s: %v", mps.StartedFile(root, string(gpuRes)), err)
	}
	return pod
}

// stopMPSDaemon deletes the daemon's DaemonSet and waits until its pods
// are gone (their stop trap has run).
func stopMPSDaemon(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	c := world.node.Client
	dss, err := c.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Error(err)
		return
	}
	for _, ds := range dss.Items {
		if ds.Spec.Template.Labels["app.kubernetes.io/component"] == "mps-control-daemon" {
			bg := metav1.DeletePropagationBackground
			_ = c.AppsV1().DaemonSets(namespace).Delete(ctx, ds.Name, metav1.DeleteOptions{PropagationPolicy: &bg})
		}
	}
	sel := labels.SelectorFromSet(labels.Set{"app.kubernetes.io/component": "mps-control-daemon"}).String()
	testproc.Eventually(t, 90*time.Second, 500*time.Millisecond, func() string {
		pods, err := c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return err.Error()
		}
		if len(pods.Items) > 0 {
			return fmt.Sprintf("%d daemon pods left", len(pods.Items))
		}
		return ""
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitReady(t *testing.T, name string, ready bool, timeout time.Duration) {
	t.Helper()
	testproc.Eventually(t, timeout, 500*time.Millisecond, func() string {
		if p := getPod(t, name); podReady(p) != ready {
			return fmt.Sprintf("pod %s ready=%v, want %v (%s)", name, podReady(p), ready, podWhy(p))
		}
		return ""
	})
}

// probeEvents is the messages of the pod's Unhealthy events, one a line.
func probeEvents(t *testing.T, pod string) string {
	t.Helper()
	evs, err := world.node.Client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range evs.Items {
		if e.Reason == "Unhealthy" {
			fmt.Fprintf(&b, "%s (x%d)\n", e.Message, e.Count)
		}
	}
	return b.String()
}

package realnode_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/testproc"
)

// containerLog is everything the pod's container wrote, from the real CRI
// log files under /var/log/pods (kubectl logs cannot reach this kubelet).
func containerLog(t *testing.T, pod *corev1.Pod, container string) string {
	t.Helper()
	dir := filepath.Join(world.node.PodLogsDir, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), container)
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err == nil {
			b.Write(data)
		}
	}
	return b.String()
}

// waitLog waits until the container's log holds every one of want.
func waitLog(t *testing.T, pod *corev1.Pod, container string, want ...string) {
	t.Helper()
	testproc.Eventually(t, 20*time.Second, 200*time.Millisecond, func() string {
		log := containerLog(t, pod, container)
		for _, w := range want {
			if !strings.Contains(log, w) {
				return fmt.Sprintf("container log lacks %q:\n%s", w, log)
			}
		}
		return ""
	})
}

// podEvents are the reasons and messages of the pod's Events.
func podEvents(t *testing.T, pod string) string {
	evs, err := world.node.Client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return strings.Join(out, "; ")
}

// TestPluginOnRealKubelet: gpuslice-plugin registers with the real kubelet,
// its replica count changes live in both directions, a lowering keeps the
// pods that hold IDs above the new count running while new pods wait, the
// container sees NVIDIA_VISIBLE_DEVICES and the memory budget, and a plugin
// restart brings the devices back.
func TestPluginOnRealKubelet(t *testing.T) {
	need(t)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, cfg, 4)
	plugin, _ := startPlugin(t, cfg)
	d := waitAllocatable(t, gpuRes, 4, 60*time.Second)
	t.Logf("registration: allocatable 4 after %v", d.Round(100*time.Millisecond))

	a := createPod(t, fakeCUDAPod("plugin-a", podOpts{args: []string{"-memory", "0s=1Gi", "-print-env"}}))
	a = waitRunning(t, a.Name, 60*time.Second)
	waitLog(t, a, "cuda",
		"env NVIDIA_VISIBLE_DEVICES="+gpuUUID,
		fmt.Sprintf("env GPUSLICE_GPU_MEMORY_BUDGET_BYTES=%d", gpuTotal/4),
		"fakecuda: pid ")

	// Up: 4 → 6, live.
	writeConfig(t, cfg, 6)
	d = waitAllocatable(t, gpuRes, 6, 60*time.Second)
	t.Logf("raise 4→6: Node.status.allocatable after %v", d.Round(100*time.Millisecond))

	b := createPod(t, fakeCUDAPod("plugin-b", podOpts{args: []string{"-memory", "0s=1Gi"}}))
	c := createPod(t, fakeCUDAPod("plugin-c", podOpts{args: []string{"-memory", "0s=1Gi"}}))
	waitRunning(t, b.Name, 60*time.Second)
	waitRunning(t, c.Name, 60*time.Second)

	// Down: 6 → 2 with 3 IDs held. The held pods keep running; a new pod
	// does not start until enough of them are gone.
	writeConfig(t, cfg, 2)
	time.Sleep(12 * time.Second) // a full node-status period of the kubelet
	for _, name := range []string{a.Name, b.Name, c.Name} {
		if p := getPod(t, name); p.Status.Phase != corev1.PodRunning {
			t.Fatalf("lowering stopped %s: %s (%s)", name, p.Status.Phase, podWhy(p))
		}
	}
	// The three IDs dropped stay listed as unhealthy for a minute: the
	// kubelet counts them in capacity, not in allocatable. A kubelet that
	// is allocating one of them when the list changes then still finds
	// it (kubelet v1.37.1 crashed on one that had vanished).
	alloc, capa := nodeDevices(t, gpuRes)
	t.Logf("after lowering 6→2 with 3 held: allocatable %d, capacity %d", alloc, capa)
	if alloc != 3 || capa != 6 {
		t.Errorf("after lowering 6→2 with 3 held: allocatable %d, capacity %d; want 3 (the IDs held) and 6 (with the 3 dropped ones listed unhealthy)", alloc, capa)
	}
	e := createPod(t, fakeCUDAPod("plugin-e", podOpts{args: []string{"-memory", "0s=1Gi"}}))
	time.Sleep(5 * time.Second)
	if p := getPod(t, e.Name); p.Status.Phase == corev1.PodRunning {
		t.Fatalf("a new pod started with 3 IDs held over a count of 2")
	} else {
		t.Logf("new pod over a lowered count: %s (%s)", p.Status.Phase, podWhy(p))
	}
	deletePod(t, a.Name)
	deletePod(t, b.Name)
	// With only c holding an ID, e fits the count of 2 again. A pod the
	// kubelet already rejected (UnexpectedAdmissionError) is Failed for
	// good; the scheduler only retries a Pending one.
	if p := getPod(t, e.Name); p.Status.Phase == corev1.PodFailed {
		t.Logf("the kubelet rejected %s at admission: %s", e.Name, podWhy(p))
		deletePod(t, e.Name)
		e = createPod(t, fakeCUDAPod("plugin-e2", podOpts{args: []string{"-memory", "0s=1Gi"}}))
	}
	waitRunning(t, e.Name, 90*time.Second)
	waitAllocatable(t, gpuRes, 2, 60*time.Second)

	// Plugin restart: the kubelet marks the devices unhealthy while it is
	// gone (allocatable 0) and takes them back when it registers again;
	// running pods are not touched.
	if err := plugin.Stop(); err != nil {
		t.Logf("plugin exited: %v", err)
	}
	startPlugin(t, cfg) // waits for allocatable 0 first
	waitAllocatable(t, gpuRes, 2, 60*time.Second)
	for _, name := range []string{c.Name, e.Name} {
		if p := getPod(t, name); p.Status.Phase != corev1.PodRunning {
			t.Fatalf("plugin restart stopped %s: %s", name, podWhy(p))
		}
	}
}

// TestKubeletRestartKeepsHeldIDs: three pods hold replica IDs, the count is
// lowered to 2 so one ID is held above it, and a crash-looping pod's
// container is not running when the kubelet restarts. PodResources answers
// before the kubelet has rebuilt its pod list; the plugin must keep
// advertising the held IDs meanwhile, or the kubelet's re-admission of the
// pods rejects the one whose ID vanished (UnexpectedAdmissionError).
func TestKubeletRestartKeepsHeldIDs(t *testing.T) {
	n := need(t)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, cfg, 3)
	plugin, _ := startPlugin(t, cfg)
	waitAllocatable(t, gpuRes, 3, 60*time.Second)

	holder := createPod(t, fakeCUDAPod("restart-holder", podOpts{args: []string{"-memory", "0s=1Gi"}}))
	holder2 := createPod(t, fakeCUDAPod("restart-holder2", podOpts{args: []string{"-memory", "0s=1Gi"}}))
	waitRunning(t, holder.Name, 60*time.Second)
	waitRunning(t, holder2.Name, 60*time.Second)
	looper := createPod(t, fakeCUDAPod("restart-looper", podOpts{args: []string{"-memory", "0s=1Gi", "-run", "2s"}}))
	// Wait until the looper has run and exited at least once.
	testproc.Eventually(t, 90*time.Second, 200*time.Millisecond, func() string {
		p := getPod(t, looper.Name)
		if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount < 1 {
			return "looper has not restarted yet: " + podWhy(p)
		}
		return ""
	})
	writeConfig(t, cfg, 2) // three IDs held over a count of two
	time.Sleep(3 * time.Second)
	if err := n.RestartKubelet(context.Background()); err != nil {
		t.Fatal(err)
	}
	// After the restart the looper keeps restarting on its ID. Two kinds of
	// rejection are told apart by the kubelet's message:
	//   - "previously allocated devices are no longer healthy": the plugin
	//     re-registered without the looper's ID (it trusted a PodResources
	//     answer given before the kubelet rebuilt its pod list) — the defect;
	//   - "no healthy devices present": the kubelet re-admitted the pod
	//     before the plugin had registered again. The kubelet v1.37.1 here
	//     starts its registration server about a second before it reads its
	//     pods back; the plugin registered late when the kubelet refused its
	//     first dial (kubelet.sock created, not yet accepting) and it
	//     retried a second later (seen in the logs of one run of 15); it
	//     now waits for the kubelet to accept, checked below. A kubelet
	//     that re-admits before its own registration server is up is a race
	//     no plugin can close: logged, not failed.
	restarts := func(p *corev1.Pod) int32 {
		if len(p.Status.ContainerStatuses) == 0 {
			return -1 // right after the restart, statuses are being rebuilt
		}
		return p.Status.ContainerStatuses[0].RestartCount
	}
	before := restarts(getPod(t, looper.Name))
	raced := ""
	testproc.Eventually(t, 240*time.Second, 500*time.Millisecond, func() string {
		for _, msg := range admissionErrors(t, looper) {
			switch {
			case strings.Contains(msg, "previously allocated devices are no longer healthy"):
				t.Fatalf("the plugin dropped the looper's held ID across the kubelet restart: %s", msg)
			case strings.Contains(msg, "no healthy devices present"):
				raced = msg
			default:
				t.Fatalf("the kubelet refused the looper after its restart for another reason: %s", msg)
			}
		}
		if raced != "" {
			return ""
		}
		p := getPod(t, looper.Name)
		if rc := restarts(p); rc <= before {
			return fmt.Sprintf("looper restart count %d, want > %d (%s); events: %s", rc, before, podWhy(p), podEvents(t, looper.Name))
		}
		return ""
	})
	if raced != "" {
		t.Logf("the kubelet re-admitted the looper before the plugin registered again: %s", raced)
	}
	out := plugin.Output()
	if i := strings.LastIndex(out, "kubelet socket created"); i < 0 {
		t.Errorf("the plugin did not see kubelet.sock created again:\n%s", testproc.Tail(out, 12))
	} else if strings.Contains(out[i:], "not registered; retrying") {
		t.Errorf("the plugin's registration after the kubelet restart failed on the way:\n%s", testproc.Tail(out, 12))
	}
	// The real kubelet creates its PodResources socket anew when it starts,
	// and the plugin, reading it every second, tells the restart from that
	// too (it may come before kubelet.sock; docs/plugin.md).
	testproc.Eventually(t, 30*time.Second, 200*time.Millisecond, func() string {
		if !strings.Contains(plugin.Output(), "PodResources socket is new") {
			return "the plugin did not see the kubelet's restart in its PodResources socket"
		}
		return ""
	})
	for _, h := range []string{holder.Name, holder2.Name} {
		if p := getPod(t, h); p.Status.Phase != corev1.PodRunning {
			t.Fatalf("after the kubelet restart %s is %s: %s", h, p.Status.Phase, podWhy(p))
		}
	}
}

// admissionErrors are the messages of the pod's UnexpectedAdmissionError
// Events. By UID: Events outlive their pod, and one of a pod of the same
// name before (go test -count=N) is not this pod's.
func admissionErrors(t *testing.T, pod *corev1.Pod) []string {
	evs, err := world.node.Client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + pod.Name + ",involvedObject.uid=" + string(pod.UID),
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if e.Reason == "UnexpectedAdmissionError" {
			out = append(out, e.Message)
		}
	}
	return out
}

package controller

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// testPendingPod: a node with 2 replicas, 1 allocated and plenty of
// headroom is held (a replica is free) until a pod the scheduler could not
// place asks for 2; then it is raised, and that raise is not undone before
// it has settled. Pods that could not run on the node, that the scheduler
// has not tried, or that ask for another resource change nothing.
func testPendingPod(t *testing.T, env *testenv.Env) {
	cfg := testConfig(config.ModePlugin, "pd-ns")
	h := newHarness(t, env, cfg, nil)
	h.namespace()
	env.CreateNamespace(t, "pd-team")
	h.configMap(map[string]string{"default": baseConfig})
	const node = "pd-node"
	h.node(node, map[string]string{ConfigLabel: "gpuslice-2", "pool": "pd"}, 2) // 1 GPU × 2
	h.src.set(node, signal{gpus: 1, used: 6 * gib, peak: 6 * gib, allocated: 1, advertised: 2})
	t.Cleanup(func() {
		for _, ns := range []string{"pd-ns", "pd-team"} {
			_ = env.Client.CoreV1().Pods(ns).DeleteCollection(h.ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{})
		}
	})
	held := func(when string) {
		t.Helper()
		if r := h.record(node); r.Reason != policy.ReasonFreeReplicas || r.Replicas != 2 || h.getNode(node).Labels[ConfigLabel] != "gpuslice-2" {
			t.Errorf("%s: last decision %+v, label %q; want a FreeReplicas hold at gpuslice-2", when, r, h.getNode(node).Labels[ConfigLabel])
		}
	}

	h.round()
	held("no pending pod")

	gpu := corev1.ResourceName(dpconfig.GPUResource)
	unschedulable := []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	for _, p := range []struct {
		name      string
		nodeName  string
		selector  map[string]string
		res       corev1.ResourceName
		condition []corev1.PodCondition
	}{
		{"bound-elsewhere", "pd-other-node", nil, gpu, unschedulable},
		{"other-pool", "", map[string]string{"pool": "pd-elsewhere"}, gpu, unschedulable},
		{"not-tried-yet", "", map[string]string{"pool": "pd"}, gpu, nil},
		{"scheduled", "", map[string]string{"pool": "pd"}, gpu, []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}},
		{"other-resource", "", map[string]string{"pool": "pd"}, dpconfig.GPUResource + dpconfig.SharedSuffix, unschedulable},
	} {
		h.pendingPod("pd-ns", p.name, p.nodeName, p.selector, p.res, 4, p.condition)
	}
	h.podsSynced()
	if got := h.c.pendingPods(h.getNode(node), dpconfig.GPUResource); len(got) != 0 {
		t.Errorf("pending pods %+v from pods that cannot use the node, want none", got)
	}
	h.advance(cfg.Interval)
	h.round()
	held("only pods that cannot use the node")

	h.pendingPod("pd-team", "wants-two", "", map[string]string{"pool": "pd"}, gpu, 2, unschedulable)
	h.podsSynced()
	waiting, err := env.Client.CoreV1().Pods("pd-team").Get(h.ctx, "wants-two", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []policy.PendingPod{{Workload: "pd-team/image/cuda", Replicas: 2, Since: waiting.CreationTimestamp.Time}}
	if got := h.c.pendingPods(h.getNode(node), dpconfig.GPUResource); !slices.Equal(got, want) {
		t.Errorf("pending pods %+v, want %+v", got, want)
	}
	h.advance(cfg.Interval)
	h.round()
	if r := h.record(node); r.Replicas != 3 || r.Direction != policy.DirectionUp || r.Reason != policy.ReasonSustainedHeadroom {
		t.Errorf("with a pod waiting for 2: last decision %+v, want a raise to 3", r)
	}
	if key, data := pluginReads(h, node); key != "gpuslice-3" || replicasOf(t, data) != 3 {
		t.Errorf("the plugin reads key %q with %d replicas, want gpuslice-3 with 3", key, replicasOf(t, data))
	}
	if r := h.record(node); r.LastChangeDirection != policy.DirectionUp {
		t.Errorf("last decision %+v: the raise is stored without its direction", r)
	}

	// The replica is taken by a pod so large that a third would not fit:
	// the policy would lower, but the raise (its direction stored beside
	// its time, passed back to the policy with plugin mode's cost) is not
	// undone before it has settled; then it is.
	if err := env.Client.CoreV1().Pods("pd-team").Delete(h.ctx, "wants-two", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	h.podsSynced()
	h.setAllocatable(node, dpconfig.GPUResource, 3)
	h.src.set(node, signal{gpus: 1, used: 40 * gib, peak: 20 * gib, allocated: 2, advertised: 3})
	h.advance(cfg.Interval)
	h.round()
	if r := h.record(node); r.Replicas != 3 || r.Reason != policy.ReasonSettling {
		t.Errorf("a round after the raise: last decision %+v, want a Settling hold at 3", r)
	}
	cost, err := policy.ApplyCostOf(config.ModePlugin)
	if err != nil {
		t.Fatal(err)
	}
	h.advance(cost.Settle(cfg.Policy))
	h.round()
	if r := h.record(node); r.Replicas != 2 || r.LastChangeDirection != policy.DirectionDown || !r.LastChange.Equal(h.now) {
		t.Errorf("once settled: last decision %+v, want a lowering to 2 stored with its direction", r)
	}
}

// pendingPod creates a pod asking for n of res (as a limit: the API
// server copies it to the request) with the given PodScheduled condition.
func (h *harness) pendingPod(ns, name, nodeName string, selector map[string]string, res corev1.ResourceName, n int64, conds []corev1.PodCondition) {
	h.t.Helper()
	pods := h.env.Client.CoreV1().Pods(ns)
	p, err := pods.Create(h.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{NodeName: nodeName, NodeSelector: selector, Containers: []corev1.Container{{
			Name: "main", Image: "cuda",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{res: *resource.NewQuantity(n, resource.DecimalSI)}},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending {
		h.t.Fatalf("pod %s/%s created in phase %q", ns, name, p.Status.Phase)
	}
	if len(conds) == 0 {
		return
	}
	p.Status.Conditions = conds
	if _, err := pods.UpdateStatus(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// podsSynced waits until the pending-pod informer has every pending pod as
// the API server has it.
func (h *harness) podsSynced() {
	h.t.Helper()
	poll(h.t, 10*time.Second, func() string {
		pods, err := h.env.Client.CoreV1().Pods("").List(h.ctx, metav1.ListOptions{FieldSelector: "status.phase=Pending"})
		if err != nil {
			return err.Error()
		}
		for _, p := range pods.Items {
			cached, err := h.c.pods.Pods(p.Namespace).Get(p.Name)
			if err != nil || cached.ResourceVersion != p.ResourceVersion {
				return fmt.Sprintf("informer behind on pod %s/%s", p.Namespace, p.Name)
			}
		}
		return ""
	})
}

func TestPodRequest(t *testing.T) {
	gpu := corev1.ResourceName(dpconfig.GPUResource)
	c := func(n int64, limitOnly bool) corev1.Container {
		l := corev1.ResourceList{gpu: *resource.NewQuantity(n, resource.DecimalSI)}
		if limitOnly {
			return corev1.Container{Resources: corev1.ResourceRequirements{Limits: l}}
		}
		return corev1.Container{Resources: corev1.ResourceRequirements{Requests: l, Limits: l}}
	}
	sidecar := func(n int64) corev1.Container {
		s := c(n, false)
		always := corev1.ContainerRestartPolicyAlways
		s.RestartPolicy = &always
		return s
	}
	for _, tc := range []struct {
		name       string
		init, main []corev1.Container
		want       int64
	}{
		{"none", nil, []corev1.Container{{}}, 0},
		{"containers add up", nil, []corev1.Container{c(1, false), c(2, true)}, 3},
		{"a larger init container", []corev1.Container{c(3, false)}, []corev1.Container{c(1, false)}, 3},
		{"sidecars add to containers", []corev1.Container{sidecar(1)}, []corev1.Container{c(1, false)}, 2},
		{"init after a sidecar", []corev1.Container{sidecar(1), c(2, false)}, []corev1.Container{c(1, false)}, 3},
		{"init before a sidecar", []corev1.Container{c(2, false), sidecar(1)}, []corev1.Container{c(0, false)}, 2},
	} {
		p := &corev1.Pod{Spec: corev1.PodSpec{InitContainers: tc.init, Containers: tc.main}}
		if got := podRequest(p, gpu); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

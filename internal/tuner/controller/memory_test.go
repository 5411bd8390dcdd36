package controller

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// testWorkloadMemory: a tuner learns a Deployment's 40 GiB peak on one node
// and keeps it in its ConfigMap; a new tuner (a restart) reads it back, so
// when a pod of that Deployment waits, the node that knows it is not raised
// for it (40 GiB does not fit beside what runs), while a node that never
// saw it prices the pod at its own largest container and is raised. A key
// that does not parse is left as it is.
func testWorkloadMemory(t *testing.T, env *testenv.Env) {
	cfg := testConfig(config.ModePlugin, "wm-ns")
	h := newHarness(t, env, cfg, nil)
	h.namespace()
	env.CreateNamespace(t, "wm-team")
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Pods("wm-team").DeleteCollection(h.ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{})
	})
	h.configMap(map[string]string{"default": baseConfig})
	h.node("wm-node", map[string]string{ConfigLabel: "gpuslice-2", "pool": "wm"}, 2)
	h.node("wm-fresh", map[string]string{ConfigLabel: "gpuslice-2", "pool": "wm"}, 2)

	// A running pod of Deployment "trainer" (through its ReplicaSet), read
	// with a GET: it is not in the pending-pod cache.
	trainer := h.teamPod("trainer-6b9f7c-x2x4z", "6b9f7c", "wm-node", corev1.PodRunning, nil)
	h.src.set("wm-node", signal{gpus: 1, used: 42 * gib, peak: 40 * gib, allocated: 2, advertised: 2,
		container: "wm-team/" + trainer.Name + "/main"})
	h.round()

	cm, err := env.Client.CoreV1().ConfigMaps("wm-ns").Get(h.ctx, cfg.WorkloadMemory.ConfigMap.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the workload memory was not saved: %v", err)
	}
	var mem policy.Memory
	if err := json.Unmarshal([]byte(cm.Data["wm-node.json"]), &mem); err != nil {
		t.Fatalf("wm-node.json: %v in %q", err, cm.Data)
	}
	if w := mem.Workloads["wm-team/Deployment/trainer"]; w.PeakBytes != 40*gib || !w.Known(cfg.Policy) {
		t.Fatalf("stored record %+v, want the trainer Deployment known at 40 GiB", mem.Workloads)
	}
	if _, ok := cm.Data["wm-fresh.json"]; ok {
		t.Errorf("a record for wm-fresh, which showed no container")
	}
	// Someone's broken key for a third node is never overwritten.
	cm.Data["wm-gone.json"] = "{not json"
	h.node("wm-gone", nil, 0)
	if _, err := env.Client.CoreV1().ConfigMaps("wm-ns").Update(h.ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A new tuner, later: the trainer has left; a small notebook holds
	// both replicas of each node, and another trainer pod waits.
	h2 := newHarness(t, env, cfg, nil)
	h2.now = h.now.Add(10 * time.Minute)
	if err := env.Client.CoreV1().Pods("wm-team").Delete(h.ctx, trainer.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	small := signal{gpus: 1, used: 12 * gib, peak: 6 * gib, allocated: 2, advertised: 2, container: "wm-team/notebook-0/main"}
	h2.src.set("wm-node", small)
	h2.src.set("wm-fresh", small)
	h2.teamPod("trainer-6b9f7c-q7r8s", "6b9f7c", "", corev1.PodPending, []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}})
	h2.round()
	h2.podsSynced()
	h2.advance(cfg.Interval)
	h2.round()

	if r, label := h2.record("wm-fresh"), h2.getNode("wm-fresh").Labels[ConfigLabel]; r.Replicas != 3 || label != "gpuslice-3" {
		t.Errorf("wm-fresh (never saw the trainer): label %s, last decision %+v, want a raise to 3", label, r)
	}
	if r, label := h2.record("wm-node"), h2.getNode("wm-node").Labels[ConfigLabel]; r.Replicas != 2 || label != "gpuslice-2" {
		t.Errorf("wm-node (remembers the trainer at 40 GiB): label %s, last decision %+v, want it kept at 2", label, r)
	}
	cm, err = env.Client.CoreV1().ConfigMaps("wm-ns").Get(h.ctx, cfg.WorkloadMemory.ConfigMap.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cm.Data["wm-gone.json"]; got != "{not json" {
		t.Errorf("the unparsable key was rewritten to %q", got)
	}
	if !strings.Contains(cm.Data["wm-fresh.json"], "wm-team/image/") && !strings.Contains(cm.Data["wm-fresh.json"], "notebook-0") {
		t.Errorf("wm-fresh's record %q does not hold the notebook", cm.Data["wm-fresh.json"])
	}
}

// teamPod creates a pod of Deployment "trainer" in wm-team: owned by its
// ReplicaSet trainer-<hash>, with the pod-template-hash label, asking for
// one GPU replica, in the given phase and conditions.
func (h *harness) teamPod(name, hash, nodeName string, phase corev1.PodPhase, conds []corev1.PodCondition) *corev1.Pod {
	h.t.Helper()
	pods := h.env.Client.CoreV1().Pods("wm-team")
	yes := true
	p, err := pods.Create(h.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "wm-team", Labels: map[string]string{"app": "trainer", "pod-template-hash": hash},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "trainer-" + hash,
				UID: types.UID("00000000-0000-0000-0000-00000000" + hash[:4]), Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "main", Image: "trainer:1",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				corev1.ResourceName(dpconfig.GPUResource): *resource.NewQuantity(1, resource.DecimalSI)}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	if phase != corev1.PodPending || len(conds) > 0 {
		p.Status.Phase, p.Status.Conditions = phase, conds
		if p, err = pods.UpdateStatus(h.ctx, p, metav1.UpdateOptions{}); err != nil {
			h.t.Fatal(err)
		}
	}
	return p
}

func TestWorkloadKey(t *testing.T) {
	yes := true
	owned := func(kind, name string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{Kind: kind, Name: name, Controller: &yes}}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Image: "img:1"}}}}
	}
	notController := owned("ReplicaSet", "web-abc", nil)
	notController.OwnerReferences[0].Controller = nil
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"deployment", owned("ReplicaSet", "web-5d8f9", map[string]string{"pod-template-hash": "5d8f9"}), "ns/Deployment/web"},
		{"replicaset by hand", owned("ReplicaSet", "web-5d8f9", nil), "ns/ReplicaSet/web-5d8f9"},
		{"statefulset", owned("StatefulSet", "db", nil), "ns/StatefulSet/db"},
		{"daemonset", owned("DaemonSet", "agent", nil), "ns/DaemonSet/agent"},
		{"cronjob", owned("Job", "nightly-29400480", nil), "ns/CronJob/nightly"},
		{"job", owned("Job", "train-1", nil), "ns/Job/train-1"},
		{"no controller: the image", notController, "ns/image/img:1"},
		{"bare pod", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Image: "img:1"}}}}, "ns/image/img:1"},
		{"nothing to go by", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}, "ns/Pod/p"},
	} {
		if got := workloadKey(tc.pod); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestMemoryEncodeBounded: however many nodes and workloads, the stored
// record fits maxMemoryBytes, each node keeping its most recently seen
// workloads.
func TestMemoryEncodeBounded(t *testing.T) {
	s := &memoryStore{nodes: map[string]policy.Memory{}}
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for n := range 40 {
		mem := policy.Memory{Updated: t0, Workloads: map[string]policy.WorkloadMemory{}}
		for w := range 256 {
			mem.Workloads[fmt.Sprintf("team-%d/Deployment/service-with-a-long-name-%03d", n, w)] = policy.WorkloadMemory{
				PeakBytes: uint64(w) << 28, Seen: time.Hour, LastSeen: t0.Add(time.Duration(w) * time.Minute)}
		}
		s.nodes[fmt.Sprintf("gpu-node-%02d", n)] = mem
	}
	data, err := s.encode(func(string) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for k, v := range data {
		total += len(k) + len(v)
		var mem policy.Memory
		if err := json.Unmarshal([]byte(v), &mem); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if len(mem.Workloads) == 0 {
			t.Errorf("%s kept no workload", k)
		}
	}
	if total > maxMemoryBytes+40*32 {
		t.Errorf("encoded %d bytes, want at most about %d", total, maxMemoryBytes)
	}
	for name, mem := range s.nodes {
		newest := time.Time{}
		for _, w := range mem.Workloads {
			newest = later(newest, w.LastSeen)
		}
		if want := t0.Add(255 * time.Minute); !newest.Equal(want) {
			t.Errorf("%s: newest workload kept was seen at %s, want %s (the most recent are kept)", name, newest, want)
		}
		if len(mem.Workloads) == 256 {
			t.Errorf("%s: nothing trimmed", name)
		}
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

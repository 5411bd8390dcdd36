package controller

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/signals"
)

// testExplainWaiting: a pod waits for a replica of a node whose memory has
// no room for another; the tuner does not raise, and tells the pod why and
// which pods hold replicas there without using the GPU (idle at least
// idleHolderAfter; a busy one and one idle for minutes are not named). The
// same explanation is not repeated every round; a new idle holder is told.
func testExplainWaiting(t *testing.T, env *testenv.Env) {
	cfg := testConfig(config.ModePlugin, "ex-ns")
	h := newHarness(t, env, cfg, nil)
	h.namespace()
	h.podNamespace("ex-team")
	h.configMap(map[string]string{"default": baseConfig})
	const node = "ex-node"
	h.node(node, map[string]string{ConfigLabel: "gpuslice-2", "pool": "ex"}, 2)
	// 47 of 48 GiB used by two pods: no room for a third.
	h.src.set(node, signal{gpus: 1, used: 47 * gib, peak: 23 * gib, allocated: 2, advertised: 2})
	h.src.setIdle(node,
		signals.IdleHolder{Namespace: "lab", Pod: "notebook-0", Container: "jupyter", UUID: "GPU-ex-node-0", Idle: 5*time.Hour + 7*time.Minute + 3*time.Second},
		signals.IdleHolder{Namespace: "lab", Pod: "scratch", Container: "main", UUID: "GPU-ex-node-0", Idle: 10 * time.Minute},
		signals.IdleHolder{Namespace: "ml", Pod: "a", Container: "main", UUID: "GPU-ex-node-0"},
	)
	got := h.waitOneRound("ex-team", "ex", cfg.Interval)
	for _, want := range []string{"node ex-node: no nvidia.com/gpu replica free and the tuner does not raise its 2",
		"1 pod(s) hold replicas there without using the GPU: lab/notebook-0 (idle 5h7m0s)"} {
		if !strings.Contains(got[0], want) {
			t.Errorf("Event %q lacks %q", got[0], want)
		}
	}
	for _, not := range []string{"lab/scratch", "ml/a"} {
		if strings.Contains(got[0], not) {
			t.Errorf("Event %q names %s, which is not idle for an hour", got[0], not)
		}
	}
	if h.getNode(node).Labels[ConfigLabel] != "gpuslice-2" {
		t.Errorf("node raised to %s with no room", h.getNode(node).Labels[ConfigLabel])
	}

	h.advance(cfg.Interval)
	h.round()
	if got := withReason(h.events(), ReasonWaitingForReplica); len(got) != 0 {
		t.Errorf("the same explanation repeated the next round: %q", got)
	}

	h.src.setIdle(node,
		signals.IdleHolder{Namespace: "lab", Pod: "notebook-0", Container: "jupyter", UUID: "GPU-ex-node-0", Idle: 5 * time.Hour},
		signals.IdleHolder{Namespace: "lab", Pod: "scratch", Container: "main", UUID: "GPU-ex-node-0", Idle: 2 * time.Hour},
	)
	h.advance(cfg.Interval)
	h.round()
	got = withReason(h.events(), ReasonWaitingForReplica)
	if len(got) != 1 || !strings.Contains(got[0], "2 pod(s) hold replicas there without using the GPU: lab/notebook-0 (idle 5h0m0s), lab/scratch (idle 2h0m0s)") {
		t.Errorf("after a second pod went idle: %q, want one Event naming both, longest idle first", got)
	}
}

// testExplainOncePerPod: a pod whose selector several full nodes match is
// told once per round, in one Event naming each node, not once by each
// node; the same explanation is not repeated the next round.
func testExplainOncePerPod(t *testing.T, env *testenv.Env) {
	cfg := testConfig(config.ModePlugin, "ex2-ns")
	cfg.Apply.NodeSelector = "pool=ex2"
	h := newHarness(t, env, cfg, nil)
	h.namespace()
	h.podNamespace("ex2-team")
	h.configMap(map[string]string{"default": baseConfig})
	nodes := []string{"ex2-a", "ex2-b", "ex2-c", "ex2-d", "ex2-e"}
	for _, n := range nodes {
		h.node(n, map[string]string{ConfigLabel: "gpuslice-2", "pool": "ex2"}, 2)
		h.src.set(n, signal{gpus: 1, used: 47 * gib, peak: 23 * gib, allocated: 2, advertised: 2})
	}
	got := h.waitOneRound("ex2-team", "ex2", cfg.Interval)
	for _, want := range []string{"5 nodes: node ex2-a: no nvidia.com/gpu replica free", "| node ex2-b:", "| node ex2-c:", "| and 2 more node(s) alike"} {
		if !strings.Contains(got[0], want) {
			t.Errorf("Event %q lacks %q", got[0], want)
		}
	}
	h.advance(cfg.Interval)
	h.round()
	if got := withReason(h.events(), ReasonWaitingForReplica); len(got) != 0 {
		t.Errorf("the same explanation repeated the next round: %q", got)
	}
}

// podNamespace makes a namespace for the test's pods, emptied at the end.
func (h *harness) podNamespace(ns string) {
	h.env.CreateNamespace(h.t, ns)
	h.t.Cleanup(func() {
		_ = h.env.Client.CoreV1().Pods(ns).DeleteCollection(h.ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{})
	})
}

// waitOneRound makes pod ns/waits, unschedulable for want of a GPU replica
// on the nodes of pool, runs a round once the informers have it, and
// returns its one WaitingForReplica Event (failing the test without one).
func (h *harness) waitOneRound(ns, pool string, interval time.Duration) []string {
	h.t.Helper()
	h.pendingPod(ns, "waits", "", map[string]string{"pool": pool}, corev1.ResourceName(dpconfig.GPUResource), 1,
		[]corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}})
	h.round() // starts the informers; the pod may not be in them yet
	h.podsSynced()
	h.advance(interval)
	h.round()
	got := withReason(h.events(), ReasonWaitingForReplica)
	if len(got) != 1 {
		h.t.Fatalf("WaitingForReplica Events %q, want one for the pod", got)
	}
	return got
}

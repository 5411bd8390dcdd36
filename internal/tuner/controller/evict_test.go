package controller

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// testCrashLoops: a container that OOMs twice in a row on a full shared GPU
// has its pod evicted through the Eviction API when policy.evictCrashLoops
// is on and a controller owns the pod; otherwise it is left running. Either
// way one Event on the pod and one count of
// gpuslice_tuner_crash_loop_evictions_total say what was done, and a third
// round, with the loop still named, repeats neither.
func testCrashLoops(t *testing.T, env *testenv.Env) {
	for _, tc := range []struct {
		name, prefix string
		evict        bool
		dryRun       bool
		bare         bool
		pdb          bool
		result       string
		why          string // in the CrashLoopNotEvicted message
	}{
		{name: "a Deployment's pod is evicted", prefix: "cl-ev", evict: true, result: evictEvicted},
		{name: "a bare pod is not", prefix: "cl-bare", evict: true, bare: true, result: evictBare, why: "bare pod"},
		{name: "off: reported, not evicted", prefix: "cl-off", result: evictDisabled, why: "evictCrashLoops is off"},
		{name: "a PodDisruptionBudget blocks it", prefix: "cl-pdb", evict: true, pdb: true, result: evictPDB, why: "PodDisruptionBudget"},
		{name: "dry run evicts nothing", prefix: "cl-dry", evict: true, dryRun: true, result: evictDryRun, why: "dry run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(config.ModePlugin, tc.prefix+"-ns")
			cfg.Policy.EvictCrashLoops = tc.evict
			cfg.DryRun = tc.dryRun
			h := newHarness(t, env, cfg, nil)
			h.namespace()
			h.configMap(map[string]string{"default": baseConfig})
			node := tc.prefix + "-node"
			h.node(node, map[string]string{ConfigLabel: "gpuslice-4"}, 4) // 1 GPU × 4
			pod := h.loopingPod(node, !tc.bare)
			if tc.pdb {
				h.blockingPDB()
			}
			ctr := h.ns + "/" + pod.Name + "/main"

			// Two OOMs a round apart on a full GPU with 4 pods on it.
			start := time.Now()
			for range 2 {
				h.src.set(node, signal{gpus: 1, used: 47 * gib, peak: 20 * gib, allocated: 4, advertised: 4, oomAt: h.now, container: ctr})
				h.round()
				h.advance(cfg.Interval)
			}
			if took := time.Since(start); took > 20*time.Second {
				// client-go obeys a 429's Retry-After ten times over.
				t.Errorf("two rounds took %s: a refused eviction was retried within the round", took)
			}
			evs := h.events()
			got := testutil.ToFloat64(h.c.m.crashLoopEvictions.WithLabelValues(node, tc.result))
			if got != 1 {
				t.Errorf("crash_loop_evictions_total{result=%q} = %v, want 1; events %q", tc.result, got, evs)
			}
			after, err := env.Client.CoreV1().Pods(h.ns).Get(h.ctx, pod.Name, metav1.GetOptions{})
			gone := apierrors.IsNotFound(err) || (err == nil && after.DeletionTimestamp != nil)
			if err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			if tc.result == evictEvicted {
				if !gone {
					t.Errorf("pod %s not evicted", pod.Name)
				}
				if e := withReason(evs, ReasonCrashLoopEvicted); len(e) != 1 || !strings.HasPrefix(e[0], corev1.EventTypeNormal) || !strings.Contains(e[0], ctr) {
					t.Errorf("events %q, want one Normal %s naming %s", evs, ReasonCrashLoopEvicted, ctr)
				}
			} else {
				if gone {
					t.Errorf("pod %s was evicted", pod.Name)
				}
				if e := withReason(evs, ReasonCrashLoopNotEvicted); len(e) != 1 || !strings.HasPrefix(e[0], corev1.EventTypeWarning) || !strings.Contains(e[0], tc.why) {
					t.Errorf("events %q, want one Warning %s saying %q", evs, ReasonCrashLoopNotEvicted, tc.why)
				}
			}
			if tc.dryRun {
				// writes nothing, not even its record
			} else if r := h.record(node); r.LastChange == nil {
				t.Errorf("last decision %+v: no change stored after the OOMs, want the lowerings", r)
			} else if r.LastChangeDirection != policy.DirectionDown {
				t.Errorf("last decision %+v: the lowerings after the OOMs are stored without their direction", r)
			}

			// The loop is still in the window: not reported again.
			h.round()
			if evs := h.events(); len(withReason(evs, ReasonCrashLoopEvicted))+len(withReason(evs, ReasonCrashLoopNotEvicted)) != 0 {
				t.Errorf("the same loop reported again: %q", evs)
			}
			if got := testutil.ToFloat64(h.c.m.crashLoopEvictions.WithLabelValues(node, tc.result)); got != 1 {
				t.Errorf("after another round crash_loop_evictions_total{result=%q} = %v, want 1", tc.result, got)
			}
		})
	}
}

// loopingPod creates a running pod bound to node whose container crash
// loops, owned by a Deployment's ReplicaSet when owned (there is no
// controller-manager: nothing recreates it, the owner is only named).
func (h *harness) loopingPod(node string, owned bool) *corev1.Pod {
	h.t.Helper()
	labels := map[string]string{"app": "trainer", "pod-template-hash": "5d8f7c"}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer-5d8f7c-x2x9q", Namespace: h.ns, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "cuda"}}},
	}
	if owned {
		rs, err := h.env.Client.AppsV1().ReplicaSets(h.ns).Create(h.ctx, &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Name: "trainer-5d8f7c", Namespace: h.ns},
			Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: p.Spec}},
		}, metav1.CreateOptions{})
		if err != nil {
			h.t.Fatal(err)
		}
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: new(true)}}
	}
	pods := h.env.Client.CoreV1().Pods(h.ns)
	p, err := pods.Create(h.ctx, p, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	// Running: the API server evicts a Pending pod without asking its
	// PodDisruptionBudgets.
	p.Status.Phase = corev1.PodRunning
	p, err = pods.UpdateStatus(h.ctx, p, metav1.UpdateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		_ = h.env.Client.CoreV1().Pods(h.ns).Delete(h.ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	return p
}

// blockingPDB creates a PodDisruptionBudget over the looping pod that
// allows no disruption (and, with no controller-manager to compute its
// status, would block even one that did).
func (h *harness) blockingPDB() {
	h.t.Helper()
	zero := intstr.FromInt32(0)
	_, err := h.env.Client.PolicyV1().PodDisruptionBudgets(h.ns).Create(h.ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: h.ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &zero,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "trainer"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
}

// TestCrashLoopEvictedOncePerOOM: a pod is evicted once per loop; one that
// comes back under the same name (a StatefulSet's) is evicted again only
// after it OOMs again, and a loop unnamed for a policy window is forgotten.
func TestCrashLoopEvictedOncePerOOM(t *testing.T) {
	owner := []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "db", UID: "u", Controller: new(true)}}
	client := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "db-0", Namespace: "ml", OwnerReferences: owner}})
	evictions := 0
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		evictions++
		return true, nil, nil // the pod stays: it came back under its name
	})
	cfg := testConfig(config.ModePlugin, "ev-ns")
	cfg.Policy.EvictCrashLoops = true
	c, err := New(Options{Config: cfg, Client: client, Source: &fakeSource{}, Recorder: record.NewFakeRecorder(100)})
	if err != nil {
		t.Fatal(err)
	}
	w := &work{node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}, st: &nodeState{}}
	now := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	for i, step := range []struct {
		ooms    int
		advance time.Duration
		want    int
	}{
		{ooms: 2, want: 1},
		{ooms: 2, advance: cfg.Interval, want: 1}, // the same loop: its replacement has not OOMed
		{ooms: 3, advance: cfg.Interval, want: 2}, // it OOMed again
		{ooms: 3, advance: cfg.Interval, want: 2},
		{ooms: 0, advance: 2 * cfg.Policy.Window, want: 2}, // no loop named: forgotten
		{ooms: 3, advance: cfg.Interval, want: 3},          // a loop again
	} {
		now = now.Add(step.advance)
		var loops []policy.CrashLoop
		if step.ooms > 0 {
			loops = []policy.CrashLoop{{Container: "ml/db-0/main", GPU: "GPU-0", OOMs: step.ooms, Evict: true}}
		}
		c.crashLoops(t.Context(), w, loops, now)
		if evictions != step.want {
			t.Fatalf("step %d: %d evictions, want %d", i, evictions, step.want)
		}
	}
	if got := testutil.ToFloat64(c.m.crashLoopEvictions.WithLabelValues("n", evictEvicted)); got != 3 {
		t.Errorf("crash_loop_evictions_total{result=evicted} = %v, want 3", got)
	}
}

package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// TestRoundRobustness: what a round does with an unreadable record, a
// config error seen before a new leader read the node's hold, a context
// that ends mid-round, a node deleted mid-round, a slow gathering and a
// signal source that is down, against a real API server.
func TestRoundRobustness(t *testing.T) {
	env := testenv.Start(t)
	t.Run("an unreadable last decision leaves the node alone", func(t *testing.T) { testUnreadableRecord(t, env) })
	t.Run("restart mode: an unreadable last decision holds the key", func(t *testing.T) { testUnreadableRecordRestart(t, env) })
	t.Run("a config error before adopt keeps the hold", func(t *testing.T) { testInvalidKeepsHold(t, env) })
	t.Run("a write cut short is no apply failure", func(t *testing.T) { testWriteCutShort(t, env) })
	t.Run("an eviction cut short is no outcome", func(t *testing.T) { testEvictionCutShort(t, env) })
	t.Run("a deleted node's series go", func(t *testing.T) { testDeletedNodeSeries(t, env) })
	t.Run("writes get their budget after a slow gathering", func(t *testing.T) { testSlowGathering(t, env) })
	t.Run("failed rounds are counted", func(t *testing.T) { testRoundFailures(t, env) })
	t.Run("shutdown ends a hung gathering", func(t *testing.T) { testShutdownDuringGathering(t, env) })
}

// testShutdownDuringGathering: SIGTERM while the signal source does not
// answer ends the round at once (the gathering writes nothing) and starts
// no other, though the next tick is due; it is no failed round. Before,
// the round waited out its budget (the prometheus source's 30 s, past a
// pod's default grace period) and a tick already due could start another.
func testShutdownDuringGathering(t *testing.T, env *testenv.Env) {
	h := oneNodeScenario(t, env, config.ModeConfigManager, "sd", false, func(c *config.Config) { c.Interval = time.Millisecond })
	h.start()
	h.c.roundBudget = time.Hour
	h.src.set("sd-node", headroom(1))
	begun := make(chan struct{}, 1) // Observe's word is kept until read
	h.src.hang = begun
	var errs []error
	h.c.afterRound = func(e error) { errs = append(errs, e) }
	defer func() { h.c.afterRound = nil }()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.c.loop(h.ctx, stop)
	}()
	<-begun
	time.Sleep(10 * time.Millisecond) // the next tick is due
	close(stop)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the loop still runs 30 s after shutdown began, its gathering hung")
	}
	h.src.mu.Lock()
	calls := h.src.calls
	h.src.mu.Unlock()
	if calls != 1 || len(errs) != 1 || !errors.Is(errs[0], errStopped) {
		t.Errorf("%d gatherings, rounds ended with %v; want one, stopped", calls, errs)
	}
	if got := testutil.ToFloat64(h.c.m.roundFailures); got != 0 {
		t.Errorf("round_failures_total = %v, want a shutdown not counted", got)
	}
}

// heldNode is a node held after a failed verification at 5 replicas
// (as in testVerifyFailure), its Events drained.
func heldNode(t *testing.T, env *testenv.Env, ns string) (*harness, string) {
	t.Helper()
	cfg := testConfig(config.ModeConfigManager, ns)
	cfg.Apply.NodeSelector = "scenario=" + ns
	cfg.Policy.Cooldown = 0 // the policy would raise every round
	h := newHarness(t, env, cfg, nil)
	h.namespace()
	h.configMap(map[string]string{"default": baseConfig})
	node := ns + "-node"
	h.node(node, map[string]string{"scenario": ns}, 8)
	h.src.set(node, headroom(2))
	h.round()
	taken := headroom(2)
	taken.allocated = 5
	h.src.set(node, taken)
	h.advance(10 * time.Second)
	h.round()
	h.advance(time.Minute) // past verifyTimeout: held
	h.round()
	if r := h.record(node); r.Hold == nil || h.getNode(node).Labels[ConfigLabel] != "gpuslice-5" {
		t.Fatalf("setup: want a hold at gpuslice-5, got %+v", r)
	}
	h.events()
	return h, node
}

func (h *harness) setAnnotation(node, key, val string) { h.patchMeta(node, "annotations", key, val) }

func (h *harness) setLabel(node, key, val string) { h.patchMeta(node, "labels", key, val) }

// patchMeta sets one of a node's labels or annotations (field), as another
// writer would.
func (h *harness) patchMeta(node, field, key, val string) {
	h.t.Helper()
	p, err := json.Marshal(map[string]any{"metadata": map[string]any{field: map[string]string{key: val}}})
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.env.Client.CoreV1().Nodes().Patch(h.ctx, node, types.MergePatchType, p, metav1.PatchOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// newLeadership runs one round as a new leadership would (loop), once
// the informer has caught up; it returns the round's error.
func (h *harness) newLeadership() error {
	h.t.Helper()
	h.start()
	var err error
	stop := make(chan struct{})
	h.c.afterRound = func(e error) { err = e; close(stop) } // one round
	defer func() { h.c.afterRound = nil }()
	h.c.loop(h.ctx, stop)
	return err
}

// testUnreadableRecord: a last decision that does not parse (garbage, or a
// field of another type) may hide a hold; the node is left as it is, the
// annotation is not overwritten, and one Warning Event names the node and
// the annotation. Before, a new leader read it as no record and changed
// the held node.
func testUnreadableRecord(t *testing.T, env *testenv.Env) {
	for _, tc := range []struct{ ns, bad string }{
		{"ur-garbage", `{"time": garbage`},
		{"ur-type", ""}, // "replicas":"5" in the real record
	} {
		t.Run(tc.ns, func(t *testing.T) {
			h, node := heldNode(t, env, tc.ns)
			good := h.getNode(node).Annotations[AnnotationLastDecision]
			bad := tc.bad
			if bad == "" {
				bad = strings.Replace(good, `"replicas":5,`, `"replicas":"5",`, 1)
				if bad == good {
					t.Fatalf("no replicas field to retype in %s", good)
				}
			}
			h.setAnnotation(node, AnnotationLastDecision, bad)
			h.advance(10 * time.Second)
			if err := h.newLeadership(); err != nil {
				t.Fatal(err)
			}
			h.advance(10 * time.Second)
			h.round() // not reported again
			n := h.getNode(node)
			if got := n.Labels[ConfigLabel]; got != "gpuslice-5" {
				t.Errorf("label %q after new leaderships, want the held gpuslice-5", got)
			}
			if got := n.Annotations[AnnotationLastDecision]; got != bad {
				t.Errorf("the unreadable annotation was overwritten: %s", got)
			}
			ev := h.events()
			if u := withReason(ev, ReasonDecisionUnreadable); len(u) != 1 || !strings.HasPrefix(u[0], corev1.EventTypeWarning) ||
				!strings.Contains(u[0], node) || !strings.Contains(u[0], AnnotationLastDecision) {
				t.Errorf("events %q, want one Warning %s naming %s and %s", ev, ReasonDecisionUnreadable, node, AnnotationLastDecision)
			}
			if len(ev) != 1 {
				t.Errorf("events %q, want only the one about the record", ev)
			}

			// Once it parses again, its hold is kept.
			h.setAnnotation(node, AnnotationLastDecision, good)
			h.advance(10 * time.Second)
			h.round()
			if got := h.getNode(node).Labels[ConfigLabel]; got != "gpuslice-5" {
				t.Errorf("label %q once the record parses, want the held gpuslice-5", got)
			}
		})
	}
}

// testUnreadableRecordRestart: in restart mode one key serves every node,
// so a node whose record cannot be read (it may hold a hold) holds the
// key's change; its annotation is left as it is.
func testUnreadableRecordRestart(t *testing.T, env *testenv.Env) {
	h := oneNodeScenario(t, env, config.ModeRestart, "ur-rs", true, nil)
	const node = "ur-rs-node"
	h.src.set(node, headroom(1)) // would raise 4 -> 5
	const bad = `{"time": garbage`
	h.setAnnotation(node, AnnotationLastDecision, bad)
	h.round()
	h.advance(10 * time.Second)
	h.round()
	if got := replicasOf(t, h.getConfigMap().Data["default"]); got != 4 {
		t.Errorf("key has %d replicas, want 4: changed while a node's record is unreadable", got)
	}
	if got := h.getNode(node).Annotations[AnnotationLastDecision]; got != bad {
		t.Errorf("the unreadable annotation was overwritten: %s", got)
	}
	if ev := h.events(); len(withReason(ev, ReasonDecisionUnreadable)) != 1 {
		t.Errorf("events %q, want one %s", ev, ReasonDecisionUnreadable)
	}
}

// testInvalidKeepsHold: a new leader whose first round finds the held
// node's config invalid records ConfigInvalid before it has read the hold
// (adopt); the record it writes keeps the hold, so the node stays held
// once the config is fixed. Before, it was written without it.
func testInvalidKeepsHold(t *testing.T, env *testenv.Env) {
	h, node := heldNode(t, env, "ih")
	const broken = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 1\n"
	cm := h.getConfigMap()
	good := cm.Data["gpuslice-5"]
	cm.Data["gpuslice-5"] = broken
	if _, err := h.env.Client.CoreV1().ConfigMaps(h.ns).Update(h.ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.advance(10 * time.Second)
	if err := h.newLeadership(); err != nil {
		t.Fatal(err)
	}
	r := h.record(node)
	if r.Reason != ReasonConfigInvalid {
		t.Fatalf("record %+v, want %s", r, ReasonConfigInvalid)
	}
	if r.Hold == nil || r.Hold.Replicas != 5 {
		t.Errorf("the ConfigInvalid record dropped the hold: %+v", r)
	}
	cm = h.getConfigMap()
	cm.Data["gpuslice-5"] = good
	if _, err := h.env.Client.CoreV1().ConfigMaps(h.ns).Update(h.ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.advance(10 * time.Second)
	h.round()
	if got := h.getNode(node).Labels[ConfigLabel]; got != "gpuslice-5" {
		t.Errorf("label %q once the config is fixed, want the held gpuslice-5", got)
	}
	if r := h.record(node); r.Hold == nil {
		t.Errorf("record %+v lost the hold", r)
	}
}

// testWriteCutShort: a write that does not happen because the round's
// context ended (leadership lost, or the round's deadline), or because the
// node was deleted meanwhile, is no ApplyFailed Event and no count of
// gpuslice_tuner_apply_failures_total.
func testWriteCutShort(t *testing.T, env *testenv.Env) {
	for _, how := range []string{"cancel", "delete"} {
		t.Run(how, func(t *testing.T) {
			ns := "wc-" + how
			node := ns + "-node"
			cfg := testConfig(config.ModeConfigManager, ns)
			cfg.Apply.NodeSelector = "scenario=" + ns
			var cancel context.CancelFunc
			ic := &interceptor{match: func(r *http.Request) bool {
				return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/nodes/"+node)
			}}
			ic.before = func() {
				if how == "cancel" {
					cancel()
					return
				}
				if err := env.Client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}); err != nil {
					t.Error(err)
				}
			}
			h := newHarness(t, env, cfg, interceptedClient(t, env.Config, ic))
			h.namespace()
			h.configMap(map[string]string{"default": baseConfig})
			h.node(node, map[string]string{"scenario": ns}, 8)
			h.src.set(node, headroom(2)) // raises 4 -> 5: the label's write reads the node
			h.roundCutShort(ic, &cancel)
			if ev := h.events(); len(withReason(ev, ReasonApplyFailed)) != 0 {
				t.Errorf("events %q, want no %s", ev, ReasonApplyFailed)
			}
			if got := testutil.ToFloat64(h.c.m.applyFailures.WithLabelValues(node)); got != 0 {
				t.Errorf("apply_failures_total = %v, want 0", got)
			}
		})
	}
}

// roundCutShort runs one round under a context that ic's before may end
// through *cancel, and fails the test unless ic matched a request.
func (h *harness) roundCutShort(ic *interceptor, cancel *context.CancelFunc) {
	h.t.Helper()
	h.start()
	ctx, stop := context.WithCancel(h.ctx)
	defer stop()
	*cancel = stop
	_ = h.c.round(ctx, nil)
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if !ic.fired {
		h.t.Fatal("the round never sent the request it was to be cut short at")
	}
}

// testEvictionCutShort: a crash loop whose eviction is cut short by the
// end of the round's context has no outcome yet: no CrashLoopNotEvicted
// Event, no count of result "error"; the next round evicts it.
func testEvictionCutShort(t *testing.T, env *testenv.Env) {
	const prefix = "ec"
	cfg := testConfig(config.ModePlugin, prefix+"-ns")
	cfg.Apply.NodeSelector = "scenario=" + prefix
	cfg.Policy.EvictCrashLoops = true
	var armed atomic.Bool
	var cancel context.CancelFunc
	ic := &interceptor{
		match: func(r *http.Request) bool {
			return armed.Load() && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/eviction")
		},
		before: func() { cancel() },
	}
	h := newHarness(t, env, cfg, interceptedClient(t, env.Config, ic))
	h.namespace()
	h.configMap(map[string]string{"default": baseConfig})
	node := prefix + "-node"
	h.node(node, map[string]string{ConfigLabel: "gpuslice-4", "scenario": prefix}, 4)
	pod := h.loopingPod(node, true)
	ctr := h.ns + "/" + pod.Name + "/main"
	oom := func() {
		h.src.set(node, signal{gpus: 1, used: 47 * gib, peak: 20 * gib, allocated: 4, advertised: 4, oomAt: h.now, container: ctr})
	}

	oom()
	h.round() // one OOM: no loop yet
	h.advance(cfg.Interval)
	oom()
	armed.Store(true)
	h.roundCutShort(ic, &cancel)
	ev := h.events()
	if n := withReason(ev, ReasonCrashLoopNotEvicted); len(n) != 0 {
		t.Errorf("events %q, want no %s for an eviction cut short", n, ReasonCrashLoopNotEvicted)
	}
	if got := testutil.ToFloat64(h.c.m.crashLoopEvictions.WithLabelValues(node, evictError)); got != 0 {
		t.Errorf("crash_loop_evictions_total{result=error} = %v, want 0", got)
	}
	h.advance(cfg.Interval)
	h.round()
	if got := testutil.ToFloat64(h.c.m.crashLoopEvictions.WithLabelValues(node, evictEvicted)); got != 1 {
		t.Errorf("crash_loop_evictions_total{result=evicted} = %v after the next round, want 1; events %q", got, h.events())
	}
}

// testDeletedNodeSeries: the series of a deleted node, counters included,
// go at the next round; a node that is only no longer selected keeps its
// counters.
func testDeletedNodeSeries(t *testing.T, env *testenv.Env) {
	const ns = "dn"
	cfg := testConfig(config.ModeConfigManager, ns)
	cfg.Apply.NodeSelector = "scenario=" + ns
	reg := prometheus.NewRegistry()
	h := newHarness(t, env, cfg, nil, func(o *Options) { o.Registerer = reg })
	h.namespace()
	h.configMap(map[string]string{"default": baseConfig})
	for i := range 3 {
		n := fmt.Sprintf("%s-%d", ns, i)
		h.node(n, map[string]string{"scenario": ns}, 4)
		h.src.set(n, headroom(1))
	}
	h.round()
	series := func(node string) int {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		c := 0
		for _, mf := range mfs {
			for _, m := range mf.Metric {
				for _, l := range m.Label {
					if l.GetName() == "node" && l.GetValue() == node {
						c++
					}
				}
			}
		}
		return c
	}
	for i := range 3 {
		if n := series(fmt.Sprintf("%s-%d", ns, i)); n == 0 {
			t.Fatalf("setup: node %d has no series", i)
		}
	}
	for _, n := range []string{ns + "-0", ns + "-1"} {
		if err := env.Client.CoreV1().Nodes().Delete(h.ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		h.src.mu.Lock()
		delete(h.src.nodes, n)
		h.src.mu.Unlock()
	}
	// The third is only taken out of the selector.
	h.setLabel(ns+"-2", "scenario", "elsewhere")
	h.advance(10 * time.Second)
	h.round()
	for _, n := range []string{ns + "-0", ns + "-1"} {
		if c := series(n); c != 0 {
			t.Errorf("deleted node %s still has %d series", n, c)
		}
	}
	if got, err := testutil.GatherAndCount(reg, "gpuslice_tuner_changes_total"); err != nil || got != 2 {
		t.Errorf("%d changes_total series (%v), want the unselected node's 2", got, err)
	}
	if c := series(ns + "-2"); c == 0 {
		t.Error("an unselected node that still exists lost its counters")
	}
}

// testSlowGathering: a gathering that takes the whole round budget (the
// prometheus source's 30 s timeout is the default budget) leaves the writes
// their own budget. Before, one budget covered both, and every write of
// such a round failed on a context already ended.
func testSlowGathering(t *testing.T, env *testenv.Env) {
	h := oneNodeScenario(t, env, config.ModeConfigManager, "sg", false, nil)
	const node = "sg-node"
	h.c.roundBudget = time.Second
	h.src.set(node, headroom(1))
	h.src.took = func() { time.Sleep(1200 * time.Millisecond) }
	if err := h.newLeadership(); err != nil {
		t.Errorf("round: %v", err)
	}
	if got := h.getNode(node).Labels[ConfigLabel]; got != "gpuslice-5" {
		t.Errorf("label %q, want the raise written after a slow gathering; events %q", got, h.events())
	}
}

// testRoundFailures: a round that fails (its signal source down) counts
// gpuslice_tuner_round_failures_total; one that succeeds sets
// gpuslice_tuner_last_successful_round_timestamp_seconds, which goes when
// the replica stops leading.
func testRoundFailures(t *testing.T, env *testenv.Env) {
	reg := prometheus.NewRegistry()
	h := oneNodeScenario(t, env, config.ModeConfigManager, "rfl", false, nil)
	h.c.m = newMetrics(reg)
	const name = "gpuslice_tuner_last_successful_round_timestamp_seconds"
	h.src.set("rfl-node", headroom(1))
	h.src.fail = errors.New("prometheus: connection refused")
	if err := h.newLeadership(); err == nil {
		t.Fatal("round with its source down succeeded")
	}
	if got := testutil.ToFloat64(h.c.m.roundFailures); got != 1 {
		t.Errorf("round_failures_total = %v, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 0 {
		t.Errorf("%s: %d series (%v) before any successful round, want none", name, n, err)
	}
	h.src.fail = nil
	h.advance(10 * time.Second)
	if err := h.newLeadership(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(h.c.m.lastSuccessfulRound.WithLabelValues()); got != float64(h.now.Unix()) {
		t.Errorf("%s = %v, want %d", name, got, h.now.Unix())
	}
	if got := testutil.ToFloat64(h.c.m.roundFailures); got != 1 {
		t.Errorf("round_failures_total = %v after a successful round, want 1", got)
	}
	h.c.m.stepDown()
	if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 0 {
		t.Errorf("%s: %d series (%v) after stepping down, want none", name, n, err)
	}
}

// TestOwnerLookupsPerRound: the pods read for their owners are bounded per
// round, over every node, as documented ("at most 32 new pods a round");
// before, each node had its own 32.
func TestOwnerLookupsPerRound(t *testing.T) {
	client := fake.NewClientset()
	var gets int
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets++
		return false, nil, nil // NotFound: the pod is gone
	})
	o := &owners{client: client, known: map[string]ownerEntry{}}
	now := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	node := func(n int) []policy.GPUObservation {
		peaks := map[string]uint64{}
		for p := range 40 {
			peaks[fmt.Sprintf("ml/pod-%d-%d/main", n, p)] = gib
		}
		return []policy.GPUObservation{{UUID: "GPU-0", Samples: []policy.Sample{{Time: now, ContainerPeaks: peaks}}}}
	}
	o.newRound()
	for n := range 3 {
		o.containerWorkloads(t.Context(), now, node(n))
	}
	if gets != maxOwnerLookups {
		t.Errorf("%d pods read in one round over 3 nodes, want %d", gets, maxOwnerLookups)
	}
	o.newRound()
	o.containerWorkloads(t.Context(), now, node(1))
	if gets != 2*maxOwnerLookups {
		t.Errorf("%d pods read after a second round, want %d", gets, 2*maxOwnerLookups)
	}
}

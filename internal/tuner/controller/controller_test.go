package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// TestAgainstAPIServer runs every controller scenario against one real
// kube-apiserver and etcd; each scenario has its own namespace and nodes.
func TestAgainstAPIServer(t *testing.T) {
	env := testenv.Start(t)
	t.Run("config-manager", func(t *testing.T) { testPerNodeMode(t, env, config.ModeConfigManager, "cm") })
	t.Run("plugin", func(t *testing.T) { testPerNodeMode(t, env, config.ModePlugin, "pl") })
	t.Run("restart", func(t *testing.T) { testRestartMode(t, env) })
	t.Run("conflicting edits survive", func(t *testing.T) { testConflicts(t, env) })
	t.Run("unparseable configs are never overwritten", func(t *testing.T) { testInvalidConfigs(t, env) })
	t.Run("dry run writes nothing", func(t *testing.T) { testDryRun(t, env) })
	t.Run("verify failure holds the node", func(t *testing.T) { testVerifyFailure(t, env) })
	t.Run("leader killed mid-run, one change", func(t *testing.T) { testLeaderHandover(t, env) })
	t.Run("a pending pod raises", func(t *testing.T) { testPendingPod(t, env) })
	t.Run("workload memory survives a restart", func(t *testing.T) { testWorkloadMemory(t, env) })
	t.Run("a waiting pod is told who idles", func(t *testing.T) { testExplainWaiting(t, env) })
	t.Run("a pod that may run on several nodes gets one explanation", func(t *testing.T) { testExplainOncePerPod(t, env) })
	t.Run("RBAC manifest is enough and no more", func(t *testing.T) { testRBAC(t, env) })
	t.Run("DRA node: advice, no config", func(t *testing.T) { testDRANode(t, env) })
	t.Run("NVIDIA's config-manager", func(t *testing.T) { testNVIDIAConfigManager(t, env) })
	t.Run("crash loops", func(t *testing.T) { testCrashLoops(t, env) })
	t.Run("restart mode stores a change's direction", func(t *testing.T) { testRestartDirection(t, env) })
	t.Run("restart mode tells a failed restart as one", func(t *testing.T) { testRestartFailureTold(t, env) })
	t.Run("restart mode without the ConfigMap's last change", func(t *testing.T) { testRestartLostLastChange(t, env) })
	t.Run("a later restart is not stamped back", func(t *testing.T) { testRestartNotStampedBack(t, env) })
	t.Run("named configs are stamped when written", func(t *testing.T) { testConfigsStampedWhenWritten(t, env) })
	t.Run("a new leadership forgets the last one's node state", func(t *testing.T) { testNewLeadership(t, env) })
	t.Run("a GPU node without signals is reported when the lapse starts", func(t *testing.T) { testNoSignals(t, env) })
}

// pluginScenario is a plugin-mode tuner selecting only the nodes labelled
// scenario=ns, with the base config and one node of 4 replicas.
func pluginScenario(t *testing.T, env *testenv.Env, ns, node string) *harness {
	t.Helper()
	cfg := testConfig(config.ModePlugin, ns)
	cfg.Apply.NodeSelector = "scenario=" + ns
	h := newHarness(t, env, cfg, nil)
	h.namespace()
	h.configMap(map[string]string{"default": baseConfig})
	h.node(node, map[string]string{"scenario": ns}, 4)
	return h
}

// testNoSignals: a selected GPU node the source has no samples for is left
// alone, and the operator is told once per lapse that lasts; a node
// without GPUs is not a lapse.
func testNoSignals(t *testing.T, env *testenv.Env) {
	const ns, node = "us-ns", "us-node"
	h := pluginScenario(t, env, ns, node)
	if _, err := env.Client.CoreV1().Nodes().Create(h.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "us-cpu", Labels: map[string]string{"scenario": ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	noSignals := func(when string, want int) {
		t.Helper()
		got := withReason(h.events(), ReasonNoSignals)
		if len(got) != want {
			t.Errorf("%s: %d %s Events %q, want %d", when, len(got), ReasonNoSignals, got, want)
		}
		for _, e := range got {
			if !strings.Contains(e, "Warning") || !strings.Contains(e, "signals.source exporters") {
				t.Errorf("%s: %q does not say which source had nothing", when, e)
			}
		}
	}
	// Told once the lapse has lasted two sample intervals or a round,
	// whichever is longer (20 s here):
	// a leadership's first rounds may come before the first scrape.
	after := func(d time.Duration, when string, want int) {
		t.Helper()
		h.advance(d)
		h.round()
		noSignals(when, want)
	}
	after(0, "first round", 0)
	after(10*time.Second, "10 s in", 0)
	after(10*time.Second, "20 s in", 1)
	if l := h.getNode(node).Labels[ConfigLabel]; l != "" {
		t.Errorf("a node without signals was moved to %q", l)
	}
	after(10*time.Second, "the lapse goes on", 0)
	h.src.set(node, headroom(1))
	after(10*time.Second, "signals back", 0)
	h.src.mu.Lock()
	delete(h.src.nodes, node)
	h.src.mu.Unlock()
	after(10*time.Second, "a second lapse begins", 0)
	after(20*time.Second, "a second lapse, 20 s in", 1)
}

// testNewLeadership: what a replica knew of a node when it last led (a
// hold, a change to verify, whether it had read the node's annotation) is
// stale when it leads again, since another leader may have acted since.
// A leadership starts from the nodes' annotations, as a new replica does.
func testNewLeadership(t *testing.T, env *testenv.Env) {
	const ns, node = "nl-ns", "nl-node"
	h := pluginScenario(t, env, ns, node)
	h.src.set(node, headroom(1))
	h.round()
	st := h.c.state[node]
	if st == nil {
		t.Fatalf("no state for %s after a round", node)
	}
	st.held = &hold{replicas: 4, until: time.Now().Add(time.Hour), why: "from an earlier leadership"}
	st.adopted = true
	lead, cancel := context.WithCancel(context.Background())
	cancel() // one round, then the leadership ends
	h.c.loop(lead, nil)
	if st := h.c.state[node]; st != nil && (st.held != nil || st.adopted) {
		t.Errorf("after a new leadership's first round, %s keeps the earlier leadership's state: held %v, adopted %v", node, st.held, st.adopted)
	}
}

// pluginReads resolves a node's config the way gpuslice-plugin's
// --config.source=kubernetes and NVIDIA's config-manager do: the key named
// by the node's label, else the default key.
func pluginReads(h *harness, node string) (key, data string) {
	h.t.Helper()
	key = h.getNode(node).Labels[ConfigLabel]
	if key == "" {
		key = h.c.cfg.Apply.Key
	}
	data, ok := h.getConfigMap().Data[key]
	if !ok {
		h.t.Fatalf("ConfigMap has no key %q for node %s", key, node)
	}
	return key, data
}

func testPerNodeMode(t *testing.T, env *testenv.Env, mode, prefix string) {
	spans := tracetest.NewSpanRecorder()
	cfg := testConfig(mode, prefix+"-ns")
	cfg.Apply.PropagationDelay = config.Default().Apply.PropagationDelay
	h := newHarness(t, env, cfg, nil, func(o *Options) {
		o.Tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)).Tracer("test")
	})
	h.namespace()
	other := "# another team's config\nversion: v1\n"
	h.configMap(map[string]string{"default": baseConfig, "other": other})
	node, busy := prefix+"-node", prefix+"-busy"
	h.node(node, nil, 8)                                          // 2 GPUs × 4
	h.node(busy, map[string]string{ConfigLabel: "gpuslice-4"}, 4) // 1 GPU × 4
	h.src.set(node, headroom(2))
	h.src.set(busy, signal{gpus: 1, used: 20 * gib, peak: 10 * gib, allocated: 3}) // a replica free: hold

	h.round()
	if mode == config.ModeConfigManager {
		// The keys were just written: config-manager cannot see them
		// before the kubelet refreshes its ConfigMap volume.
		if r := h.record(node); r.Reason != ReasonAwaitingPropagation || r.Replicas != 4 || h.getNode(node).Labels[ConfigLabel] != "" {
			t.Errorf("first round: last decision %+v, label %q; want an AwaitingPropagation hold at 4, no label", r, h.getNode(node).Labels[ConfigLabel])
		}
		h.advance(h.c.cfg.Apply.PropagationDelay)
		h.round()
	}

	cm := h.getConfigMap()
	if cm.Data["default"] != baseConfig || cm.Data["other"] != other {
		t.Errorf("keys the tuner does not own changed:\ndefault:\n%s\nother:\n%s", cm.Data["default"], cm.Data["other"])
	}
	for n := 1; n <= 8; n++ {
		data, ok := cm.Data[fmt.Sprintf("gpuslice-%d", n)]
		if !ok {
			t.Errorf("no named config gpuslice-%d", n)
			continue
		}
		if got := replicasOf(t, data); got != n {
			t.Errorf("gpuslice-%d has %d replicas", n, got)
		}
		if !strings.Contains(data, "deviceListStrategy: envvar") {
			t.Errorf("gpuslice-%d lost a field the tuner does not own:\n%s", n, data)
		}
	}
	if strings.Contains(cm.Data["gpuslice-1"], "sharing") {
		t.Errorf("gpuslice-1 must be a config without sharing:\n%s", cm.Data["gpuslice-1"])
	}

	key, data := pluginReads(h, node)
	if key != "gpuslice-5" || replicasOf(t, data) != 5 {
		t.Errorf("the plugin reads key %q with %d replicas, want gpuslice-5 with 5", key, replicasOf(t, data))
	}
	if got := h.getNode(node).Annotations[AnnotationReplicas]; got != "5" {
		t.Errorf("%s = %q, want 5", AnnotationReplicas, got)
	}
	rec := h.record(node)
	if rec.Replicas != 5 || rec.Direction != policy.DirectionUp || rec.Reason != policy.ReasonSustainedHeadroom || rec.LastChange == nil || !rec.LastChange.Equal(h.now) {
		t.Errorf("last decision %+v", rec)
	}
	if key, _ := pluginReads(h, busy); key != "gpuslice-4" {
		t.Errorf("the busy node moved to %s", key)
	}
	if r := h.record(busy); r.Reason != policy.ReasonFreeReplicas || r.Replicas != 4 {
		t.Errorf("busy node's last decision %+v, want a FreeReplicas hold at 4", r)
	}
	ev := h.events()
	if raised := withReason(ev, ReasonReplicasRaised); len(raised) != 1 || !strings.Contains(raised[0], "4 -> 5") {
		t.Errorf("events %q, want one ReplicasRaised 4 -> 5", ev)
	}
	m := h.c.m
	if got := testutil.ToFloat64(m.changes.WithLabelValues(node, "nvidia.com/gpu", "up")); got != 1 {
		t.Errorf("changes_total{up} = %v", got)
	}
	if got := testutil.ToFloat64(m.replicas.WithLabelValues(node, "nvidia.com/gpu")); got != 5 {
		t.Errorf("replicas = %v", got)
	}
	if got := testutil.ToFloat64(m.replicas.WithLabelValues(busy, "nvidia.com/gpu")); got != 4 {
		t.Errorf("busy replicas = %v", got)
	}
	if got := testutil.ToFloat64(m.lastChange.WithLabelValues(node)); got != float64(h.now.Unix()) {
		t.Errorf("last change = %v", got)
	}

	t.Run("a span per decision with its inputs", func(t *testing.T) {
		var found bool
		for _, s := range spans.Ended() {
			attrs := map[attribute.Key]attribute.Value{}
			for _, kv := range s.Attributes() {
				attrs[kv.Key] = kv.Value
			}
			if s.Name() != SpanDecide || attrs["k8s.node.name"].AsString() != node {
				continue
			}
			found = true
			if attrs["gpuslice.replicas.current"].AsInt64() != 4 || attrs["gpuslice.replicas.decided"].AsInt64() != 5 ||
				attrs["gpuslice.reason"].AsString() != policy.ReasonSustainedHeadroom {
				t.Errorf("decision attributes %v", attrs)
			}
			if u := attrs["gpuslice.gpu.uuids"].AsStringSlice(); len(u) != 2 {
				t.Errorf("uuids %v", u)
			}
			if tot := attrs["gpuslice.gpu.memory_total_bytes"].AsInt64Slice(); len(tot) != 2 || tot[0] != int64(48*gib) {
				t.Errorf("memory totals %v", tot)
			}
			if p := attrs["gpuslice.gpu.container_peak_bytes"].AsInt64Slice(); len(p) != 2 || p[0] != int64(6*gib) {
				t.Errorf("peaks %v", p)
			}
			if n := attrs["gpuslice.gpu.samples"].AsInt64Slice(); len(n) != 2 || n[0] != 7 {
				t.Errorf("samples %v, want 7 per GPU (one minute every 10s)", n)
			}
		}
		if !found {
			t.Errorf("no %s span for %s among %d spans", SpanDecide, node, len(spans.Ended()))
		}
	})

	t.Run("nothing to change, nothing written", func(t *testing.T) {
		h.advance(10 * time.Second)
		h.round() // the hold is recorded once (Cooldown)
		cmRV, nodeRV, busyRV := h.getConfigMap().ResourceVersion, h.getNode(node).ResourceVersion, h.getNode(busy).ResourceVersion
		for range 3 {
			h.advance(10 * time.Second)
			h.round()
		}
		if got := h.getConfigMap().ResourceVersion; got != cmRV {
			t.Errorf("ConfigMap written again (resourceVersion %s -> %s)", cmRV, got)
		}
		if got := h.getNode(node).ResourceVersion; got != nodeRV {
			t.Errorf("node written again (resourceVersion %s -> %s)", nodeRV, got)
		}
		if got := h.getNode(busy).ResourceVersion; got != busyRV {
			t.Errorf("busy node written again (resourceVersion %s -> %s)", busyRV, got)
		}
		if r := h.record(node); r.Direction != policy.DirectionNone || r.Replicas != 5 || r.LastChange == nil {
			t.Errorf("last decision %+v, want a hold at 5 keeping lastChange", r)
		}
	})

	t.Run("verified", func(t *testing.T) {
		h.setAllocatable(node, "nvidia.com/gpu", 10)
		h.advance(10 * time.Second)
		h.round()
		if v := withReason(h.events(), ReasonReplicasVerified); len(v) != 1 || !strings.Contains(v[0], "10 nvidia.com/gpu") {
			t.Errorf("events %q, want one ReplicasVerified", v)
		}
	})

	t.Run("lowered at once on an OOM", func(t *testing.T) {
		s := headroom(2)
		s.allocated = 5
		s.oomAt = h.now.Add(5 * time.Second)
		h.src.set(node, s)
		h.advance(10 * time.Second) // well inside the cooldown
		h.round()
		if key, data := pluginReads(h, node); key != "gpuslice-4" || replicasOf(t, data) != 4 {
			t.Errorf("after an OOM with 5 allocated the plugin reads %s, want gpuslice-4", key)
		}
		if l := withReason(h.events(), ReasonReplicasLowered); len(l) != 1 || !strings.Contains(l[0], policy.ReasonGPUOOM) {
			t.Errorf("events %q, want one ReplicasLowered for GPUOOM", l)
		}
		if got := testutil.ToFloat64(h.c.m.changes.WithLabelValues(node, "nvidia.com/gpu", "down")); got != 1 {
			t.Errorf("changes_total{down} = %v", got)
		}
	})
}

func testRestartMode(t *testing.T, env *testenv.Env) {
	cfg := testConfig(config.ModeRestart, "rs-ns")
	cfg.Apply.NodeSelector = "scenario=restart" // the other scenarios' nodes share the API server
	h := newHarness(t, env, cfg, nil)
	h.namespace()
	base := strings.Replace(baseConfig, "replicas: 4", "replicas: 2", 1)
	other := "version: v1\n"
	h.configMap(map[string]string{"default": base, "other": other})
	h.daemonSet()
	mine := map[string]string{"scenario": "restart"}
	h.node("rs-a", mine, 2)
	h.node("rs-b", mine, 4)
	// Every replica of the cluster's count (2) taken on each GPU.
	ra, rb := headroom(1), headroom(2)
	ra.allocated, rb.allocated = 2, 2
	h.src.set("rs-a", ra)
	h.src.set("rs-b", rb)

	h.round()
	cm := h.getConfigMap()
	if got := replicasOf(t, cm.Data["default"]); got != 3 {
		t.Errorf("key has %d replicas, want 3", got)
	}
	if want := strings.Replace(base, "replicas: 2", "replicas: 3", 1); cm.Data["default"] != want {
		t.Errorf("key rewritten beyond its replicas:\n%s\nwant:\n%s", cm.Data["default"], want)
	}
	if cm.Data["other"] != other || len(cm.Data) != 2 {
		t.Errorf("other keys changed: %v", cm.Data)
	}
	stamp := h.now.UTC().Format(time.RFC3339)
	if got := cm.Annotations[AnnotationLastChange]; got != stamp {
		t.Errorf("ConfigMap %s = %q, want %q", AnnotationLastChange, got, stamp)
	}
	if got := h.getDaemonSet().Spec.Template.Annotations[AnnotationRestartedAt]; got != stamp {
		t.Errorf("DaemonSet template %s = %q, want %q", AnnotationRestartedAt, got, stamp)
	}
	if r := withReason(h.events(), ReasonReplicasRaised); len(r) != 2 {
		t.Errorf("events %q, want ReplicasRaised on both nodes", r)
	}
	for _, n := range []string{"rs-a", "rs-b"} {
		if got := h.getNode(n).Annotations[AnnotationReplicas]; got != "3" {
			t.Errorf("node %s %s = %q", n, AnnotationReplicas, got)
		}
		if got := h.getNode(n).Labels[ConfigLabel]; got != "" {
			t.Errorf("restart mode labelled node %s with %q", n, got)
		}
	}

	t.Run("one node's OOM lowers the cluster", func(t *testing.T) {
		dsRV := h.getDaemonSet().ResourceVersion
		h.advance(10 * time.Second)
		h.src.set("rs-b", oomed(2, 3, h.now.Add(-5*time.Second)))
		h.round()
		if got := replicasOf(t, h.getConfigMap().Data["default"]); got != 2 {
			t.Errorf("key has %d replicas, want 2", got)
		}
		stamp := h.now.UTC().Format(time.RFC3339)
		ds := h.getDaemonSet()
		if ds.ResourceVersion == dsRV || ds.Spec.Template.Annotations[AnnotationRestartedAt] != stamp {
			t.Errorf("DaemonSet not restarted again: %s = %q, want %q", AnnotationRestartedAt, ds.Spec.Template.Annotations[AnnotationRestartedAt], stamp)
		}
		lowered := withReason(h.events(), ReasonReplicasLowered)
		if len(lowered) != 2 || !strings.Contains(lowered[0], "node rs-b") {
			t.Errorf("events %q, want ReplicasLowered on both nodes naming rs-b", lowered)
		}
	})

	t.Run("a restart that did not happen is owed", func(t *testing.T) {
		// Someone rolled the DaemonSet back to an older restart.
		ds := h.getDaemonSet()
		ds.Spec.Template.Annotations[AnnotationRestartedAt] = "2020-01-01T00:00:00Z"
		if _, err := env.Client.AppsV1().DaemonSets(h.ns).Update(h.ctx, ds, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.advance(10 * time.Second)
		h.round()
		if got, want := h.getDaemonSet().Spec.Template.Annotations[AnnotationRestartedAt], h.getConfigMap().Annotations[AnnotationLastChange]; got != want {
			t.Errorf("restartedAt %q, want the last change %q", got, want)
		}
	})

	t.Run("exclusive and back keeps the user's sharing settings", func(t *testing.T) {
		const shared = `# the admin's sharing settings
version: v1
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
      - name: nvidia.com/gpu
        devices: all
        replicas: 2
`
		cm := h.getConfigMap()
		cm.Data["default"] = shared
		if _, err := env.Client.CoreV1().ConfigMaps(h.ns).Update(h.ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.advance(10 * time.Second)
		h.src.set("rs-b", oomed(2, 2, h.now.Add(-5*time.Second)))
		h.round()
		if got := h.getConfigMap().Data["default"]; strings.Contains(got, "timeSlicing") {
			t.Fatalf("after an OOM with 2 allocated the key still shares:\n%s\nrs-b: %+v", got, h.record("rs-b"))
		}
		h.advance(10 * time.Second)
		h.setAllocatable("rs-a", "nvidia.com/gpu", 1)
		h.setAllocatable("rs-b", "nvidia.com/gpu", 2)
		h.round() // verified

		// Past the cooldown, the OOM out of the window, and the workload
		// that OOMed at 2 gone: the tuner remembers that ml/a OOMed with 2
		// pods (policy.Memory) and would not give it 2 again soon.
		h.advance(11 * time.Minute)
		back := headroom(2)
		back.container, back.allocated = "ml/b/main", 1
		h.src.set("rs-b", back)
		ra.allocated = 1
		h.src.set("rs-a", ra)
		h.node("rs-c", mine, 2) // a GPU node whose exporter is down
		h.round()
		if r := h.record("rs-a"); r.Reason != ReasonNodesWithoutSignals || r.Replicas != 1 || !strings.Contains(r.Message, "rs-c") {
			t.Errorf("with rs-c silent: last decision %+v, want a NodesWithoutSignals hold at 1 naming rs-c (rs-b: %+v)", r, h.record("rs-b"))
		}
		if err := env.Client.CoreV1().Nodes().Delete(h.ctx, "rs-c", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		h.advance(10 * time.Second)
		h.round()
		if got := h.getConfigMap().Data["default"]; got != shared {
			t.Errorf("4 -> 1 -> 2 lost the sharing settings:\n%s\nwant:\n%s", got, shared)
		}
		if _, ok := h.getConfigMap().Annotations[AnnotationSharedConfig]; ok {
			t.Errorf("%s left behind after the raise", AnnotationSharedConfig)
		}
	})
}

func testConflicts(t *testing.T, env *testenv.Env) {
	const ns = "cf-ns"
	ic := &interceptor{
		match: func(r *http.Request) bool {
			return r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/namespaces/"+ns+"/configmaps/plugin-configs")
		},
		before: func() {
			cm, err := env.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), "plugin-configs", metav1.GetOptions{})
			if err == nil {
				cm.Data["other"] = "changed by someone else\n"
				_, err = env.Client.CoreV1().ConfigMaps(ns).Update(context.Background(), cm, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Errorf("the other writer: %v", err)
			}
		},
	}
	nodeIC := &interceptor{
		match: func(r *http.Request) bool {
			return r.Method != http.MethodGet && strings.HasSuffix(r.URL.Path, "/nodes/cf-node")
		},
		before: func() {
			n, err := env.Client.CoreV1().Nodes().Get(context.Background(), "cf-node", metav1.GetOptions{})
			if err == nil {
				n.Labels["team"] = "vision"
				_, err = env.Client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Errorf("the other writer: %v", err)
			}
		},
	}
	h := newHarness(t, env, testConfig(config.ModeConfigManager, ns), interceptedClient(t, env.Config, ic, nodeIC))
	h.namespace()
	h.configMap(map[string]string{"default": baseConfig, "other": "original\n"})
	h.node("cf-node", map[string]string{"zone": "a"}, 4)
	h.src.set("cf-node", headroom(1))

	h.round()
	if ic.conflicts == 0 || nodeIC.conflicts == 0 {
		t.Fatalf("conflicts seen: ConfigMap %d, node %d; the test did not race the writes", ic.conflicts, nodeIC.conflicts)
	}
	cm := h.getConfigMap()
	if cm.Data["other"] != "changed by someone else\n" {
		t.Errorf("the other writer's edit was lost: %q", cm.Data["other"])
	}
	if replicasOf(t, cm.Data["gpuslice-5"]) != 5 {
		t.Errorf("the tuner's named configs were lost")
	}
	n := h.getNode("cf-node")
	if n.Labels["team"] != "vision" || n.Labels["zone"] != "a" || n.Labels[ConfigLabel] != "gpuslice-5" {
		t.Errorf("node labels %v, want both writers' labels", n.Labels)
	}
	if got := testutil.ToFloat64(h.c.m.applyFailures.WithLabelValues("cf-node")); got != 0 {
		t.Errorf("apply failures %v", got)
	}
	// Every node write is a patch of metadata alone, with the
	// resourceVersion read as its precondition: a whole-object update
	// would drop what a newer cluster's Node has and this client lacks.
	if len(nodeIC.bodies) == 0 {
		t.Fatal("no node write seen")
	}
	for _, b := range nodeIC.bodies {
		var top map[string]map[string]any
		if err := json.Unmarshal([]byte(b), &top); err != nil {
			t.Fatalf("node write %s: %v", b, err)
		}
		if rv, _ := top["metadata"]["resourceVersion"].(string); len(top) != 1 || rv == "" {
			t.Errorf("node write %s: want a patch of metadata with a resourceVersion", b)
		}
	}
}

func testInvalidConfigs(t *testing.T, env *testenv.Env) {
	// NVIDIA rejects replicas below 2: this parses as YAML but not as a
	// device-plugin config.
	const broken = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 1\n"

	t.Run("base key", func(t *testing.T) {
		h := newHarness(t, env, testConfig(config.ModeConfigManager, "iv-base"), nil)
		h.namespace()
		before := h.configMap(map[string]string{"default": broken})
		h.node("iv-base-node", nil, 4)
		h.src.set("iv-base-node", headroom(1))
		h.round()
		h.advance(10 * time.Second)
		h.round()
		after := h.getConfigMap()
		if after.ResourceVersion != before.ResourceVersion || !maps.Equal(after.Data, before.Data) {
			t.Errorf("ConfigMap changed: %v", after.Data)
		}
		if got := h.getNode("iv-base-node").Labels[ConfigLabel]; got != "" {
			t.Errorf("node moved to %q", got)
		}
		if ev := withReason(h.events(), ReasonConfigInvalid); len(ev) != 1 || !strings.Contains(ev[0], "replicas") {
			t.Errorf("events %q, want one ConfigInvalid naming the field", ev)
		}
		if got := testutil.ToFloat64(h.c.m.configInvalid.WithLabelValues("iv-base-node")); got != 1 {
			t.Errorf("config_invalid = %v", got)
		}
	})

	t.Run("the node's named config", func(t *testing.T) {
		h := newHarness(t, env, testConfig(config.ModeConfigManager, "iv-named"), nil)
		h.namespace()
		h.configMap(map[string]string{"default": baseConfig, "gpuslice-4": broken})
		h.node("iv-named-node", map[string]string{ConfigLabel: "gpuslice-4"}, 4)
		h.node("iv-named-ok", nil, 4)
		h.src.set("iv-named-node", headroom(1))
		h.src.set("iv-named-ok", headroom(1))
		h.round()
		cm := h.getConfigMap()
		if cm.Data["gpuslice-4"] != broken {
			t.Errorf("the broken key was overwritten:\n%s", cm.Data["gpuslice-4"])
		}
		if got := h.getNode("iv-named-node").Labels[ConfigLabel]; got != "gpuslice-4" {
			t.Errorf("node on the broken key moved to %q", got)
		}
		if got := h.getNode("iv-named-ok").Labels[ConfigLabel]; got != "gpuslice-5" {
			t.Errorf("a node with a good config was not raised: %q", got)
		}
		if ev := withReason(h.events(), ReasonConfigInvalid); len(ev) != 1 || !strings.Contains(ev[0], "gpuslice-4") {
			t.Errorf("events %q, want one ConfigInvalid naming gpuslice-4", ev)
		}
	})

	t.Run("restart key", func(t *testing.T) {
		h := newHarness(t, env, testConfig(config.ModeRestart, "iv-restart"), nil)
		h.namespace()
		before := h.configMap(map[string]string{"default": broken})
		ds := h.daemonSet()
		h.node("iv-restart-node", nil, 4)
		h.src.set("iv-restart-node", headroom(1))
		h.round()
		if after := h.getConfigMap(); after.ResourceVersion != before.ResourceVersion || after.Data["default"] != broken {
			t.Errorf("ConfigMap changed: %v", after.Data)
		}
		if got := h.getDaemonSet().ResourceVersion; got != ds.ResourceVersion {
			t.Error("DaemonSet restarted over a broken config")
		}
		if ev := withReason(h.events(), ReasonConfigInvalid); len(ev) != 1 {
			t.Errorf("events %q, want one ConfigInvalid", ev)
		}
	})
}

func testDryRun(t *testing.T, env *testenv.Env) {
	for _, mode := range []string{config.ModeConfigManager, config.ModeRestart} {
		t.Run(mode, func(t *testing.T) {
			cfg := testConfig(mode, "dry-"+mode)
			cfg.DryRun = true
			cfg.Apply.NodeSelector = "scenario=dry-" + mode // the other scenarios' silent nodes would hold a restart-mode raise
			h := newHarness(t, env, cfg, nil)
			h.namespace()
			cm := h.configMap(map[string]string{"default": baseConfig})
			ds := h.daemonSet()
			node := "dry-" + mode + "-node"
			h.node(node, map[string]string{"scenario": "dry-" + mode}, 4)
			n := h.getNode(node)
			h.src.set(node, headroom(1))
			for range 3 {
				h.round()
				h.advance(10 * time.Second)
			}
			if got := h.getConfigMap().ResourceVersion; got != cm.ResourceVersion {
				t.Error("ConfigMap written")
			}
			if got := h.getDaemonSet().ResourceVersion; got != ds.ResourceVersion {
				t.Error("DaemonSet written")
			}
			if got := h.getNode(node).ResourceVersion; got != n.ResourceVersion {
				t.Error("node written")
			}
			ev := withReason(h.events(), ReasonReplicasRaised)
			if len(ev) != 1 || !strings.Contains(ev[0], "dry run") || !strings.Contains(ev[0], "would be raised 4 -> 5") {
				t.Errorf("events %q, want one dry-run ReplicasRaised", ev)
			}
			m := h.c.m
			if got := testutil.ToFloat64(m.recommended.WithLabelValues(node, "nvidia.com/gpu")); got != 5 {
				t.Errorf("recommended = %v, want 5", got)
			}
			if got := testutil.ToFloat64(m.replicas.WithLabelValues(node, "nvidia.com/gpu")); got != 4 {
				t.Errorf("replicas = %v, want 4", got)
			}
			// The counters exist at 0 from the first round (issue 16).
			for _, dir := range []string{policy.DirectionUp, policy.DirectionDown} {
				if got := testutil.ToFloat64(m.changes.WithLabelValues(node, "nvidia.com/gpu", dir)); got != 0 {
					t.Errorf("%v changes %s counted in a dry run", got, dir)
				}
			}
		})
	}
}

func testVerifyFailure(t *testing.T, env *testenv.Env) {
	cfg := testConfig(config.ModeConfigManager, "vf-ns")
	cfg.Policy.Cooldown = 0 // the policy would raise every round
	h := newHarness(t, env, cfg, nil)
	h.namespace()
	h.configMap(map[string]string{"default": baseConfig})
	const node = "vf-node"
	h.node(node, nil, 8)
	h.src.set(node, headroom(2))
	label := func() string { return h.getNode(node).Labels[ConfigLabel] }

	h.round()
	if label() != "gpuslice-5" {
		t.Fatalf("first raise: label %q", label())
	}
	// The spare is taken at once: the policy wants another.
	taken := headroom(2)
	taken.allocated = 5
	h.src.set(node, taken)
	h.advance(10 * time.Second)
	h.round()
	if label() != "gpuslice-5" {
		t.Errorf("raised again before the first raise was verified: %q", label())
	}
	if r := h.record(node); r.Reason != ReasonAwaitingVerify {
		t.Errorf("last decision %+v, want %s", r, ReasonAwaitingVerify)
	}

	h.advance(time.Minute) // past verifyTimeout; allocatable still 8, want 10
	h.round()
	ev := h.events()
	if f := withReason(ev, ReasonVerifyFailed); len(f) != 1 || !strings.Contains(f[0], "advertises 8 nvidia.com/gpu, want 10") {
		t.Errorf("events %q, want one VerifyFailed", ev)
	}
	if got := testutil.ToFloat64(h.c.m.verifyFailures.WithLabelValues(node)); got != 1 {
		t.Errorf("verify_failures_total = %v", got)
	}
	if len(withReason(ev, ReasonChangeHeld)) != 1 {
		t.Errorf("events %q, want the held raise reported", ev)
	}
	for range 3 {
		h.advance(10 * time.Second)
		h.round()
	}
	if label() != "gpuslice-5" {
		t.Errorf("a held node was changed: %q", label())
	}
	if ev := h.events(); len(ev) != 0 {
		t.Errorf("events repeated while held: %q", ev)
	}
	if got := testutil.ToFloat64(h.c.m.verifyFailures.WithLabelValues(node)); got != 1 {
		t.Errorf("verify_failures_total = %v after holding", got)
	}

	// A new leadership (a restarted tuner, or another replica) keeps the
	// hold: it is in the node's last decision, not only in memory.
	if r := h.record(node); r.Hold == nil || r.Hold.Replicas != 5 || r.Hold.Allocatable != 8 {
		t.Errorf("last decision %+v, want the hold at 5 replicas with 8 advertised", r)
	}
	stop := make(chan struct{})
	h.c.afterRound = func(error) { close(stop) } // one round, then the loop ends
	h.advance(10 * time.Second)
	h.c.loop(h.ctx, stop)
	h.c.afterRound = nil
	if label() != "gpuslice-5" {
		t.Errorf("a held node was changed by a new leadership: %q", label())
	}
	if st := h.c.state[node]; st == nil || st.held == nil {
		t.Errorf("a new leadership dropped the hold: state %+v", st)
	}
	h.events()

	// Its exporter is down for a window (as it may be on a broken node):
	// when its signals come back, the node is still held.
	h.src.set(node, signal{})
	h.advance(2 * cfg.Policy.Window)
	h.round()
	h.src.set(node, taken)
	h.advance(10 * time.Second)
	h.round()
	if label() != "gpuslice-5" {
		t.Errorf("a held node was changed after a gap in its signals: %q", label())
	}

	// The plugin catches up: the node changed, the hold lifts.
	h.setAllocatable(node, "nvidia.com/gpu", 10)
	h.advance(10 * time.Second)
	h.round()
	if label() != "gpuslice-6" {
		t.Errorf("after the allocatable changed the node was not raised: %q", label())
	}
}

func testLeaderHandover(t *testing.T, env *testenv.Env) {
	const ns, node = "le-ns", "le-node"
	h0 := &harness{t: t, env: env, ctx: context.Background(), ns: ns}
	h0.namespace()
	h0.configMap(map[string]string{"default": baseConfig})
	h0.node(node, nil, 4)

	cfg := testConfig(config.ModeConfigManager, ns)
	cfg.LeaderElection = config.LeaderElection{Enabled: true, Namespace: ns, Name: "gpuslice-tuner",
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond}
	cfg.Interval = 100 * time.Millisecond

	type tuner struct {
		h      *harness
		cancel context.CancelFunc
		done   chan struct{}
		rounds atomic.Int64
	}
	start := func(id string) *tuner {
		tu := &tuner{done: make(chan struct{})}
		tu.h = newHarness(t, env, cfg, nil, func(o *Options) { o.Identity = id; o.Now = time.Now })
		tu.h.src.set(node, headroom(1))
		tu.h.c.afterRound = func(error) { tu.rounds.Add(1) }
		ctx, cancel := context.WithCancel(context.Background())
		tu.cancel = cancel
		go func() {
			defer close(tu.done)
			if err := tu.h.c.Run(ctx); err != nil {
				t.Errorf("%s: %v", id, err)
			}
		}()
		t.Cleanup(func() { cancel(); <-tu.done })
		return tu
	}
	a, b := start("tuner-a"), start("tuner-b")
	poll(t, 30*time.Second, func() string {
		if l := h0.getNode(node).Labels[ConfigLabel]; l != "gpuslice-5" {
			return "waiting for the first change, label " + l
		}
		return ""
	})
	leader, standby := a, b
	if testutil.ToFloat64(b.h.c.m.leader) == 1 {
		leader, standby = b, a
	}
	if testutil.ToFloat64(leader.h.c.m.leader) != 1 || standby.rounds.Load() != 0 {
		t.Fatalf("leader gauges %v/%v, standby rounds %d", testutil.ToFloat64(a.h.c.m.leader), testutil.ToFloat64(b.h.c.m.leader), standby.rounds.Load())
	}
	leader.cancel()
	<-leader.done
	if testutil.ToFloat64(leader.h.c.m.leader) != 0 {
		t.Error("the stopped tuner still reports itself leader")
	}
	poll(t, 30*time.Second, func() string {
		if testutil.ToFloat64(standby.h.c.m.leader) != 1 || standby.rounds.Load() < 5 {
			return fmt.Sprintf("standby: leader %v, %d rounds", testutil.ToFloat64(standby.h.c.m.leader), standby.rounds.Load())
		}
		return ""
	})
	standby.cancel()
	<-standby.done

	if l := h0.getNode(node).Labels[ConfigLabel]; l != "gpuslice-5" {
		t.Errorf("label %q after the handover, want gpuslice-5", l)
	}
	changes := testutil.ToFloat64(a.h.c.m.changes.WithLabelValues(node, "nvidia.com/gpu", "up")) +
		testutil.ToFloat64(b.h.c.m.changes.WithLabelValues(node, "nvidia.com/gpu", "up"))
	raised := len(withReason(a.h.events(), ReasonReplicasRaised)) + len(withReason(b.h.events(), ReasonReplicasRaised))
	if changes != 1 || raised != 1 {
		t.Errorf("%v changes and %d ReplicasRaised events across both tuners, want exactly 1", changes, raised)
	}
	if r, _ := ParseRecord(h0.getNode(node).Annotations[AnnotationLastDecision]); r == nil || r.Reason != policy.ReasonCooldown {
		t.Errorf("new leader's last decision %+v, want a Cooldown hold", r)
	}
}

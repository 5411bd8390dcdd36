package controller

import (
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// oneNodeScenario is a scenario of one node, <prefix>-node (one GPU × 4),
// in namespace <prefix>-ns, its ConfigMap's apply.key the base config,
// with NVIDIA's DaemonSet when ds; edit adjusts the config.
func oneNodeScenario(t *testing.T, env *testenv.Env, mode, prefix string, ds bool, edit func(*config.Config)) *harness {
	cfg := testConfig(mode, prefix+"-ns")
	cfg.Apply.NodeSelector = "scenario=" + prefix // the other scenarios' nodes share the API server
	if edit != nil {
		edit(&cfg)
	}
	h := newHarness(t, env, cfg, nil)
	h.namespace()
	h.configMap(map[string]string{cfg.Apply.Key: baseConfig})
	if ds {
		h.daemonSet()
	}
	h.node(prefix+"-node", map[string]string{"scenario": prefix}, 4)
	return h
}

// testRestartFailureTold: in restart mode, a key written whose DaemonSet
// restart failed is told as a change in the key with the restart still to
// come, not as a restart made.
func testRestartFailureTold(t *testing.T, env *testenv.Env) {
	// No DaemonSet: its restart fails.
	h := oneNodeScenario(t, env, config.ModeRestart, "rf", false, nil)
	const node = "rf-node"
	h.src.set(node, oomed(1, 4, h.now.Add(-5*time.Second)))
	h.round()
	if got := replicasOf(t, h.getConfigMap().Data["default"]); got != 3 {
		t.Fatalf("key has %d replicas, want 3 (lowered on the OOM)", got)
	}
	ev := h.events()
	if f := withReason(ev, ReasonApplyFailed); len(f) != 1 || !strings.Contains(f[0], "the restart failed") {
		t.Errorf("events %q, want one ApplyFailed naming the failed restart", ev)
	}
	lowered := withReason(ev, ReasonReplicasLowered)
	if len(lowered) != 1 || strings.Contains(lowered[0], "restarted") || !strings.Contains(lowered[0], "retried next round") {
		t.Errorf("events %q, want one ReplicasLowered that says the restart is still to come", lowered)
	}
}

// testRestartLostLastChange: in restart mode, a ConfigMap that lost its
// last-change annotations (recreated, or the cluster came from another
// mode) leaves the nodes' last decisions as they say: each node's record
// still follows the decisions, and keeps the last change it knew.
func testRestartLostLastChange(t *testing.T, env *testenv.Env) {
	h := oneNodeScenario(t, env, config.ModeRestart, "rl", true, nil)
	const node = "rl-node"
	h.src.set(node, oomed(1, 4, h.now.Add(-5*time.Second)))
	h.round()
	changed := h.record(node)
	if changed.Reason != policy.ReasonGPUOOM || changed.LastChange == nil {
		t.Fatalf("after the OOM: last decision %+v, want a GPUOOM change", changed)
	}
	cm := h.getConfigMap()
	delete(cm.Annotations, AnnotationLastChange)
	delete(cm.Annotations, AnnotationLastChangeDirection)
	if _, err := env.Client.CoreV1().ConfigMaps(h.ns).Update(h.ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.src.set(node, headroom(1))
	for range 3 {
		h.advance(30 * time.Second)
		h.round()
	}
	r := h.record(node)
	if r.Reason == policy.ReasonGPUOOM {
		t.Errorf("last decision %+v: not written again since the OOM's", r)
	}
	if r.LastChange == nil || !r.LastChange.Equal(*changed.LastChange) {
		t.Errorf("last decision %+v, want the last change of %s kept", r, changed.LastChange)
	}
	if got := replicasOf(t, h.getConfigMap().Data["default"]); got != 3 {
		t.Errorf("key has %d replicas, want 3: raised within the cooldown of the OOM's lowering", got)
	}
}

// testRestartNotStampedBack: a restart the tuner owes for rewritten keys
// (config-manager mode) is not stamped over a later one someone made once
// the keys could reach the nodes' volumes (apply.propagationDelay after
// the write): the plugin's pods have read them since. One made before that
// may not have, and the owed restart is still made.
func testRestartNotStampedBack(t *testing.T, env *testenv.Env) {
	for _, tc := range []struct {
		name     string
		after    time.Duration // after the write, the operator's restart
		restarts bool
	}{
		{"after the propagation delay", 90 * time.Second, false},
		{"within the propagation delay", 30 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "sb" + strconv.Itoa(int(tc.after.Seconds()))
			h := oneNodeScenario(t, env, config.ModeConfigManager, prefix, true, func(c *config.Config) {
				c.Apply.Key = "config" // the chart's `config.map` with one entry: no `default` key
				c.Apply.PropagationDelay = 90 * time.Second
			})
			h.round()
			cm := h.getConfigMap()
			cm.Data["config"] = strings.Replace(baseConfig, "sharing:\n  timeSlicing:\n", "sharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n", 1)
			if _, err := env.Client.CoreV1().ConfigMaps(h.ns).Update(h.ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			h.advance(10 * time.Second)
			h.round()
			if _, owed := h.getConfigMap().Annotations[AnnotationRestartOwed]; !owed {
				t.Fatal("no restart owed for the rewritten key")
			}
			// Someone rolls the plugin after the rewrite (kubectl rollout restart).
			ds := h.getDaemonSet()
			theirs := h.now.Add(tc.after).UTC().Format(time.RFC3339)
			ds.Spec.Template.Annotations = map[string]string{AnnotationRestartedAt: theirs}
			if _, err := env.Client.AppsV1().DaemonSets(h.ns).Update(h.ctx, ds, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			h.advance(90 * time.Second)
			h.round()
			if got := h.getDaemonSet().Spec.Template.Annotations[AnnotationRestartedAt]; (got != theirs) != tc.restarts {
				t.Errorf("restartedAt %q after theirs %q: restarted %v, want %v", got, theirs, got != theirs, tc.restarts)
			}
			if _, owed := h.getConfigMap().Annotations[AnnotationRestartOwed]; owed {
				t.Error("the restart is still owed")
			}
		})
	}
}

// testConfigsStampedWhenWritten: the named configs' write time, from which
// apply.propagationDelay is counted, is when they were written, not when
// the round began gathering the signals.
func testConfigsStampedWhenWritten(t *testing.T, env *testenv.Env) {
	h := oneNodeScenario(t, env, config.ModeConfigManager, "cw", false, nil)
	start := h.now
	h.src.took = func() { h.now = h.now.Add(20 * time.Second) } // a slow Prometheus
	h.round()
	want := start.Add(20 * time.Second).UTC().Format(time.RFC3339)
	if got := h.getConfigMap().Annotations[AnnotationConfigsWritten]; got != want {
		t.Errorf("%s = %q, want %q: the time of the write", AnnotationConfigsWritten, got, want)
	}
}

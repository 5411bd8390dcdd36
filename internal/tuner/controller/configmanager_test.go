package controller

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
)

// TestUnlabelledNodeRestartedForTheDefaultCopy: in config-manager mode a GPU
// node the tuner never labelled reads the `default` copy of apply.key
// (NVIDIA's "named" fallback). When apply.key changes, the copy is
// rewritten, and config-manager does not apply a key's new content: the
// device plugin must be restarted for that node too, though no node's label
// names a rewritten key. Its own API server: every other scenario's nodes
// are labelled and would be restarted for anyway.
func TestUnlabelledNodeRestartedForTheDefaultCopy(t *testing.T) {
	env := testenv.Start(t)
	const ns = "ul"
	cfg := testConfig(config.ModeConfigManager, ns)
	cfg.Apply.Key = "config"
	cfg.Apply.PropagationDelay = 90 * time.Second
	cfg.Apply.NodeSelector = "scenario=" + ns
	h := newHarness(t, env, cfg, nil)
	h.namespace()
	h.configMap(map[string]string{"config": baseConfig})
	h.daemonSet()
	h.node("ul-node", map[string]string{"scenario": ns}, 4) // no signals: never labelled
	h.round()
	if cm := h.getConfigMap(); cm.Data[DefaultKey] != baseConfig {
		t.Fatalf("default key %q, want the copy of apply.key", cm.Data[DefaultKey])
	}

	cm := h.getConfigMap()
	cm.Data["config"] = strings.Replace(baseConfig, "sharing:\n  timeSlicing:\n", "sharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n", 1)
	if _, err := env.Client.CoreV1().ConfigMaps(ns).Update(h.ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.advance(10 * time.Second)
	h.round() // rewrites the copy; the restart is owed once it reached the volume
	if owed := h.getConfigMap().Annotations[AnnotationRestartOwed]; !strings.Contains(owed, DefaultKey) {
		t.Fatalf("restart owed %q, want one for the default copy", owed)
	}
	h.restartPaidAfterPropagation(cfg.Apply.PropagationDelay, "the unlabelled node reading the rewritten default copy")
	if got := h.getNode("ul-node").Labels[ConfigLabel]; got != "" {
		t.Errorf("ul-node labelled %q, want it left unlabelled", got)
	}
}

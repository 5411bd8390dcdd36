package controller

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
)

// testDRANode: a node whose GPUs the exporter measures but no device
// plugin advertises (DRA) gets no device-plugin config, label or
// annotation; the tuner advises memory requests instead, in an Event when
// the advice changes and in a gauge, and drops the gauge when a device
// plugin takes the node over.
func testDRANode(t *testing.T, env *testenv.Env) {
	// Restart mode: the one config key the tuner would patch for any node
	// it tunes, and the DaemonSet it would restart.
	cfg := testConfig(config.ModeRestart, "dra")
	cfg.Apply.NodeSelector = "scenario=dra"
	h := newHarness(t, env, cfg, nil)
	h.namespace()
	cm := h.configMap(map[string]string{"default": baseConfig})
	ds := h.daemonSet()
	const node = "dra-node"
	if _, err := env.Client.CoreV1().Nodes().Create(h.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{"scenario": "dra"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n := h.getNode(node)
	s := headroom(1) // ml/a/main peaks at 6 GiB
	h.src.set(node, s)
	for range 3 {
		h.round()
		h.advance(10 * time.Second)
	}
	if got := h.getConfigMap().ResourceVersion; got != cm.ResourceVersion {
		t.Error("ConfigMap written for a DRA node")
	}
	if got := h.getDaemonSet().ResourceVersion; got != ds.ResourceVersion {
		t.Error("DaemonSet restarted for a DRA node")
	}
	if got := h.getNode(node).ResourceVersion; got != n.ResourceVersion {
		t.Errorf("DRA node written: labels %v, annotations %v", h.getNode(node).Labels, h.getNode(node).Annotations)
	}
	gauge := h.c.dra.gauge.WithLabelValues(node, "ml", "a", "main", "GPU-dra-node-0")
	// 6 GiB / 0.9 = 6827 MiB, rounded up to 256 MiB.
	if got := testutil.ToFloat64(gauge); got != 6912<<20 {
		t.Errorf("recommended memory request = %v, want %v", got, 6912<<20)
	}
	ev := withReason(h.events(), ReasonRecommendedMemoryRequest)
	if len(ev) != 1 || !strings.Contains(ev[0], "ml/a/main on GPU-dra-node-0: peak 6.0 GiB") || !strings.Contains(ev[0], "request memory: 6912Mi") {
		t.Errorf("events %q, want one RecommendedMemoryRequest of 6912Mi", ev)
	}

	s.peak = 9 * gib
	h.src.set(node, s)
	h.round()
	if ev := withReason(h.events(), ReasonRecommendedMemoryRequest); len(ev) != 1 || !strings.Contains(ev[0], "request memory: 10240Mi") {
		t.Errorf("after the peak grew: events %q, want one of 10240Mi", ev)
	}

	// A device plugin registers: the node is tuned as usual, the advice goes.
	h.setAllocatable(node, dpconfig.GPUResource, 4)
	h.round()
	if c := testutil.CollectAndCount(h.c.dra.gauge); c != 0 {
		t.Errorf("%d recommendation series left after a device plugin took the node", c)
	}
}

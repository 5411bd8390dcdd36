package controller

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestStepDownDropsGauges: a replica that loses the lease stops exporting
// its per-node gauges (a former leader's lines would sit beside the new
// leader's in every panel) and keeps its counters.
func TestStepDownDropsGauges(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := newMetrics(reg)
	m.leader.Set(1)
	m.replicas.WithLabelValues("n1", "nvidia.com/gpu").Set(4)
	m.recommended.WithLabelValues("n1", "nvidia.com/gpu").Set(3)
	m.lastChange.WithLabelValues("n1").Set(1700000000)
	m.configInvalid.WithLabelValues("n1").Set(0)
	m.changes.WithLabelValues("n1", "nvidia.com/gpu", "up").Inc()
	m.memoryRequest.WithLabelValues("n1", "ml", "a", "main", "GPU-0").Set(8 << 30)

	m.stepDown()

	for _, name := range []string{"gpuslice_tuner_replicas", "gpuslice_tuner_recommended_replicas",
		"gpuslice_tuner_last_change_timestamp_seconds", "gpuslice_tuner_config_invalid",
		"gpuslice_tuner_recommended_memory_request_bytes"} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 0 {
			t.Errorf("%s: %d series after stepping down (%v), want none", name, n, err)
		}
	}
	if v := testutil.ToFloat64(m.leader); v != 0 {
		t.Errorf("gpuslice_tuner_leader = %v after stepping down", v)
	}
	if n, err := testutil.GatherAndCount(reg, "gpuslice_tuner_changes_total"); err != nil || n == 0 {
		t.Errorf("the changes counter went with the gauges (%d series, %v)", n, err)
	}
}

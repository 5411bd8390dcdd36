package controller

import (
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpuslice/gpuslice/dashboards/metricnames"
)

// TestMetricNamesMatchContract: the tuner registers exactly the metric names
// the dashboards and alerts are checked against.
func TestMetricNamesMatchContract(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	// Vectors appear in a gather only once they have a child.
	m.replicas.WithLabelValues("n", "r")
	m.recommended.WithLabelValues("n", "r")
	m.changes.WithLabelValues("n", "r", "up")
	m.applyFailures.WithLabelValues("n")
	m.verifyFailures.WithLabelValues("n")
	m.lastChange.WithLabelValues("n")
	m.configInvalid.WithLabelValues("n")
	m.crashLoopEvictions.WithLabelValues("n", evictEvicted)
	m.memoryRequest.WithLabelValues("n", "ns", "p", "c", "GPU-0")
	m.lastSuccessfulRound.WithLabelValues()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		got = append(got, mf.GetName())
	}
	want := append([]string(nil), metricnames.Tuner...)
	sort.Strings(got)
	sort.Strings(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tuner metrics differ from dashboards/metricnames.Tuner (-contract +registered):\n%s", diff)
	}
}

// TestManagedNodeCountersStartAtZero: once the tuner manages a node, its
// change and failure counters exist at 0, so the first event is an increase.
func TestManagedNodeCountersStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	m.setReplicas(&nodeState{}, "gpu-1", "nvidia.com/gpu", 4, 4)
	want := `
# HELP gpuslice_tuner_apply_failures_total Writes of a decided change that the API server refused after retries.
# TYPE gpuslice_tuner_apply_failures_total counter
gpuslice_tuner_apply_failures_total{node="gpu-1"} 0
# HELP gpuslice_tuner_changes_total Replica changes written, by direction (up, down). Dry runs write none.
# TYPE gpuslice_tuner_changes_total counter
gpuslice_tuner_changes_total{direction="down",node="gpu-1",resource="nvidia.com/gpu"} 0
gpuslice_tuner_changes_total{direction="up",node="gpu-1",resource="nvidia.com/gpu"} 0
# HELP gpuslice_tuner_verify_failures_total Changes after which the node's allocatable did not reach GPUs x replicas within apply.verifyTimeout.
# TYPE gpuslice_tuner_verify_failures_total counter
gpuslice_tuner_verify_failures_total{node="gpu-1"} 0
`
	names := []string{"gpuslice_tuner_apply_failures_total", "gpuslice_tuner_changes_total", "gpuslice_tuner_verify_failures_total"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// A change counted afterwards reads 1, not a new series.
	m.verifyFailures.WithLabelValues("gpu-1").Inc()
	if got := testutil.ToFloat64(m.verifyFailures.WithLabelValues("gpu-1")); got != 1 {
		t.Errorf("verify failures after one = %v, want 1", got)
	}
}

package controller

import (
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

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

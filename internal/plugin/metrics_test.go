package plugin

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/dashboards/metricnames"
	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
)

// TestMetricNamesMatchContract: the plugin registers exactly the metric
// names the dashboards and alerts are checked against.
func TestMetricNamesMatchContract(t *testing.T) {
	reg := prometheus.NewRegistry()
	p, err := New(Options{Backend: gputest.NewFake(), Source: StaticSource(nil), Registerer: reg, Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	// Every series that depends on state gets some: a plan with a device,
	// and a child of every vector.
	// The MPS series exist only for a GPU shared through MPS.
	p.plan = plan{Resources: map[string][]advertised{gpuRes: {{ID: uuid0, GPU: uuid0, Healthy: true}}},
		MPS: map[string]string{uuid0: gpuRes}, GPUs: map[string]gpuInfo{uuid0: {UUID: uuid0, MemoryTotalBytes: 1 << 30}}, Replicas: map[string]int{uuid0: 2}}
	p.metrics.allocations.WithLabelValues(gpuRes)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		got = append(got, mf.GetName())
	}
	want := slices.Concat(metricnames.Plugin, metricnames.PluginMPS)
	slices.Sort(got)
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("plugin metrics differ from dashboards/metricnames.Plugin and PluginMPS (-contract +registered):\n%s", diff)
	}
}

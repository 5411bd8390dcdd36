package exporter

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// TestSeriesCache: a series sent from the cache writes exactly what a
// fresh const metric writes, with the new value, and a series a scrape did
// not send is forgotten.
func TestSeriesCache(t *testing.T) {
	c := newSeriesCache()
	write := func(m prometheus.Metric) *dto.Metric {
		t.Helper()
		var out dto.Metric
		if err := m.Write(&out); err != nil {
			t.Fatal(err)
		}
		return &out
	}
	labels := []string{"ns", "pod", "main", "0", "GPU-x", "log"}
	for i, v := range []float64{1, 2, 2, 5} {
		got := write(c.metric(oomEvents, prometheus.CounterValue, v, labels...))
		want := write(prometheus.MustNewConstMetric(oomEvents, prometheus.CounterValue, v, labels...))
		if !proto.Equal(got, want) {
			t.Fatalf("scrape %d: cached %v, want %v", i, got, want)
		}
		g := write(c.metric(gpuMemUsed, prometheus.GaugeValue, v, "0", "GPU-x"))
		if w := write(prometheus.MustNewConstMetric(gpuMemUsed, prometheus.GaugeValue, v, "0", "GPU-x")); !proto.Equal(g, w) {
			t.Fatalf("scrape %d: cached %v, want %v", i, g, w)
		}
		c.endScrape()
	}
	if len(c.series) != 2 {
		t.Fatalf("%d series cached, want 2", len(c.series))
	}
	c.metric(gpuMemUsed, prometheus.GaugeValue, 1, "0", "GPU-x")
	c.endScrape()
	if len(c.series) != 1 {
		t.Fatalf("a series not sent stays cached: %d series", len(c.series))
	}
	if _, ok := c.metric(gpuMemUsed, prometheus.GaugeValue, 1, "0", "GPU-x").(*cachedMetric); !ok {
		t.Fatal("a series sent again is not served from the cache")
	}
}

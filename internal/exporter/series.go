package exporter

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// maxLabels is the most labels of any gpuslice_* series (containerAlloc's
// and oomEvents' six).
const maxLabels = 6

type seriesKey struct {
	desc   *prometheus.Desc
	values [maxLabels]string
}

type cachedLabels struct {
	pairs []*dto.LabelPair
	gen   uint64
}

// seriesCache keeps the label pairs of every series sent in the last
// scrape. A node's series are the same from one scrape to the next (the
// same containers on the same GPUs) while only their values move, and
// building and validating the pairs took a fifth of a collection: a series
// seen before gets its pairs from here, and only the value is new. Pairs
// are shared by the metrics of every scrape and never changed once built,
// so a scrape still being gathered while the next one collects is safe.
type seriesCache struct {
	gen    uint64
	series map[seriesKey]*cachedLabels
}

func newSeriesCache() *seriesCache {
	return &seriesCache{gen: 1, series: map[seriesKey]*cachedLabels{}}
}

// metric is prometheus.MustNewConstMetric with the label pairs from the
// cache: the same validation the first time a series is seen, none after.
func (c *seriesCache) metric(d *prometheus.Desc, t prometheus.ValueType, v float64, values ...string) prometheus.Metric {
	if len(values) > maxLabels {
		panic(fmt.Sprintf("exporter: %d label values, at most %d: %s", len(values), maxLabels, d))
	}
	k := seriesKey{desc: d}
	copy(k.values[:], values)
	if cl := c.series[k]; cl != nil && len(cl.pairs) == len(values) {
		cl.gen = c.gen
		return &cachedMetric{desc: d, labels: cl.pairs, typ: t, value: v}
	}
	m := prometheus.MustNewConstMetric(d, t, v, values...)
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		panic(fmt.Sprintf("exporter: writing %s: %v", d, err))
	}
	c.series[k] = &cachedLabels{pairs: out.Label, gen: c.gen}
	return m
}

// endScrape forgets the series the scrape that ends did not send (deleted
// pods, vanished GPUs), so the cache is as large as one scrape.
func (c *seriesCache) endScrape() {
	for k, cl := range c.series {
		if cl.gen != c.gen {
			delete(c.series, k)
		}
	}
	c.gen++
}

// cachedMetric is a const metric with label pairs built before. Its value
// and the message holding it live inside it, so a series costs one
// allocation here instead of three.
type cachedMetric struct {
	desc    *prometheus.Desc
	labels  []*dto.LabelPair
	typ     prometheus.ValueType
	value   float64
	gauge   dto.Gauge
	counter dto.Counter
}

func (m *cachedMetric) Desc() *prometheus.Desc { return m.desc }

func (m *cachedMetric) Write(out *dto.Metric) error {
	out.Label = m.labels
	switch m.typ {
	case prometheus.CounterValue:
		m.counter.Value = &m.value
		out.Counter = &m.counter
	case prometheus.GaugeValue:
		m.gauge.Value = &m.value
		out.Gauge = &m.gauge
	default: // not sent by the exporter
		out.Untyped = &dto.Untyped{Value: &m.value}
	}
	return nil
}

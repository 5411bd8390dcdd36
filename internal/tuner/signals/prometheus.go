package signals

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	promconfig "github.com/prometheus/common/config"
	"github.com/prometheus/common/model"

	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// PrometheusOptions configures NewPrometheus.
type PrometheusOptions struct {
	Config config.Prometheus
	// Step is the query resolution: policy.sampleInterval, which should be
	// the exporters' scrape interval.
	Step   time.Duration
	Logger *slog.Logger
}

// Prometheus is the `prometheus` source: each Observe runs range queries
// over the window, at one point per Step.
type Prometheus struct {
	o   PrometheusOptions
	api v1.API
	log *slog.Logger
}

// NewPrometheus builds the source.
func NewPrometheus(o PrometheusOptions) (*Prometheus, error) {
	if o.Step <= 0 {
		return nil, fmt.Errorf("signals: step must be > 0, got %s", o.Step)
	}
	rt, err := promconfig.NewRoundTripperFromConfig(o.Config.HTTPClient, "gpuslice-tuner")
	if err != nil {
		return nil, fmt.Errorf("signals.prometheus.httpClient: %w", err)
	}
	c, err := api.NewClient(api.Config{Address: o.Config.URL, RoundTripper: rt})
	if err != nil {
		return nil, fmt.Errorf("signals.prometheus.url: %w", err)
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Prometheus{o: o, api: v1.NewAPI(c), log: log}, nil
}

// Queries returns the PromQL the source runs, by what it reads. Every
// aggregation keeps node and uuid (and the container) and takes the max, so
// two scrapes of one exporter (two Prometheus jobs) are not counted twice.
func (p *Prometheus) Queries() map[string]string {
	n := p.o.Config.NodeLabel
	sel := "{" + n + `!=""`
	if p.o.Config.Selector != "" {
		sel += ", " + p.o.Config.Selector
	}
	sel += "}"
	// Twice the step: a scrape that lands just outside one step's range
	// still counts, and a peak seen by two steps is still one peak.
	rng := model.Duration(2 * p.o.Step).String()
	by := func(extra string) string { return "max by (" + n + ", uuid" + extra + ") " }
	return map[string]string{
		// gpu: the index, which a plugin config's devices list names.
		"total":      by(", gpu") + "(" + MetricMemoryTotal + sel + ")",
		"used":       by("") + "(" + MetricMemoryUsed + sel + ")",
		"containers": by(", namespace, pod, container") + "(max_over_time(" + MetricContainerMemory + sel + "[" + rng + "]))",
		"limits":     by(", namespace, pod, container") + "(" + MetricContainerLimit + sel + ")",
		"advertised": "sum by (" + n + ", uuid) (" + by(", resource") + "(" + MetricReplicas + sel + "))",
		"allocated":  "sum by (" + n + ", uuid) (" + by(", resource") + "(" + MetricReplicasAllocated + sel + "))",
		// instance: a rolled-out exporter's counters begin again (it
		// counts no history), at 0 or at a new event's 1; merged with the
		// old pod's series, a 1 after a 1 would read as no event.
		"oom": by(", namespace, pod, container, source, kind, instance") + "(" + MetricOOMEvents + sel + ")",
		// An exporter restarted under the same instance (in place, or with
		// hostNetwork) shows by its start time.
		// Only the exporters' (the targets that serve GPU series): another
		// program's start under the same instance is not the exporter's.
		"starts": "max by (" + n + ", instance) (" + metricProcessStart + sel + " and on (job, instance) " + MetricMemoryTotal + sel + ")",
	}
}

type gpuKey struct{ node, uuid string }

// Observe implements Source. The queries start one step before the window:
// that step is the OOM counters' baseline.
func (p *Prometheus) Observe(ctx context.Context, now time.Time, window time.Duration) (map[string][]policy.GPUObservation, error) {
	ctx, cancel := context.WithTimeout(ctx, p.o.Config.Timeout)
	defer cancel()
	step := p.o.Step
	r := v1.Range{Start: now.Add(-window - step), End: now, Step: step}
	res := map[string]model.Matrix{}
	for name, q := range p.Queries() {
		v, warnings, err := p.api.QueryRange(ctx, q, r)
		if err != nil {
			return nil, fmt.Errorf("prometheus query %s: %w", q, err)
		}
		if len(warnings) > 0 {
			p.log.Debug("prometheus query warnings", "query", q, "warnings", warnings)
		}
		m, ok := v.(model.Matrix)
		if !ok {
			return nil, fmt.Errorf("prometheus query %s: got %s, want a matrix", q, v.Type())
		}
		res[name] = m
	}
	nl := model.LabelName(p.o.Config.NodeLabel)
	key := func(m model.Metric) gpuKey { return gpuKey{string(m[nl]), string(m["uuid"])} }

	samples := map[gpuKey]map[model.Time]*policy.Sample{}
	nodeFirst := map[string]model.Time{}
	for _, s := range res["total"] {
		k := key(s.Metric)
		// One GPU can have two series: its index changed (a reboot).
		byT := samples[k]
		if byT == nil {
			byT = map[model.Time]*policy.Sample{}
			samples[k] = byT
		}
		for _, pt := range s.Values {
			if !finite(float64(pt.Value)) {
				continue
			}
			byT[pt.Timestamp] = &policy.Sample{Time: pt.Timestamp.Time(), GPU: string(s.Metric["gpu"]), MemoryTotalBytes: toBytes(float64(pt.Value)), ContainerPeaks: map[string]uint64{}}
			if f, ok := nodeFirst[k.node]; !ok || pt.Timestamp < f {
				nodeFirst[k.node] = pt.Timestamp
			}
		}
	}
	each := func(name string, f func(s *policy.Sample, m model.Metric, v float64)) {
		for _, s := range res[name] {
			byT := samples[key(s.Metric)]
			for _, pt := range s.Values {
				if smp := byT[pt.Timestamp]; smp != nil && finite(float64(pt.Value)) {
					f(smp, s.Metric, float64(pt.Value))
				}
			}
		}
	}
	each("used", func(s *policy.Sample, _ model.Metric, v float64) { s.MemoryUsedBytes = toBytes(v) })
	each("containers", func(s *policy.Sample, m model.Metric, v float64) {
		s.ContainerPeaks[ContainerKey(string(m["namespace"]), string(m["pod"]), string(m["container"]))] = toBytes(v)
	})
	each("limits", func(s *policy.Sample, m model.Metric, v float64) {
		if s.ContainerLimits == nil {
			s.ContainerLimits = map[string]uint64{}
		}
		s.ContainerLimits[ContainerKey(string(m["namespace"]), string(m["pod"]), string(m["container"]))] = toBytes(v)
	})
	each("advertised", func(s *policy.Sample, _ model.Metric, v float64) { s.ReplicasAdvertised = int(math.Round(v)) })
	each("allocated", func(s *policy.Sample, _ model.Metric, v float64) { s.ReplicasAllocated = int(math.Round(v)) })

	out := map[string][]policy.GPUObservation{}
	sorted := map[gpuKey][]*policy.Sample{}
	for k, byT := range samples {
		ss := make([]*policy.Sample, 0, len(byT))
		for _, s := range byT {
			ss = append(ss, s)
		}
		sort.Slice(ss, func(i, j int) bool { return ss[i].Time.Before(ss[j].Time) })
		sorted[k] = ss
	}
	// Each exporter's process start time by step: a counter after a restart
	// begins again (the exporter counts no history), so its value then is
	// all new even where it equals the one before.
	type target struct{ node, instance string }
	starts := map[target]map[model.Time]model.SampleValue{}
	for _, s := range res["starts"] {
		byT := map[model.Time]model.SampleValue{}
		for _, pt := range s.Values {
			byT[pt.Timestamp] = pt.Value
		}
		starts[target{string(s.Metric[nl]), string(s.Metric["instance"])}] = byT
	}
	restarted := func(m model.Metric, from, to model.Time) bool {
		byT := starts[target{string(m[nl]), string(m["instance"])}]
		a, okA := byT[from]
		b, okB := byT[to]
		return okA && okB && a != b
	}
	for _, s := range res["oom"] {
		k := key(s.Metric)
		ss := sorted[k]
		first, ok := nodeFirst[k.node]
		if !ok || len(ss) == 0 {
			continue
		}
		var prev *model.SamplePair
		for _, pt := range s.Values {
			if !finite(float64(pt.Value)) {
				continue
			}
			v := float64(pt.Value)
			var d float64
			switch {
			case prev == nil && pt.Timestamp <= first:
				// The node's first step: a baseline.
			case prev == nil || v < float64(prev.Value) || (restarted(s.Metric, prev.Timestamp, pt.Timestamp) && pt.Timestamp.Sub(prev.Timestamp) > step):
				// A new series, a reset, or a restarted exporter's counter
				// after a gap: its old series ended when the old process
				// did (a value carried across the restart with no gap is
				// the old one, still in view after a Prometheus restart).
				d = v
			default:
				d = v - float64(prev.Value)
			}
			prev = &pt
			if d <= 0 {
				continue
			}
			// To the GPU's first sample at or after the step.
			t := pt.Timestamp.Time()
			j := sort.Search(len(ss), func(j int) bool { return !ss[j].Time.Before(t) })
			if j < len(ss) {
				n := int(math.Round(d))
				ss[j].OOMEvents += n
				o := oomOf(labelsOf(s.Metric))
				for range n {
					ss[j].OOMs = append(ss[j].OOMs, o)
				}
			}
		}
	}
	from := now.Add(-window)
	for k, ss := range sorted {
		var obs policy.GPUObservation
		obs.UUID = k.uuid
		for _, s := range ss {
			if !s.Time.Before(from) {
				obs.Samples = append(obs.Samples, *s)
			}
		}
		if len(obs.Samples) > 0 {
			out[k.node] = append(out[k.node], obs)
		}
	}
	for _, obs := range out {
		sortGPUs(obs)
	}
	return out, nil
}

func labelsOf(m model.Metric) map[string]string {
	l := make(map[string]string, len(m))
	for k, v := range m {
		l[string(k)] = string(v)
	}
	return l
}

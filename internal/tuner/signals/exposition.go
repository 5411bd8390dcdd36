package signals

import (
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// The exporter's metrics the tuner reads (DESIGN.md, "Exporter contract").
const (
	MetricMemoryTotal     = "gpuslice_gpu_memory_total_bytes"
	MetricMemoryUsed      = "gpuslice_gpu_memory_used_bytes"
	MetricContainerMemory = "gpuslice_container_gpu_memory_used_bytes"
	// MetricContainerLimit is an MPS client container's pinned memory
	// limit (policy.Sample.ContainerLimits).
	MetricContainerLimit    = "gpuslice_container_gpu_memory_limit_bytes"
	MetricReplicas          = "gpuslice_gpu_replicas"
	MetricReplicasAllocated = "gpuslice_gpu_replicas_allocated"
	MetricOOMEvents         = "gpuslice_gpu_oom_events_total"
)

// ErrExposition wraps errors about a scraped metrics document.
var ErrExposition = errors.New("bad exporter metrics")

// GPUReading is what one scrape says about one GPU.
type GPUReading struct {
	// Index is the exporter's gpu label, the GPU's index on its node.
	Index            string
	MemoryTotalBytes uint64
	MemoryUsedBytes  uint64
	// Containers maps ContainerKey to the container's memory on this GPU.
	Containers map[string]uint64
	// Limits maps ContainerKey to the pinned memory limit of a container's
	// MPS clients on this GPU, where the exporter reads one; nil when it
	// reads none (a GPU not shared through MPS).
	Limits map[string]uint64
	// Replicas are summed over resources: a GPU's replica IDs, whatever
	// resource name they are advertised under.
	ReplicasAdvertised int
	ReplicasAllocated  int
	// OOMCounters maps an OOM counter series (container, source and kind)
	// to its value, and OOMSeries the same series to the container and kind
	// each of its events is reported with.
	OOMCounters map[string]float64
	OOMSeries   map[string]policy.OOM
	// Idle maps ContainerKey to the container's idle gauge on this GPU
	// (MetricContainerIdle): every container holding replica IDs of it.
	Idle map[string]IdleHolder
}

// Reading is one scrape of one exporter: its GPUs by UUID. A GPU is in it
// when its total memory is (a GPU whose NVML reads failed has no series).
type Reading map[string]*GPUReading

// ParseExposition reads an exporter's /metrics in the Prometheus text format.
func ParseExposition(r io.Reader) (Reading, error) {
	out, _, err := parseExposition(r)
	return out, err
}

// metricProcessStart is the exporter process's start time: when it changes,
// the exporter restarted and its counters began again.
const metricProcessStart = "process_start_time_seconds"

// parseExposition is ParseExposition, and the exporter's process start time
// (0 when it has none).
func parseExposition(r io.Reader) (Reading, float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrExposition, err)
	}
	out := Reading{}
	each := func(name string, f func(l map[string]string, v float64)) {
		fam := fams[name]
		if fam == nil {
			return
		}
		for _, m := range fam.GetMetric() {
			if v := value(m); finite(v) {
				f(labelMap(m), v)
			}
		}
	}
	var start float64
	each(metricProcessStart, func(_ map[string]string, v float64) { start = v })
	each(MetricMemoryTotal, func(l map[string]string, v float64) {
		if u := l["uuid"]; u != "" {
			out[u] = &GPUReading{Index: l["gpu"], MemoryTotalBytes: toBytes(v), Containers: map[string]uint64{}, OOMCounters: map[string]float64{}, OOMSeries: map[string]policy.OOM{}, Idle: map[string]IdleHolder{}}
		}
	})
	gpu := func(l map[string]string) *GPUReading { return out[l["uuid"]] }
	each(MetricMemoryUsed, func(l map[string]string, v float64) {
		if g := gpu(l); g != nil {
			g.MemoryUsedBytes = toBytes(v)
		}
	})
	each(MetricContainerMemory, func(l map[string]string, v float64) {
		if g := gpu(l); g != nil {
			g.Containers[ContainerKey(l["namespace"], l["pod"], l["container"])] += toBytes(v)
		}
	})
	each(MetricContainerLimit, func(l map[string]string, v float64) {
		if g := gpu(l); g != nil {
			if g.Limits == nil {
				g.Limits = map[string]uint64{}
			}
			g.Limits[ContainerKey(l["namespace"], l["pod"], l["container"])] = toBytes(v)
		}
	})
	each(MetricReplicas, func(l map[string]string, v float64) {
		if g := gpu(l); g != nil {
			g.ReplicasAdvertised += int(math.Round(v))
		}
	})
	each(MetricReplicasAllocated, func(l map[string]string, v float64) {
		if g := gpu(l); g != nil {
			g.ReplicasAllocated += int(math.Round(v))
		}
	})
	each(MetricContainerIdle, func(l map[string]string, v float64) {
		if g := gpu(l); g != nil && l["pod"] != "" {
			g.Idle[ContainerKey(l["namespace"], l["pod"], l["container"])] = IdleHolder{
				Namespace: l["namespace"], Pod: l["pod"], Container: l["container"], Idle: seconds(v)}
		}
	})
	each(MetricOOMEvents, func(l map[string]string, v float64) {
		// A GPU missing from this scrape (a failed NVML read) skips its
		// counters; the tracker remembers their last values, so the next
		// reading with the GPU counts what happened in between.
		g := gpu(l)
		if g == nil {
			return
		}
		series := oomSeries(l["namespace"], l["pod"], l["container"], l["source"]) + "/" + l["kind"]
		g.OOMCounters[series] = v
		g.OOMSeries[series] = oomOf(l)
	})
	return out, start, nil
}

func oomSeries(namespace, pod, container, source string) string {
	return ContainerKey(namespace, pod, container) + "/" + source
}

// oomOf is the OOM an event of a counter series stands for. The `kind`
// label (internal/oom's Kind.Label: device, process-cap, encoder-session,
// unknown) is optional; an exporter without it, "unknown" or a value this
// tuner does not know leaves the kind to the policy's memory figures.
func oomOf(l map[string]string) policy.OOM {
	o := policy.OOM{Kind: policy.OOMUnknown}
	if l["pod"] != "" {
		o.Container = ContainerKey(l["namespace"], l["pod"], l["container"])
	}
	switch k := policy.OOMKind(l["kind"]); k {
	case policy.OOMDevice, policy.OOMCap, policy.OOMEncoderSession:
		o.Kind = k
	}
	return o
}

func labelMap(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return math.NaN()
}

// finite says whether a sample is a number the policy can use: an exporter
// gone wrong can expose NaN or ±Inf, which as memory would read as a full
// card or an empty one, and as a count as a huge negative one. Both
// sources drop such samples.
func finite(v float64) bool {
	return !math.IsNaN(v) && !math.IsInf(v, 0)
}

func toBytes(v float64) uint64 {
	if math.IsNaN(v) || v <= 0 {
		return 0
	}
	if v >= math.MaxUint64 {
		return math.MaxUint64
	}
	return uint64(v)
}

// oomTracker turns OOM counters into events since the previous look at one
// target (see the package doc for the rules).
type oomTracker struct {
	// gpus holds when each GPU was last in a reading. A GPU's first
	// reading, or its first after forgetCounter, is its counters'
	// baseline: a GPU that NVML could not read when the tracker began
	// would otherwise count its counters' whole past when it comes back.
	gpus  map[string]time.Time
	last  map[string]counterState // uuid + series → last value
	start float64                 // the exporter's process start, 0 unknown
}

type counterState struct {
	v    float64
	seen time.Time
}

// forgetCounter is how long a counter nobody reports is remembered; a
// container whose counter comes back after that counts it again, which is
// far beyond the policy's window anyway.
const forgetCounter = 2 * time.Hour

func newOOMTracker() *oomTracker {
	return &oomTracker{gpus: map[string]time.Time{}, last: map[string]counterState{}}
}

// started notes the exporter's process start time. When it changed, the
// exporter restarted: its counters begin again (it counts no history), at
// 0 or at a new event's 1, so the values remembered from the process
// before mean nothing; a counter at 1 again would read as no event.
func (t *oomTracker) started(start float64) {
	if start != 0 && t.start != 0 && start != t.start {
		clear(t.last)
	}
	if start != 0 {
		t.start = start
	}
}

// events returns the OOM events per GPU UUID since the previous call.
func (t *oomTracker) events(r Reading, now time.Time) map[string][]policy.OOM {
	out := map[string][]policy.OOM{}
	for uuid, g := range r {
		seen, known := t.gpus[uuid]
		baseline := !known || now.Sub(seen) > forgetCounter
		t.gpus[uuid] = now
		for series, v := range g.OOMCounters {
			k := uuid + "\x00" + series
			prev, ok := t.last[k]
			var d float64
			switch {
			case baseline:
			case !ok || v < prev.v:
				d = v
			default:
				d = v - prev.v
			}
			t.last[k] = counterState{v: v, seen: now}
			for range int(math.Round(d)) {
				out[uuid] = append(out[uuid], g.OOMSeries[series])
			}
		}
	}
	for k, c := range t.last {
		if now.Sub(c.seen) > forgetCounter {
			delete(t.last, k)
		}
	}
	for uuid, seen := range t.gpus {
		if now.Sub(seen) > forgetCounter {
			delete(t.gpus, uuid)
		}
	}
	return out
}

// samples turns a reading into one sample per GPU at time at.
func (t *oomTracker) samples(r Reading, at time.Time) map[string]policy.Sample {
	ooms := t.events(r, at)
	out := make(map[string]policy.Sample, len(r))
	for uuid, g := range r {
		out[uuid] = policy.Sample{
			Time:               at,
			GPU:                g.Index,
			MemoryTotalBytes:   g.MemoryTotalBytes,
			MemoryUsedBytes:    g.MemoryUsedBytes,
			ContainerPeaks:     g.Containers,
			ContainerLimits:    g.Limits,
			OOMEvents:          len(ooms[uuid]),
			OOMs:               ooms[uuid],
			ReplicasAdvertised: g.ReplicasAdvertised,
			ReplicasAllocated:  g.ReplicasAllocated,
		}
	}
	return out
}

// Package exporter turns one reading of the node — GPUs, the kubelet's
// allocations, /proc and the pod list — into gpuslice_* metrics. Every scrape
// reads everything afresh (nothing is fed by a ticker) and exposes it as const
// metrics, so what a scrape shows is one consistent moment.
//
// Each data source is a "collector" with its own
// gpuslice_exporter_collect_success and _duration_seconds series: a source
// that fails (a missing kubelet socket, a GPU that errors) drops only its own
// series, and the scrape still answers.
package exporter

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/internal/attribution"
	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/oom"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/pods"
)

// Collector names, the values of the collector label.
const (
	CollectorGPU          = "gpu"
	CollectorPodResources = "podresources"
	CollectorPods         = "pods"
	CollectorProcfs       = "procfs"
	CollectorOOM          = "oom"
)

// Kubelet is what the exporter needs from the PodResources API.
type Kubelet interface {
	List(ctx context.Context) ([]podresources.Allocation, error)
	Allocatable(ctx context.Context) ([]podresources.Allocatable, error)
}

// Config wires the exporter to its sources. Only GPU is required: without a
// kubelet or pod source the exporter still reports device metrics, and every
// process counts as unattributed.
type Config struct {
	GPU     gpu.Backend
	Kubelet Kubelet     // nil: no allocation metrics
	Pods    pods.Source // nil: no pod names
	// Procfs is the /proc of the host (the exporter runs with hostPID).
	Procfs string
	// OOM finds GPU OOM events; nil turns that collector off.
	OOM *oom.Detector
	// Timeout bounds each scrape's kubelet calls.
	Timeout time.Duration
	Logger  *slog.Logger
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// Exporter is a prometheus.Collector.
type Exporter struct {
	cfg Config
	log *slog.Logger

	// mu serializes scrapes: the OOM detector and the counters below are
	// not safe for concurrent scrapes, and two Prometheus servers scraping
	// at once gain nothing from parallel NVML calls.
	mu   sync.Mutex
	proc *procReader
	ooms *oomCounter
	// index is every UUID → gpu label seen so far. A scrape whose GPU
	// reading fails still labels allocation and OOM series with the GPU's
	// index: relabelling them gpu="" would start new series, and a counter
	// series that appears already above zero fires the OOM alert.
	index map[string]string
}

// New builds an Exporter.
func New(cfg Config) *Exporter {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Procfs == "" {
		cfg.Procfs = "/proc"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Exporter{
		cfg:   cfg,
		log:   cfg.Logger,
		proc:  newProcReader(cfg.Procfs, cfg.Logger),
		ooms:  newOOMCounter(),
		index: map[string]string{},
	}
}

// Describe sends nothing: the exporter is an unchecked collector, since
// which series exist depends on the node.
func (e *Exporter) Describe(chan<- *prometheus.Desc) {}

// Collect reads the node and sends every metric.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()

	var in attribution.Input
	in.Pods = e.cfg.Pods

	// GPUs.
	start := time.Now()
	snap, err := e.cfg.GPU.Snapshot(ctx)
	ok := err == nil && len(snap.Failed) == 0
	if err != nil {
		e.log.Warn("reading GPUs", "err", err)
	}
	for _, f := range snap.Failed {
		e.log.Warn("reading GPU", "gpu", f.Index, "uuid", f.UUID, "err", f.Err)
	}
	in.Devices = snap.Devices
	index := e.updateIndex(snap)
	emitDevices(ch, snap)
	emitXids(ch, snap.Devices, e.cfg.GPU.Xids())
	report(ch, CollectorGPU, start, ok)

	// Kubelet allocations.
	if e.cfg.Kubelet != nil {
		start = time.Now()
		allocs, errList := e.cfg.Kubelet.List(ctx)
		allocatable, errAlloc := e.cfg.Kubelet.Allocatable(ctx)
		if errList != nil {
			e.log.Warn("listing pod resources", "err", errList)
		}
		if errAlloc != nil {
			e.log.Warn("reading allocatable resources", "err", errAlloc)
		}
		in.Allocations = allocs
		in.Allocatable = allocatable
		report(ch, CollectorPodResources, start, errList == nil && errAlloc == nil)
	}

	// Pod list (read from the source's cache: no I/O here).
	if e.cfg.Pods != nil {
		start = time.Now()
		perr := e.cfg.Pods.Err()
		if perr != nil {
			e.log.Warn("pod source", "err", perr)
		}
		report(ch, CollectorPods, start, perr == nil)
	}

	// /proc: which pod each GPU process is in.
	start = time.Now()
	refs, gone, perr := e.proc.read(snap.Devices)
	in.Refs, in.Gone = refs, gone
	report(ch, CollectorProcfs, start, perr == nil)

	res := attribution.Join(in)
	emitAttribution(ch, res, index)

	if e.cfg.OOM != nil {
		start = time.Now()
		err := e.ooms.scan(e.cfg.OOM, res, e.cfg.Pods, e.cfg.Now())
		if err != nil {
			e.log.Warn("scanning for GPU OOM events", "err", err)
		}
		e.ooms.emit(ch, index)
		report(ch, CollectorOOM, start, err == nil)
	}
}

// updateIndex records the gpu label (the NVML index) of every GPU in the
// snapshot, failed ones included, and returns the map of all GPUs seen. A
// node's GPUs are few, so nothing is ever dropped.
func (e *Exporter) updateIndex(s gpu.Snapshot) map[string]string {
	for _, d := range s.Devices {
		e.index[d.UUID] = strconv.Itoa(d.Index)
	}
	for _, f := range s.Failed {
		if f.UUID != "" {
			e.index[f.UUID] = strconv.Itoa(f.Index)
		}
	}
	return e.index
}

func report(ch chan<- prometheus.Metric, collector string, start time.Time, ok bool) {
	ch <- prometheus.MustNewConstMetric(collectDuration, prometheus.GaugeValue, time.Since(start).Seconds(), collector)
	v := 0.0
	if ok {
		v = 1
	}
	ch <- prometheus.MustNewConstMetric(collectSuccess, prometheus.GaugeValue, v, collector)
}

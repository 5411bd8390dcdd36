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
	"errors"
	"io/fs"
	"log/slog"
	"path/filepath"
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

// DefaultScrapeTimeout bounds a whole scrape: under Prometheus's default
// scrape_timeout (10 s), so that a slow source leaves a partial answer in
// time rather than a scrape Prometheus gave up on.
const DefaultScrapeTimeout = 9 * time.Second

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
	// Timeout bounds each source of a scrape (the GPU reading, the
	// kubelet's calls, ...) on its own, within ScrapeTimeout.
	Timeout time.Duration
	// ScrapeTimeout bounds the whole scrape (DefaultScrapeTimeout when 0).
	ScrapeTimeout time.Duration
	Logger        *slog.Logger
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
	// MaxGPUFailures is how many collections in a row may read no GPU
	// before Healthz fails (once a GPU has been read); 0 never fails.
	MaxGPUFailures int
	// KubeletRestartGrace is how long after the kubelet restarts an empty
	// PodResources list is taken for a kubelet that has not read its pods
	// back yet (kubeletReady); default 2 minutes.
	KubeletRestartGrace time.Duration
}

// Exporter is a prometheus.Collector.
type Exporter struct {
	cfg Config
	log *slog.Logger

	// mu serializes scrapes: the OOM detector and the counters below are
	// not safe for concurrent scrapes, and two Prometheus servers scraping
	// at once gain nothing from parallel NVML calls.
	mu     sync.Mutex
	proc   *procReader
	ooms   *oomCounter
	idle   *idleTracker
	energy *energyMeter
	series *seriesSet
	// index is every UUID → gpu label seen so far. A scrape whose GPU
	// reading fails still labels allocation and OOM series with the GPU's
	// index: relabelling them gpu="" would start new series, and a counter
	// series that appears already above zero fires the OOM alert.
	index map[string]string
	// migParent is every MIG device UUID → its GPU's UUID seen so far, so
	// that MIG allocations keep counting on their GPU in a scrape whose
	// reading of that GPU fails, and in the OOM watch, which reads no GPU.
	migParent map[string]string
	// inputs are read in order, then joined; outputs need the join.
	inputs, outputs []source
	// health judges /healthz from the GPU readings (its own lock).
	health *health
	// gpuResources are the resource names the kubelet has listed GPU
	// devices for (RunOOMWatch watches containers asking for them).
	gpuResources map[string]bool
	// badLimits are the MPS clients whose pinned memory limit did not
	// parse and was logged (pinnedLimit).
	badLimits map[int]bool
	// procfsFailing is the failure of /proc last logged, "" while it
	// reads (logProcfs).
	procfsFailing string
	// memoryUnknown is whether the last scrape read a process whose memory
	// the driver gave as not available (logMemoryUnknown).
	memoryUnknown bool
	// kubeletAt is the PodResources socket of the last answer read
	// (kubeletSeen: there was one), and kubeletRestarted when a new one
	// was seen, until an answer is trusted again (kubeletReady).
	kubeletAt        podresources.Instance
	kubeletSeen      bool
	kubeletRestarted time.Time
}

// source is one thing a scrape reads, timed and reported the same way for
// all (node_exporter's execute): collect fills the scrape's inputs, sends
// the metrics that need nothing else, and returns false when part or all
// of the source failed.
type source struct {
	name    string
	collect func(sc *scrape) bool
}

// scrape is what one Collect has read so far.
type scrape struct {
	// whole ends at the scrape's deadline; ctx is the running source's.
	whole context.Context
	ctx   context.Context
	em    emitter
	in    attribution.Input
	index map[string]string
	res   attribution.Result
	// failed names the sources that failed in this scrape.
	failed map[string]bool
	// mpsGPUs are the GPUs read, true for those running an MPS server, and
	// capped their MPS clients (emitMPS).
	mpsGPUs map[string]bool
	capped  []capped
}

// New builds an Exporter.
func New(cfg Config) *Exporter {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Procfs == "" {
		cfg.Procfs = "/proc"
	}
	if cfg.ScrapeTimeout <= 0 {
		cfg.ScrapeTimeout = DefaultScrapeTimeout
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.KubeletRestartGrace <= 0 {
		cfg.KubeletRestartGrace = 2 * time.Minute
	}
	// One forget period for every series of a container that is gone: the
	// OOM tracker's (its detector's Config.ForgetAfter).
	forgetAfter := oom.DefaultForgetAfter
	var ooms *oomCounter
	if cfg.OOM != nil {
		ooms = &oomCounter{t: oom.NewTracker(cfg.OOM)}
		forgetAfter = ooms.t.ForgetAfter()
	}
	e := &Exporter{
		cfg:    cfg,
		log:    cfg.Logger,
		proc:   newProcReader(cfg.Procfs, cfg.Logger),
		ooms:   ooms,
		idle:   newIdleTracker(),
		energy: newEnergyMeter(forgetAfter),
		series: newSeriesSet(),
		index:  map[string]string{},
		health: &health{max: cfg.MaxGPUFailures},

		gpuResources: map[string]bool{},
		badLimits:    map[int]bool{},
		migParent:    map[string]string{},
	}
	e.inputs = append(e.inputs, source{CollectorGPU, e.collectGPU})
	if cfg.Kubelet != nil {
		e.inputs = append(e.inputs, source{CollectorPodResources, e.collectPodResources})
	}
	if cfg.Pods != nil {
		e.inputs = append(e.inputs, source{CollectorPods, e.collectPods})
	}
	e.inputs = append(e.inputs, source{CollectorProcfs, e.collectProcfs})
	if cfg.OOM != nil {
		e.outputs = append(e.outputs, source{CollectorOOM, e.collectOOM})
	}
	if l, ok := cfg.GPU.(gpu.ProcessLister); ok && ooms != nil {
		ooms.t.SetMPSProbe(func(uuid string) bool { return e.mpsServerNow(l, uuid) })
	}
	return e
}

// Close releases the files the exporter keeps open between scrapes (the
// stat files of GPU processes). The exporter may collect again after it,
// reopening them.
func (e *Exporter) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.proc.forget(nil)
	return nil
}

// Describe sends nothing: the exporter is an unchecked collector, since
// which series exist depends on the node.
func (e *Exporter) Describe(chan<- *prometheus.Desc) {}

// Collect reads the node and sends every metric.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.collect()
	e.series.send(ch)
}

// collect reads the node into e.series. The caller holds e.mu.
func (e *Exporter) collect() {
	whole, cancel := context.WithTimeout(context.Background(), e.cfg.ScrapeTimeout)
	defer cancel()
	e.series.begin()
	sc := &scrape{whole: whole, em: emitter{set: e.series}, index: e.index, failed: map[string]bool{}}
	sc.in.Pods = e.cfg.Pods
	sc.in.MIGParents = e.migParent
	for _, s := range e.inputs {
		e.execute(sc, s)
	}
	mps := e.splitMPS(sc)
	sc.res = attribution.Join(sc.in)
	emitAttribution(sc.em, sc.res, sc.index)
	if !sc.failed[CollectorGPU] {
		// A failed reading lists no process: no news either way.
		e.logMemoryUnknown(sc.in.Devices)
	}
	e.emitMPS(sc, mps)
	e.collectIdle(sc)
	e.energy.update(sc.in.Devices, sc.res, e.cfg.Now())
	e.energy.emit(sc.em, sc.index)
	for _, s := range e.outputs {
		e.execute(sc, s)
	}
	e.series.finish()
}

// execute runs one source with a deadline of its own: with only the one
// of the whole scrape, a GPU reading that took most of Timeout (NVML calls
// block, a GPU in trouble can take seconds) left the kubelet none, and a
// healthy kubelet was reported failed and its series dropped. The
// scrape's own deadline still bounds them all, so that a scrape answers
// within Prometheus's timeout rather than not at all.
func (e *Exporter) execute(sc *scrape, s source) {
	ctx, cancel := context.WithTimeout(sc.whole, e.cfg.Timeout)
	defer cancel()
	sc.ctx = ctx
	start := time.Now()
	ok := s.collect(sc)
	sc.em.gauge(collectDuration, time.Since(start).Seconds(), s.name)
	v := 0.0
	if ok {
		v = 1
	} else {
		sc.failed[s.name] = true
	}
	sc.em.gauge(collectSuccess, v, s.name)
}

// collectIdle reports how long each holder of a replica ID has not used its
// GPU. It needs a whole join: with the allocations unread every holder would
// be forgotten, and with the processes or pods unread a busy container would
// look idle, so a scrape missing either reports no idle series and moves no
// clock.
func (e *Exporter) collectIdle(sc *scrape) {
	if e.cfg.Kubelet == nil || sc.failed[CollectorPodResources] || sc.failed[CollectorProcfs] || sc.failed[CollectorPods] {
		return
	}
	gpus := make(map[string]bool, len(sc.in.Devices))
	for _, d := range sc.in.Devices {
		gpus[d.UUID] = true
	}
	emitIdle(sc.em, e.idle.update(sc.res, gpus, e.cfg.Now()), sc.index)
}

// collectGPU reads the GPUs.
func (e *Exporter) collectGPU(sc *scrape) bool {
	snap, err := e.cfg.GPU.Snapshot(sc.ctx)
	e.health.recordSnapshot(snap, err)
	if err != nil {
		e.log.Warn("reading GPUs", "err", err)
	}
	for _, f := range snap.Failed {
		e.log.Warn("reading GPU", "gpu", f.Index, "uuid", f.UUID, "err", f.Err)
	}
	sc.in.Devices = snap.Devices
	e.updateIndex(snap)
	emitDevices(sc.em, snap)
	emitXids(sc.em, snap.Devices, e.cfg.GPU.Xids())
	return err == nil && len(snap.Failed) == 0
}

// collectPodResources reads the kubelet's allocations.
func (e *Exporter) collectPodResources(sc *scrape) bool {
	allocs, errList := e.cfg.Kubelet.List(sc.ctx)
	allocatable, errAlloc := e.cfg.Kubelet.Allocatable(sc.ctx)
	if errList != nil {
		e.log.Warn("listing pod resources", "err", errList)
	}
	if errAlloc != nil {
		e.log.Warn("reading allocatable resources", "err", errAlloc)
	}
	if errList == nil && !e.kubeletReady(allocs) {
		// Neither answer is used: the allocatable devices of a kubelet
		// whose plugins have not registered again would read as "0 of N
		// allocated" too.
		return false
	}
	sc.in.Allocations = allocs
	sc.in.Allocatable = allocatable
	return errList == nil && errAlloc == nil
}

// kubeletReady tells whether a PodResources list can be trusted. A kubelet
// that starts again answers on its new socket before it has read its pods
// back (DESIGN.md, the real node): its empty list would forget every
// holder's idle clock (a notebook idle for two days would read 0) and drop
// the allocation series. So after a new socket, an empty list is taken for
// a kubelet that is not ready, and the scrape reports neither, until a
// list names a container or KubeletRestartGrace has passed (a node whose
// GPU pods did all end).
func (e *Exporter) kubeletReady(allocs []podresources.Allocation) bool {
	k, ok := e.cfg.Kubelet.(podresources.InstanceTeller)
	if !ok {
		return true
	}
	now := e.cfg.Now()
	// Read after the answer: a kubelet that restarted at any moment since
	// the last answer is on a new socket now. A socket gone is a kubelet
	// going away or starting again too.
	at := k.Instance()
	if e.kubeletSeen && !at.Same(e.kubeletAt) {
		if e.kubeletRestarted.IsZero() {
			e.log.Info("the kubelet's PodResources socket changed: the kubelet restarted; an empty list is not trusted until one names a container or the grace passes", "grace", e.cfg.KubeletRestartGrace)
		}
		e.kubeletRestarted = now
	}
	e.kubeletAt, e.kubeletSeen = at, true
	if e.kubeletRestarted.IsZero() {
		return true
	}
	if len(allocs) > 0 || now.Sub(e.kubeletRestarted) >= e.cfg.KubeletRestartGrace {
		e.kubeletRestarted = time.Time{}
		return true
	}
	return false
}

// collectPods reports the pod list's health; the list itself is read from
// the source's cache by the join (no I/O here).
func (e *Exporter) collectPods(*scrape) bool {
	err := e.cfg.Pods.Err()
	if err != nil {
		e.log.Warn("pod source", "err", err)
	}
	return err == nil
}

// collectProcfs finds which pod each GPU process is in.
func (e *Exporter) collectProcfs(sc *scrape) bool {
	refs, gone, err := e.proc.read(sc.in.Devices)
	sc.in.Refs, sc.in.Gone = refs, gone
	e.logProcfs(err)
	return err == nil
}

// logProcfs logs a failure to read /proc when it starts or changes, and
// when /proc reads again. A wrong --path.procfs or a /proc the exporter
// may not read fails every scrape the same way; said once, it is not lost
// in the log, and the GPU processes that it leaves unattributed are
// explained.
func (e *Exporter) logProcfs(err error) {
	key := procfsFailure(err)
	if key == e.procfsFailing {
		return
	}
	e.procfsFailing = key
	if err == nil {
		e.log.Info("reading procfs again", "procfs", e.cfg.Procfs)
		return
	}
	e.log.Warn("cannot read procfs; GPU processes count as unattributed", "procfs", e.cfg.Procfs, "err", err)
}

// logMemoryUnknown says when the driver starts and stops giving GPU
// processes' memory as not available (N/A in nvidia-smi), which leaves
// their containers' memory series out: a series missing for good would
// otherwise look like an exporter fault.
func (e *Exporter) logMemoryUnknown(devices []gpu.Device) {
	n := 0
	for _, d := range devices {
		for _, p := range d.Processes {
			if p.MemoryUnknown {
				n++
			}
		}
	}
	if (n > 0) == e.memoryUnknown {
		return
	}
	e.memoryUnknown = n > 0
	if n == 0 {
		e.log.Info("the driver gives every GPU process's memory again")
		return
	}
	e.log.Warn("the driver gives GPU processes' memory as not available (N/A in nvidia-smi); the memory series of their containers, and of their GPUs' unattributed processes, are left out", "processes", n)
}

// procfsFailure names a failure to read /proc without the process it hit:
// the first PID whose cgroup file fails changes from scrape to scrape as
// processes come and go, while what is wrong stays the same.
func procfsFailure(err error) string {
	if err == nil {
		return ""
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Op + " " + filepath.Base(pe.Path) + ": " + pe.Err.Error()
	}
	return err.Error()
}

// collectOOM scans the joined containers for GPU OOM events.
func (e *Exporter) collectOOM(sc *scrape) bool {
	err := e.ooms.scan(sc.res, sc.mpsGPUs, sc.capped, e.cfg.Pods, e.cfg.Now())
	if err != nil {
		e.log.Warn("scanning for GPU OOM events", "err", err)
	}
	e.ooms.emit(sc.em, sc.index)
	return err == nil
}

// updateIndex records the gpu label (the NVML index) of every GPU in the
// snapshot, failed ones included. A node's GPUs are few, so nothing is
// ever dropped.
func (e *Exporter) updateIndex(s gpu.Snapshot) {
	for _, d := range s.Devices {
		e.index[d.UUID] = strconv.Itoa(d.Index)
		for _, m := range d.MIGDevices {
			e.migParent[m.UUID] = d.UUID
		}
	}
	for _, f := range s.Failed {
		if f.UUID != "" {
			e.index[f.UUID] = strconv.Itoa(f.Index)
		}
	}
}

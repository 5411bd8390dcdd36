// Package signals gathers what the tuner's policy looks at: for each node
// and GPU, a window of policy.Sample (total and used memory, each container's
// memory, GPU OOM events since the previous sample, replicas advertised and
// allocated), built from gpuslice-exporter's metrics.
//
// Two sources give the same samples. Exporters scrapes the exporter pods
// itself every policy.sampleInterval and keeps the window in memory (no
// Prometheus needed; the window starts empty at startup, so a new tuner
// holds with InsufficientHistory for one window). Prometheus asks a
// Prometheus server for the window with range queries at each decision, so
// it has history at once and survives restarts.
//
// OOM events come from counters, and a counter's first value says nothing
// about when its events happened: the first look at a GPU of a target (or,
// from Prometheus, the first step a node appears in) is a baseline and
// counts nothing. A series that appears later counts its whole value (the
// exporter creates some of a container's counters at its first OOM), and a
// counter that goes down was reset and counts its new value. A restarted
// exporter counts no history, so its counters begin again at 0 or at a new
// event's 1: Exporters sees the restart in its process_start_time_seconds
// and forgets the values from before, and Prometheus keeps each instance's
// series apart (a rollout is a new instance) and reads each instance's
// process start time too (a restart in place keeps the instance). Samples that are not numbers
// (NaN, ±Inf) are dropped.
package signals

import (
	"context"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// Source gives the controller each node's recent GPU history.
type Source interface {
	// Observe returns, per node name, the samples of each GPU within
	// [now−window, now], oldest first. A node or GPU with no sample in the
	// window is absent. The result must be treated as read-only.
	Observe(ctx context.Context, now time.Time, window time.Duration) (map[string][]policy.GPUObservation, error)
}

// ContainerKey is the key of a container in policy.Sample.ContainerPeaks.
func ContainerKey(namespace, pod, container string) string {
	return namespace + "/" + pod + "/" + container
}

// Window keeps recent samples per node and GPU in memory. It is safe for
// concurrent use and is itself a Source.
type Window struct {
	mu    sync.RWMutex
	keep  time.Duration
	nodes map[string]map[string][]policy.Sample // node → uuid → samples, oldest first
}

// NewWindow keeps samples for keep (at least the policy's window).
func NewWindow(keep time.Duration) *Window {
	return &Window{keep: keep, nodes: map[string]map[string][]policy.Sample{}}
}

// Add records one look at a node: a sample per GPU UUID. Samples are
// expected in time order per GPU; one not after the GPU's latest is dropped.
// The Sample's maps are kept, not copied: callers must not change them.
func (w *Window) Add(node string, samples map[string]policy.Sample) {
	w.mu.Lock()
	defer w.mu.Unlock()
	gpus := w.nodes[node]
	if gpus == nil {
		gpus = map[string][]policy.Sample{}
		w.nodes[node] = gpus
	}
	for uuid, s := range samples {
		ss := gpus[uuid]
		if n := len(ss); n > 0 && !s.Time.After(ss[n-1].Time) {
			continue
		}
		ss = append(ss, s)
		gpus[uuid] = dropBefore(ss, s.Time.Add(-w.keep))
	}
}

// Prune forgets every sample older than now−keep, and nodes and GPUs left
// with none (an exporter that went away).
func (w *Window) Prune(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	from := now.Add(-w.keep)
	for node, gpus := range w.nodes {
		for uuid, ss := range gpus {
			if ss = dropBefore(ss, from); len(ss) == 0 {
				delete(gpus, uuid)
			} else {
				gpus[uuid] = ss
			}
		}
		if len(gpus) == 0 {
			delete(w.nodes, node)
		}
	}
}

// dropBefore removes samples before from. Once half the backing array is
// dead it copies, so a long-running window does not pin old samples.
func dropBefore(ss []policy.Sample, from time.Time) []policy.Sample {
	i := sort.Search(len(ss), func(i int) bool { return !ss[i].Time.Before(from) })
	if i == 0 {
		return ss
	}
	if i > cap(ss)/2 {
		return slices.Clone(ss[i:])
	}
	return ss[i:]
}

// Observe implements Source. The slices returned share memory with the
// window and are capped, so later Adds never show through them.
func (w *Window) Observe(_ context.Context, now time.Time, window time.Duration) (map[string][]policy.GPUObservation, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	from := now.Add(-window)
	out := make(map[string][]policy.GPUObservation, len(w.nodes))
	for node, gpus := range w.nodes {
		var obs []policy.GPUObservation
		for uuid, ss := range gpus {
			lo := sort.Search(len(ss), func(i int) bool { return !ss[i].Time.Before(from) })
			hi := sort.Search(len(ss), func(i int) bool { return ss[i].Time.After(now) })
			if lo < hi {
				obs = append(obs, policy.GPUObservation{UUID: uuid, Samples: ss[lo:hi:hi]})
			}
		}
		if len(obs) > 0 {
			sortGPUs(obs)
			out[node] = obs
		}
	}
	return out, nil
}

func sortGPUs(obs []policy.GPUObservation) {
	slices.SortFunc(obs, func(a, b policy.GPUObservation) int { return strings.Compare(a.UUID, b.UUID) })
}

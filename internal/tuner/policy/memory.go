package policy

import (
	"cmp"
	"maps"
	"slices"
	"time"
)

// Memory is what the tuner remembers about workloads across windows and
// restarts: a window of ten minutes forgets the service that peaks every
// afternoon and the job that OOMed yesterday at 7 pods. The controller keeps
// it in a ConfigMap; `simulate` carries it from tick to tick. Remember is the
// only writer, and it is pure like Decide.
type Memory struct {
	// Updated is the time of the newest sample folded in; older samples are
	// not counted twice.
	Updated time.Time `json:"updated"`
	// Workloads maps a workload key (Observation.ContainerWorkloads) to what
	// was seen of it.
	Workloads map[string]WorkloadMemory `json:"workloads,omitempty"`
	// Base is the count the tuner has not raised: the count it first found,
	// lowered by every lowering that evidence forced (an OOM, pressure,
	// maxReplicas) and raised to the minimum; 0 before the first round.
	// Replicas above it are the tuner's own bets, and only those may be
	// withdrawn on a guess about pods not seen yet (Decide's unbacked
	// rules): the count the operator chose, or that an OOM proved, was not
	// the tuner's to give back. Round keeps it; 0 (Decide without Round)
	// sets no floor.
	Base int `json:"base,omitempty"`
}

// WorkloadMemory is one workload's record.
type WorkloadMemory struct {
	// PeakBytes is the most memory one of its containers used on one GPU.
	PeakBytes uint64 `json:"peakBytes"`
	// Seen is how long its containers were watched, all runs together: a
	// peak watched for less than a Window may not be the working set yet.
	Seen time.Duration `json:"seen"`
	// LastSeen is the last sample that showed it.
	LastSeen time.Time `json:"lastSeen"`
	// OOMAllocated is the fewest pods holding replicas at a sharing OOM of
	// this workload (0: none remembered); LastOOM is the latest such OOM.
	OOMAllocated int       `json:"oomAllocated,omitempty"`
	LastOOM      time.Time `json:"lastOOM,omitzero"`
}

// Known says whether the record prices a pod: watched for a whole window.
func (w WorkloadMemory) Known(cfg Config) bool { return w.Seen >= cfg.Window && w.PeakBytes > 0 }

// Remember folds the samples of obs newer than mem.Updated into a copy of mem
// and forgets workloads not seen for cfg.Remember, keeping at most
// cfg.MaxWorkloads (the most recently seen), so that the record stays small
// enough for one ConfigMap however many jobs pass through a cluster.
//
// A container whose key obs.ContainerWorkloads does not map is remembered
// under its own key: it still prices itself while it runs.
func Remember(cfg Config, mem Memory, obs Observation) Memory {
	out := Memory{Updated: mem.Updated, Workloads: maps.Clone(mem.Workloads), Base: mem.Base}
	if out.Workloads == nil {
		out.Workloads = map[string]WorkloadMemory{}
	}
	newest := mem.Updated
	for _, g := range obs.GPUs {
		for _, s := range g.Samples {
			if !s.Time.After(mem.Updated) || s.Time.After(obs.Now) {
				continue
			}
			newest = later(newest, s.Time)
			seen := map[string]bool{}
			for c, p := range s.ContainerPeaks {
				wl := obs.workload(c)
				w := out.Workloads[wl]
				w.PeakBytes = max(w.PeakBytes, p)
				if !seen[wl] {
					w.Seen += cfg.SampleInterval
					seen[wl] = true
				}
				w.LastSeen = later(w.LastSeen, s.Time)
				out.Workloads[wl] = w
			}
			alloc := s.ReplicasAllocated
			if alloc < 2 || g.Exclusive {
				continue // a lone pod's OOM would happen at any count
			}
			for _, o := range s.OOMs {
				if o.Container == "" || o.Kind == OOMCap || o.Kind == OOMEncoderSession {
					continue
				}
				wl := obs.workload(o.Container)
				w := out.Workloads[wl]
				if w.OOMAllocated == 0 || alloc < w.OOMAllocated || s.Time.Sub(w.LastOOM) >= cfg.Remember {
					w.OOMAllocated = alloc
				}
				w.LastOOM = later(w.LastOOM, s.Time)
				w.LastSeen = later(w.LastSeen, s.Time)
				out.Workloads[wl] = w
			}
		}
	}
	out.Updated = newest
	for k, w := range out.Workloads {
		if obs.Now.Sub(w.LastSeen) > cfg.Remember {
			delete(out.Workloads, k)
		}
	}
	if len(out.Workloads) > cfg.MaxWorkloads {
		keys := slices.SortedFunc(maps.Keys(out.Workloads), func(a, b string) int {
			return cmp.Or(out.Workloads[b].LastSeen.Compare(out.Workloads[a].LastSeen), cmp.Compare(a, b))
		})
		for _, k := range keys[cfg.MaxWorkloads:] {
			delete(out.Workloads, k)
		}
	}
	return out
}

// workload is the workload key of a container key.
func (o Observation) workload(container string) string {
	if wl := o.ContainerWorkloads[container]; wl != "" {
		return wl
	}
	return container
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Round is one decision with its memory: Remember folds obs into obs.Memory,
// then Decide judges with the result. The controller and `simulate` both call
// it, so that the replay runs what the cluster runs.
func Round(cfg Config, obs Observation) (Decision, Memory) {
	obs.Memory = Remember(cfg, obs.Memory, obs)
	if obs.Memory.Base == 0 {
		obs.Memory.Base = obs.CurrentReplicas
	}
	d := Decide(cfg, obs)
	switch d.Reason {
	case ReasonGPUOOM, ReasonMemoryPressure, ReasonAboveMaximum:
		obs.Memory.Base = min(obs.Memory.Base, d.Replicas)
	case ReasonBelowMinimum:
		obs.Memory.Base = max(obs.Memory.Base, d.Replicas)
	}
	return d, obs.Memory
}

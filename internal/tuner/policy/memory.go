package policy

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"time"
)

// Memory is what the tuner remembers about one node's workloads across
// windows and restarts: a window of ten minutes forgets the service that
// peaks every afternoon, the leak that fills the GPU by night and the job
// that OOMed yesterday. The controller keeps it in a ConfigMap, one key per
// node; `simulate` carries it from tick to tick. Remember is the only
// writer, and it is pure like Decide.
type Memory struct {
	// Updated is the time of the newest sample folded in; older samples are
	// not counted twice.
	Updated time.Time `json:"updated"`
	// Workloads maps a workload key (Observation.ContainerWorkloads) to what
	// was seen of it.
	Workloads map[string]WorkloadMemory `json:"workloads,omitempty"`
	// Base is the count the tuner has not raised: the count it first found,
	// lowered by every lowering that evidence forced (an OOM, measured
	// fullness, maxReplicas) and raised to the minimum; 0 before the first
	// round. Replicas above it are the tuner's own bets, and only those may
	// be withdrawn on a guess (pressure, the budget's pricing of pods not
	// seen yet): the count the operator chose, or that an OOM proved, was
	// not the tuner's to give back. Round keeps it; 0 (Decide without Round)
	// sets no floor.
	Base int `json:"base,omitempty"`
	// Containers maps the container keys seen in the last Window to what
	// was seen of each: a container's age says how far along its
	// workload's growth (WorkloadMemory.PeakByAge) it is, and its own peak
	// what it may come back to. Containers gone for a Window are dropped.
	Containers map[string]ContainerMemory `json:"containers,omitempty"`
	// Sizes are the peaks of the last maxSizes containers that ended here,
	// oldest first (an OOM counting as what it asked for): the sizes this
	// node has seen, which price a pod of a workload never seen. A
	// distribution, not its largest member: one 40 GiB model must not
	// price every small job at 40 GiB.
	Sizes []uint64 `json:"sizes,omitempty"`
	// SizesAt are when each of Sizes was last seen (the same order).
	SizesAt []time.Time `json:"sizesAt,omitempty"`
	// Restarts says which of Sizes (the same order; missing: false) were
	// a service's pod that another pod of its workload had replaced when
	// it was dropped: a restart, not a job. A pod never seen is priced
	// as one more of the node's jobs (rankPrice), and a leaking service
	// restarted at 19.3 GiB priced every 1-12 GiB job of a stream at
	// 6.5 ± 6.7 GiB (held-out seed 107). It still counts among the sizes
	// of the pods that came, which price a spare replica: a service's
	// next restart is a pod not here yet too.
	Restarts []bool `json:"restarts,omitempty"`
	// Since is the tuner's first look at the node: containers seen within
	// two samples of it were running before it came (ContainerMemory.Resident).
	Since time.Time `json:"since,omitzero"`
	// Arrivals are when the last maxSizes containers were first seen here,
	// oldest first: how often a pod comes, which is what a spare replica
	// is worth.
	Arrivals []time.Time `json:"arrivals,omitempty"`
	// LastOOM is the node's latest GPU OOM that sharing caused: a change
	// is not undone before it has settled unless an OOM came after it.
	LastOOM time.Time `json:"lastOOM,omitzero"`
}

// restarted says whether container k, of workload wl, that ended was a
// service (it ran transientAge or longer) replaced by another pod of its
// workload: one seen in the last two samples (interval apart) before now,
// or one created as it ended (within two samples) that still waits for a
// replica. A restart's size is not a job's. The replacement may wait out
// a full count for longer than the Window after which the ended pod is
// recorded: a leaking service's 19 GiB restart, taken for a job while its
// next pod waited, put a stranger's tail past the 12 GiB that any job
// there asked for (held-out seed 107). A sibling that was already waiting
// before it ended is a queued pod of a workload of long jobs, not its
// replacement, and its size stays a job's.
func restarted(cs map[string]ContainerMemory, k string, c ContainerMemory, wl string, now time.Time, interval time.Duration, pending []PendingPod) bool {
	if c.LastSeen.Sub(c.FirstSeen) < transientAge {
		return false
	}
	for o, oc := range cs {
		if o != k && oc.Workload == wl && !oc.LastSeen.Before(now.Add(-2*interval)) {
			return true
		}
	}
	return slices.ContainsFunc(pending, func(p PendingPod) bool {
		return p.Workload == wl && !p.Since.IsZero() && !p.Since.Before(c.LastSeen.Add(-2*interval))
	})
}

// peakAgain is how far below its peak a container may come back and
// still count as reaching it again (ContainerMemory.PeakAt): a model
// server that loads models on demand comes back to about its peak, not
// to the byte. One that held 2.68 GiB until 11:27 and 2.56 GiB from 13:47
// to 15:15 was, at 18:26, no longer reserved at either (its peak last
// reached more than PeakHold before), and loaded 2.56 GiB again into the
// 1.8 GiB that raises had left (held-out seed 71: 29 OOM events once a
// leaking service's restarts had left the job sizes). At 10% generated
// seed 45 waited 9% longer, with no verdict moved.
const peakAgain = 0.05

// restart says whether Sizes[i] was a service's restart (Restarts).
func (m Memory) restart(i int) bool { return i < len(m.Restarts) && m.Restarts[i] }

// maxSizes bounds Memory.Sizes: enough for a distribution's tail (the
// 90th percentile of 64 is its 58th member), small for a ConfigMap key.
const maxSizes = 64

// ContainerMemory is one running container's record.
type ContainerMemory struct {
	// FirstSeen and LastSeen are the first and the last sample that
	// showed it.
	FirstSeen time.Time `json:"firstSeen"`
	LastSeen  time.Time `json:"lastSeen"`
	// PeakBytes is the most it used, last at PeakAt.
	PeakBytes uint64    `json:"peakBytes,omitempty"`
	PeakAt    time.Time `json:"peakAt,omitzero"`
	// Resident says it was running when the tuner first looked at the
	// node: a service the operator put there, not a job that came.
	Resident bool `json:"resident,omitempty"`
	// Workload is its workload key, as the round that last saw it mapped
	// it (the controller maps only the containers it sees now).
	Workload string `json:"workload,omitempty"`
	// NeedBytes is the most a sharing OOM showed it to ask for (the GPU's
	// total less what the others held), 0 without one.
	NeedBytes uint64 `json:"needBytes,omitempty"`
	// OOMs counts its sharing OOMs in a row (each within a Window of the
	// one before), the latest at LastOOM.
	OOMs    int       `json:"ooms,omitempty"`
	LastOOM time.Time `json:"lastOOM,omitzero"`
}

// size is what the container showed it needs: its peak, or what an OOM
// asked for.
func (c ContainerMemory) size() uint64 { return max(c.PeakBytes, c.NeedBytes) }

// ageBounds are the lower bounds of WorkloadMemory.PeakByAge's buckets
// (0, 1m, 2m, 5m, 10m, 15m, 20m, 30m, 45m, 1h, 90m, 2h, 3h, 4h, 6h, 8h,
// 12h, 16h, 24h, 32h, 48h): fine while a pod loads and reaches its working
// set, coarse over the days a leaking service grows. They are fixed, so a
// record means the same under any Config; the JSON keeps only the peaks.
var ageBounds = []time.Duration{0, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute,
	15 * time.Minute, 20 * time.Minute, 30 * time.Minute, 45 * time.Minute, time.Hour, 90 * time.Minute,
	2 * time.Hour, 3 * time.Hour, 4 * time.Hour, 6 * time.Hour, 8 * time.Hour, 12 * time.Hour, 16 * time.Hour,
	24 * time.Hour, 32 * time.Hour, 48 * time.Hour}

func ageBucket(age time.Duration) int {
	i := len(ageBounds) - 1
	for i > 0 && age < ageBounds[i] {
		i--
	}
	return i
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
	// this workload (0: none remembered), OOMContainer the container that
	// OOMed then, and LastOOM the latest such OOM.
	OOMAllocated int       `json:"oomAllocated,omitempty"`
	OOMContainer string    `json:"oomContainer,omitempty"`
	LastOOM      time.Time `json:"lastOOM,omitzero"`
	// PeakByAge[i] is the most memory one of its containers used, or was
	// shown by a sharing OOM to ask for, at an age in the i-th bucket of
	// ageBounds: a job reaches its peak minutes after it starts, a
	// leaking service a day later, and a service that is restarted every
	// night is small in the morning. An OOM counts as the GPU's total less
	// what the other containers held: the allocation that failed never
	// shows in a sample, so without it the record would keep the size that
	// fitted, not the size the workload needs.
	PeakByAge []uint64 `json:"peakByAge,omitempty"`
	// Lifetime is the longest any of its containers was seen running: how
	// long a pod of it, once admitted, shares the GPU.
	Lifetime time.Duration `json:"lifetime,omitempty"`
	// Pods counts its containers that ended, and MeanPeak and M2 are the
	// running mean and sum of squared deviations (Welford) of their sizes:
	// how much one pod of it differs from the next, the measured
	// variability a price is uncertain by.
	Pods     int     `json:"pods,omitempty"`
	MeanPeak float64 `json:"meanPeak,omitempty"`
	M2       float64 `json:"m2,omitempty"`
	// CapBytes is the largest MPS memory limit one of its pods ran out of
	// memory at (an OOM of kind process-cap with a known limit), last at
	// CapAt: its pods need more than that (rememberCaps, mps.go).
	CapBytes uint64    `json:"capBytes,omitempty"`
	CapAt    time.Time `json:"capAt,omitzero"`
}

// addPod folds one ended container's size into the variability.
func (w *WorkloadMemory) addPod(size uint64) {
	w.Pods++
	d := float64(size) - w.MeanPeak
	w.MeanPeak += d / float64(w.Pods)
	w.M2 += d * (float64(size) - w.MeanPeak)
}

// spread is the standard deviation of its pods' sizes, and whether at
// least two ended to measure it.
func (w WorkloadMemory) spread() (float64, bool) {
	if w.Pods < 2 {
		return 0, false
	}
	return math.Sqrt(max(w.M2, 0) / float64(w.Pods-1)), true
}

// PeakBy is the most memory a container of the workload is expected to
// have used by the given age: the largest PeakByAge of the buckets that end
// before it, and, inside the bucket it falls in, a straight line from that
// towards the bucket's own peak (a leak grows steadily; charging the whole
// bucket at once would price a service 12.5 h old at what it held at 16 h).
// A record from before PeakByAge existed answers PeakBytes.
func (w WorkloadMemory) PeakBy(age time.Duration) uint64 {
	if len(w.PeakByAge) == 0 {
		return w.PeakBytes
	}
	var below uint64
	for i, b := range w.PeakByAge {
		if i >= len(ageBounds) || ageBounds[i] > age {
			break
		}
		if i+1 < len(ageBounds) && ageBounds[i+1] <= age {
			below = max(below, b)
			continue
		}
		if b <= below || i+1 >= len(ageBounds) {
			return max(below, b)
		}
		lo, hi := ageBounds[i], ageBounds[i+1]
		return below + uint64(float64(b-below)*float64(age-lo)/float64(hi-lo))
	}
	return below
}

// seenBy is the most any container of the workload held at an age in the
// same PeakByAge bucket as age or an earlier one: PeakBy without the line
// drawn inside the bucket. A pod holding no more than that is where the
// record has seen pods of its age, whatever the line says.
func (w WorkloadMemory) seenBy(age time.Duration) uint64 {
	upto := min(ageBucket(age)+1, len(w.PeakByAge))
	if upto == 0 {
		return 0
	}
	return slices.Max(w.PeakByAge[:upto])
}

// atAge folds bytes used at age into the record.
func (w *WorkloadMemory) atAge(age time.Duration, bytes uint64) {
	if len(w.PeakByAge) < len(ageBounds) {
		w.PeakByAge = append(w.PeakByAge, make([]uint64, len(ageBounds)-len(w.PeakByAge))...)
	}
	i := ageBucket(age)
	w.PeakByAge[i] = max(w.PeakByAge[i], bytes)
}

// Known says whether the record prices a pod: watched for a whole window,
// or two of its pods watched to their end. A pod that ended has shown all
// it held, however short its life: an hourly burst of thirteen jobs of
// 0.3-0.5 GiB that ran about three minutes each left its workload watched
// for less than a window, so every burst was learnt again, its pods
// reserved at twice what they showed, and the count lowered under the
// next (generated seed 35 waited 120 pod-seconds after its first window
// where static:15 waited none; TestKnownFromEndedPods).
func (w WorkloadMemory) Known(cfg Config) bool {
	return (w.Seen >= cfg.Window || w.Pods >= 2) && w.PeakBytes > 0
}

// Remember folds the samples of obs newer than mem.Updated into a copy of mem
// and forgets workloads not seen for cfg.Remember and containers not seen
// for cfg.Window, keeping at most cfg.MaxWorkloads of each (the most
// recently seen), so that the record stays small enough for one ConfigMap
// however many jobs pass through a cluster.
//
// A container whose key obs.ContainerWorkloads does not map is remembered
// under its own key: it still prices itself while it runs.
func Remember(cfg Config, mem Memory, obs Observation) Memory {
	out := Memory{Updated: mem.Updated, Workloads: maps.Clone(mem.Workloads), Base: mem.Base, Containers: maps.Clone(mem.Containers),
		Sizes: slices.Clone(mem.Sizes), SizesAt: slices.Clone(mem.SizesAt), Restarts: slices.Clone(mem.Restarts), Arrivals: slices.Clone(mem.Arrivals), LastOOM: mem.LastOOM, Since: mem.Since}
	if out.Since.IsZero() {
		out.Since = obs.Now
	}
	if out.Workloads == nil {
		out.Workloads = map[string]WorkloadMemory{}
	}
	if out.Containers == nil {
		out.Containers = map[string]ContainerMemory{}
	}
	newest := mem.Updated
	// Records are copied on first write: maps.Clone shares their slices
	// with mem, which Remember must not change.
	copied := map[string]bool{}
	record := func(wl string) WorkloadMemory {
		w := out.Workloads[wl]
		if !copied[wl] {
			w.PeakByAge, copied[wl] = slices.Clone(w.PeakByAge), true
		}
		return w
	}
	for _, g := range obs.GPUs {
		var prevUsed uint64
		for _, s := range g.Samples {
			used := s.MemoryUsedBytes
			if !s.Time.After(mem.Updated) || s.Time.After(obs.Now) {
				prevUsed = used
				continue
			}
			newest = later(newest, s.Time)
			seen := map[string]bool{}
			for c, p := range s.ContainerPeaks {
				cm, ok := out.Containers[c]
				if !ok {
					// What the first samples show ran before the tuner came.
					cm.FirstSeen, cm.Resident = s.Time, s.Time.Sub(out.Since) <= 2*cfg.SampleInterval
					if !cm.Resident {
						out.Arrivals = append(out.Arrivals, s.Time)
					}
				}
				cm.LastSeen = later(cm.LastSeen, s.Time)
				if p >= cm.PeakBytes {
					cm.PeakBytes, cm.PeakAt = p, later(cm.PeakAt, s.Time)
				} else if float64(p) >= (1-peakAgain)*float64(cm.PeakBytes) {
					cm.PeakAt = later(cm.PeakAt, s.Time)
				}
				wl := obs.workload(c)
				cm.Workload = wl
				out.Containers[c] = cm
				w := record(wl)
				w.PeakBytes = max(w.PeakBytes, p)
				w.atAge(s.Time.Sub(cm.FirstSeen), p)
				w.Lifetime = max(w.Lifetime, s.Time.Sub(cm.FirstSeen))
				if !seen[wl] {
					w.Seen += cfg.SampleInterval
					seen[wl] = true
				}
				w.LastSeen = later(w.LastSeen, s.Time)
				out.Workloads[wl] = w
			}
			alloc := s.ReplicasAllocated
			prevUsed, used = used, prevUsed // used: the sample before, for the OOMs below
			if alloc < 2 || g.Exclusive {
				continue // a lone pod's OOM would happen at any count
			}
			for _, o := range s.OOMs {
				if o.Container == "" || o.Kind == OOMCap || o.Kind == OOMEncoderSession {
					continue
				}
				if o.Kind == OOMUnknown && float64(max(s.MemoryUsedBytes, used)) < cfg.PressureThreshold*float64(s.MemoryTotalBytes) {
					// The source does not say the device was full, and
					// the GPU was not (at the OOM's sample or the one
					// before, the failed process may be gone): not a
					// sharing OOM.
					continue
				}
				wl := obs.workload(o.Container)
				w := record(wl)
				if w.OOMAllocated == 0 || alloc < w.OOMAllocated || s.Time.Sub(w.LastOOM) >= cfg.Remember || w.OOMContainer != o.Container {
					w.OOMAllocated, w.OOMContainer = alloc, o.Container
				}
				var age time.Duration // a container no sample showed OOMed as it started
				if cm, ok := out.Containers[o.Container]; ok {
					age = s.Time.Sub(cm.FirstSeen)
				}
				need := oomNeed(s, o.Container)
				w.atAge(age, need)
				w.LastOOM = later(w.LastOOM, s.Time)
				out.LastOOM = later(out.LastOOM, s.Time)
				cm, ok := out.Containers[o.Container]
				if !ok {
					cm.FirstSeen, cm.LastSeen = s.Time, s.Time
				}
				if s.Time.Sub(cm.LastOOM) <= cfg.Window {
					cm.OOMs++
				} else {
					cm.OOMs = 1
				}
				cm.LastOOM, cm.NeedBytes = s.Time, max(cm.NeedBytes, need)
				out.Containers[o.Container] = cm
				w.LastSeen = later(w.LastSeen, s.Time)
				out.Workloads[wl] = w
			}
		}
	}
	rememberCaps(mem.Updated, &out, obs)
	out.Updated = newest
	var ended []string
	for k, c := range out.Containers {
		if obs.Now.Sub(c.LastSeen) > cfg.Window {
			ended = append(ended, k)
		}
	}
	// In the order they were last seen, so that Sizes keeps the newest.
	slices.SortFunc(ended, func(a, b string) int {
		return cmp.Or(out.Containers[a].LastSeen.Compare(out.Containers[b].LastSeen), cmp.Compare(a, b))
	})
	for _, k := range ended {
		c := out.Containers[k]
		if size := c.size(); size > 0 {
			wl := cmp.Or(c.Workload, obs.workload(k))
			// Aligned with Sizes from the oldest, which a record written
			// before Restarts may not be.
			for len(out.Restarts) < len(out.Sizes) {
				out.Restarts = append(out.Restarts, false)
			}
			out.Restarts = append(out.Restarts[:len(out.Sizes)], restarted(out.Containers, k, c, wl, obs.Now, cfg.SampleInterval, obs.Pending))
			out.Sizes, out.SizesAt = append(out.Sizes, size), append(out.SizesAt, c.LastSeen)
			if w, ok := out.Workloads[wl]; ok {
				w = record(wl)
				w.addPod(size)
				out.Workloads[wl] = w
			}
		}
		delete(out.Containers, k)
	}
	if len(out.Arrivals) > maxSizes {
		out.Arrivals = slices.Clone(out.Arrivals[len(out.Arrivals)-maxSizes:])
	}
	if len(out.Sizes) > maxSizes {
		out.Sizes = slices.Clone(out.Sizes[len(out.Sizes)-maxSizes:])
	}
	if len(out.SizesAt) > len(out.Sizes) {
		out.SizesAt = slices.Clone(out.SizesAt[len(out.SizesAt)-len(out.Sizes):])
	}
	if len(out.Restarts) > len(out.Sizes) {
		out.Restarts = slices.Clone(out.Restarts[len(out.Restarts)-len(out.Sizes):])
	}
	if len(out.Containers) > cfg.MaxWorkloads {
		keys := slices.SortedFunc(maps.Keys(out.Containers), func(a, b string) int {
			return cmp.Or(out.Containers[b].LastSeen.Compare(out.Containers[a].LastSeen), cmp.Compare(a, b))
		})
		for _, k := range keys[cfg.MaxWorkloads:] {
			delete(out.Containers, k)
		}
	}
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

// oomNeed is the least memory container c asked for at an OOM in sample s:
// the total less what the others held. The others' peaks since the previous
// sample bound what they held at the OOM from above, so the estimate errs
// low, towards pricing the workload as it was seen.
// With no other container in the sample it says nothing: the pods it
// shared the GPU with are not seen, and the whole card is no size.
func oomNeed(s Sample, c string) uint64 {
	var others uint64
	for k, p := range s.ContainerPeaks {
		if k != c {
			others += p
		}
	}
	if s.MemoryTotalBytes <= others || others == 0 {
		return 0
	}
	return s.MemoryTotalBytes - others
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
	case ReasonGPUOOM, ReasonMemoryPressure, ReasonMemoryFull, ReasonAboveMaximum, ReasonProcessCapOOM:
		obs.Memory.Base = min(obs.Memory.Base, d.Replicas)
	case ReasonBelowMinimum:
		obs.Memory.Base = max(obs.Memory.Base, d.Replicas)
	}
	return d, obs.Memory
}

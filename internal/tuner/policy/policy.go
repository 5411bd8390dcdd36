// Package policy decides how many pods may share each GPU of a node
// (time-slicing replicas) from what was measured there. Decide is a pure
// function of its inputs: the controller gathers samples and applies the
// answer, and `gpuslice-tuner simulate` replays traces through the very same
// function.
//
// # Rules
//
// Each GPU of a node is judged on its own, over the samples of the last
// Window; the node gets the smallest answer of its GPUs (one device-plugin
// config covers the node, and a replica is a share of one physical GPU, so
// the tightest GPU sets the count).
//
// Footprint. Each container's peak over the window is the largest value it
// had in any sample; the footprint estimate F is the largest of those peaks.
// A new replica can go to any pod, and time-slicing does not isolate memory,
// so a raise is sized for the hungriest pod seen, not for an average one: on
// the seed homelab the mean of RIFE (8 GiB), YOLO and Real-ESRGAN (6 GiB) and
// FFmpeg (0.5 GiB) is 5 GiB, and raises sized for 5 GiB pods that then admit
// 8 GiB ones overcommit the GPU.
//
// Capacity. Pods already running are measured, so only the pods a raise would
// add are priced at F: a sample fits a count R when used + (R − allocated) × F
// <= TargetUtilization × total, and the capacity is the largest R that every
// sample of the window fits, allocated + floor((TargetUtilization × total −
// used) / F) at the tightest sample. (Pricing every pod at F,
// floor(TargetUtilization × total / F), treats the 0.5 GiB FFmpeg like an 8 GiB
// RIFE; on the seed trace it held the node at 5 replicas with 20 GiB of 48 in
// use and more than doubled the time pods waited.)
//
// Lowering, at once:
//   - GPU OOM. An OOM lowers only when sharing caused it: the GPU was full
//     (the OOM says so, Kind OOMDevice, or, when it does not say, the
//     memory in use at the OOM or the sample before it left less free than
//     the largest footprint F) and at least two pods held replicas. An OOM
//     raised by a per-process cap (Kind OOMCap, PyTorch's
//     set_per_process_memory_fraction) is the application's own limit, an
//     NVENC session failure (OOMEncoderSession) is no memory at all, and a
//     lone pod's OOM, or one with 3 of 48 GiB in use, would happen at any
//     count: none of them lowers or holds a raise back. A sharing OOM with A
//     pods holding replicas proves that A did not fit; the target is the
//     count the measured footprints fit, the largest k whose k hungriest
//     container peaks sum to at most TargetUtilization × total, but never
//     above A − 1 (the OOM's own evidence) nor above the current count (the
//     current count stands for A when the allocation is unknown). The
//     smallest target over the window's OOMs wins. Because the target is
//     tied to the allocation at the OOM and not to the current count, a pod
//     crash-looping on the same mix is one incident: it lowers once and does
//     not ratchet the count down; a new OOM at a smaller mix lowers further.
//   - Memory pressure. Used/total at or above PressureThreshold in every
//     sample of the last PressureWindow says the pods holding replicas now
//     fill the GPU too far: the target is one less than the latest allocated
//     count (the current count when unknown), never above the current count.
//     Like the OOM rule it does not ratchet while the same pods keep the
//     pressure up, since lowering below them stops nothing that runs. Its
//     guard against flapping: no lowering for pressure within PressureWindow
//     of the last change (an OOM is never held back).
//   - Above MaxReplicas: lowered to MaxReplicas.
//
// Withdrawing, at once (UnbackedReplicas): replicas the tuner raised and
// the memory left cannot back are given back, never below Memory.Base, the
// count the tuner found, lowered only by the evidence above (an OOM,
// pressure, MaxReplicas): the operator's count and the one an OOM proved
// are not the tuner's to give back on a guess about pods not seen yet. The
// memory left is TargetUtilization × total less the used memory and less
// what running pods may still grow to their workloads' remembered peaks.
//   - Pods waiting. A waiting pod takes a free replica the moment one is
//     free, before any sample sees it, so while pods wait the free replicas
//     they would take are kept only as far as the memory left backs them at
//     the waiting pods' prices, in queue order; and when the measured memory
//     (not the projection) already passes the target, the next replica a pod
//     leaves is not handed on (allocated − 1). On the seed trace a 20 GiB
//     fine-tune took, at 12:50, the replica a 6 GiB job had just left, beside
//     services at their daytime peaks, and crashed; with this rule it waits.
//   - Nobody waiting. Free replicas that the memory left has not backed, each
//     priced as a pod of unknown size, in every sample of the last Window,
//     and no change within Window: the same span of evidence a raise needs,
//     so that an idle replica is not given back and raised for again every
//     quarter hour (on the week of family-48g-week: 80 changes instead of 91
//     and 19,738 pod-seconds pending instead of 26,384 with PressureWindow).
//
// Raising, by at most MaxStepUp and never past MaxReplicas or the capacity,
// only when all of these hold: no sharing OOM in the window; the samples
// cover the whole window; the latest sample advertises the current count
// (the last change has taken effect); a pod needs a replica: a pending pod
// (Observation.Pending) asks for more replicas than are free, or, with nobody
// pending, every replica is allocated; and Cooldown has passed since the last
// change when a pod the raise admits is priced by a guess. Without demand a
// raise into free replicas helps nobody now and bets on later memory with
// today's numbers: on the seed trace, raising into free replicas carried a
// quiet night's 8 replicas into the day and cost 18 OOM events instead of 3.
// Below the minimum the count is raised to it at once.
//
// Prices. A raise is sized for the pods it admits, in queue order: a pod of
// a workload whose record (Memory, kept by Remember across windows and
// restarts) was watched for a whole Window is priced at the workload's
// remembered peak; any other pod, and the next pod when every replica is
// taken and nobody waits, at the node's largest container peak in the
// window (a new replica may go to any pod, and the pod a GPU has not seen
// yet is the one that overflows it). Not at every remembered workload's
// peak: a record prices its own workload's pods, and one fine-tune a
// fortnight ago would otherwise hold every small job at its size (on the
// seed trace: 403,170 pod-seconds pending and ten pods never started,
// against 199,695 and two). A raise may add as many replicas as the waiting
// pods need and the capacity holds (MaxStepUp, 16 by default, only bounds
// it), and never gives a workload the count at which it OOMed on a full GPU
// within Remember (RememberedOOM), so that a job returning daily does not
// cycle through raise, OOM and lower.
//
// The footprint F that prices free replicas is the node's, the largest
// container peak on any of its GPUs.
//
// GPUs the config leaves out of time-slicing (GPUObservation.Exclusive) are
// not judged: their count does not follow the node's, so they never wait
// for it to be advertised, and an OOM there says nothing about sharing.
// Their containers still count towards the node's footprint.
//
// The least count is the larger of MinReplicas and Observation.Floor: a
// config whose shared resource is renamed (nvidia.com/gpu.shared) would
// advertise plain nvidia.com/gpu at 1 replica, and pods asking for the
// shared name could never run again.
//
// Replicas 1 means exclusive: the applier writes a config without `sharing`,
// because NVIDIA rejects replicas below 2. Pods already holding replica IDs
// above a lowered count keep running; a lowering only stops new admissions.
//
// Samples with MemoryTotalBytes 0 (total unknown) prove neither headroom nor
// pressure.
package policy

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// Reasons, UpperCamelCase like Kubernetes Event reasons, for Decision.Reason.
const (
	ReasonSustainedHeadroom    = "SustainedHeadroom"    // up
	ReasonBelowMinimum         = "BelowMinimum"         // up
	ReasonGPUOOM               = "GPUOOM"               // down
	ReasonMemoryPressure       = "MemoryPressure"       // down
	ReasonAboveMaximum         = "AboveMaximum"         // down
	ReasonRecentOOM            = "RecentOOM"            // hold: a sharing OOM in the window forbids raising
	ReasonMemoryPressureGuard  = "MemoryPressureGuard"  // hold: pressure, but a change was made less than PressureWindow ago
	ReasonOngoingPressure      = "OngoingPressure"      // hold: pressure, the count is already below the pods causing it
	ReasonAtMaximum            = "AtMaximum"            // hold
	ReasonCooldown             = "Cooldown"             // hold
	ReasonInsufficientHistory  = "InsufficientHistory"  // hold: samples do not cover the window
	ReasonAwaitingApply        = "AwaitingApply"        // hold: advertised count differs from the current one
	ReasonFreeReplicas         = "FreeReplicas"         // hold: not every replica is allocated, nobody needs more
	ReasonNoWorkload           = "NoWorkload"           // hold: no container memory seen, no footprint
	ReasonInsufficientHeadroom = "InsufficientHeadroom" // hold: capacity allows no more
	ReasonNoGPUs               = "NoGPUs"               // hold: nothing observed on the node
	ReasonRememberedOOM        = "RememberedOOM"        // hold: a workload here OOMed at the count a raise would give
	ReasonUnbackedReplicas     = "UnbackedReplicas"     // down: free replicas the memory left could not back
)

// Directions for Decision.Direction.
const (
	DirectionUp   = "up"
	DirectionDown = "down"
	DirectionNone = ""
)

// Sample is one look at one GPU.
type Sample struct {
	Time time.Time
	// GPU is the GPU's index on its node (the exporter's gpu label), ""
	// when unknown: a config's device selection may name GPUs by index.
	GPU              string
	MemoryTotalBytes uint64
	MemoryUsedBytes  uint64
	// ContainerPeaks maps a container key (namespace/pod/container) to its
	// peak memory on this GPU during the sample.
	ContainerPeaks map[string]uint64
	// OOMEvents counts GPU OOM events since the previous sample.
	OOMEvents int
	// OOMs details up to OOMEvents of them, when the source knows more than
	// a count; events beyond len(OOMs) are of unknown kind and container.
	OOMs               []OOM
	ReplicasAdvertised int
	ReplicasAllocated  int
}

// OOMKind says what ran out at a GPU OOM. The values are internal/oom's
// Kind values, which the exporter's OOM counter carries in its `kind` label.
type OOMKind string

// OOM kinds.
const (
	// OOMUnknown: the source does not say; Decide judges from the memory
	// figures.
	OOMUnknown OOMKind = ""
	// OOMDevice: the GPU's memory was full.
	OOMDevice OOMKind = "device"
	// OOMCap: a per-process cap was reached (PyTorch's
	// set_per_process_memory_fraction, TensorFlow's memory limit): the
	// application's own limit, not the GPU's.
	OOMCap OOMKind = "process-cap"
	// OOMEncoderSession: NVENC could not open an encoding session. Logged
	// like an OOM, it is a session limit, not memory: it neither lowers nor
	// holds a raise.
	OOMEncoderSession OOMKind = "encoder-session"
)

// OOM is one GPU out-of-memory event.
type OOM struct {
	// Container is the container key (namespace/pod/container); "" when
	// unknown.
	Container string
	Kind      OOMKind
}

// GPUObservation is one GPU's recent history.
type GPUObservation struct {
	UUID string
	// Exclusive is set when the node's config leaves this GPU out of
	// time-slicing (devices selects other GPUs): its count does not follow
	// the node's.
	Exclusive bool
	// Samples is the window, oldest first. Samples outside
	// [Now−Window, Now] are ignored.
	Samples []Sample
}

// Observation is everything Decide knows about one node.
type Observation struct {
	Node            string
	Now             time.Time
	CurrentReplicas int
	// LastChange is when the count last changed; zero means never.
	LastChange time.Time
	// Floor is the least count the node's config can take without changing
	// the resource pods ask for (2 when it renames the shared resource); 0
	// means no floor beyond MinReplicas.
	Floor int
	// Pending lists the pods waiting for a replica of this node's resource,
	// oldest first: the demand a raise would serve.
	Pending []PendingPod
	// ContainerWorkloads maps the container keys of the samples to their
	// workload keys (WorkloadKey); a key it lacks is its own workload.
	ContainerWorkloads map[string]string
	// Memory is the workload record, Remember's answer for this round.
	Memory Memory
	GPUs   []GPUObservation
}

// PendingPod is one pod waiting for a replica.
type PendingPod struct {
	// Workload is the pod's workload key (WorkloadKey).
	Workload string
	// Replicas is how many replicas it asks for (its resource request).
	Replicas int
}

// Decision is the answer for one node.
type Decision struct {
	Replicas  int
	Direction string
	// Reason is a short UpperCamelCase word (the Reason... constants).
	Reason string
	// Message is a sentence with the numbers behind the reason.
	Message string
	// FootprintBytes is the footprint estimate of the GPU that set the answer
	// (0 when nothing was measured).
	FootprintBytes uint64
	// GPU is the UUID of the GPU that set the answer.
	GPU string
}

// Decide returns the replica count a node should have. It is pure and
// deterministic: the same inputs give the same Decision whatever the order of
// obs.GPUs. cfg is assumed valid (Config.Validate).
func Decide(cfg Config, obs Observation) Decision {
	if len(obs.GPUs) == 0 {
		return Decision{
			Replicas: obs.CurrentReplicas,
			Reason:   ReasonNoGPUs,
			Message:  fmt.Sprintf("node %s: no GPU observed, keeping %d replicas", obs.Node, obs.CurrentReplicas),
		}
	}
	cfg.MinReplicas = max(cfg.MinReplicas, obs.Floor)
	cfg.MaxReplicas = max(cfg.MaxReplicas, cfg.MinReplicas)
	var nodeFootprint uint64
	for _, g := range obs.GPUs {
		nodeFootprint = max(nodeFootprint, footprint(within(g.Samples, obs.Now.Add(-cfg.Window), obs.Now)))
	}
	var best Decision
	judged := 0
	for _, g := range obs.GPUs {
		if g.Exclusive {
			continue
		}
		d := decideGPU(cfg, obs, g, nodeFootprint)
		if judged == 0 || d.Replicas < best.Replicas || (d.Replicas == best.Replicas && d.GPU < best.GPU) {
			best = d
		}
		judged++
	}
	if judged == 0 {
		return Decision{
			Replicas: obs.CurrentReplicas,
			Reason:   ReasonNoGPUs,
			Message:  fmt.Sprintf("node %s: every GPU is left out of time-slicing, keeping %d replicas", obs.Node, obs.CurrentReplicas),
		}
	}
	best.Direction = direction(obs.CurrentReplicas, best.Replicas)
	return best
}

func direction(from, to int) string {
	switch {
	case to > from:
		return DirectionUp
	case to < from:
		return DirectionDown
	}
	return DirectionNone
}

// gpuView is the part of a GPU's history that Decide looks at.
type gpuView struct {
	cfg    Config
	now    time.Time
	cur    int
	obs    *Observation
	window []Sample // within [now−Window, now]
	// footprint is the node's largest container peak in the window.
	footprint uint64
}

func decideGPU(cfg Config, obs Observation, g GPUObservation, nodeFootprint uint64) Decision {
	v := gpuView{cfg: cfg, now: obs.Now, cur: obs.CurrentReplicas, obs: &obs}
	v.window = within(g.Samples, obs.Now.Add(-cfg.Window), obs.Now)
	v.footprint = nodeFootprint
	d := v.decide(obs.LastChange)
	d.FootprintBytes = v.footprint
	d.GPU = g.UUID
	d.Message = g.UUID + ": " + d.Message
	return d
}

func (v gpuView) decide(lastChange time.Time) Decision {
	cfg, cur := v.cfg, v.cur
	sinceChange := time.Duration(math.MaxInt64)
	if !lastChange.IsZero() {
		sinceChange = v.now.Sub(lastChange)
	}

	// Lowerings: the smallest target wins; on equal targets the order below
	// (OOM, pressure, bound) names the reason.
	low := Decision{Replicas: cur}
	lower := func(to int, reason, msg string) {
		if to < low.Replicas {
			low = Decision{Replicas: to, Reason: reason, Message: msg}
		}
	}
	oi := v.ooms()
	if oi.incidents > 0 {
		lower(oi.target, ReasonGPUOOM, fmt.Sprintf(
			"%d GPU OOM incident(s) on a full GPU in the last %s; %d pods did not fit together%s, lowering %d -> %d",
			oi.incidents, cfg.Window, oi.alloc, oi.fits, cur, oi.target))
	}
	pressed, pressTarget, pressMsg := v.pressure()
	if pressed && sinceChange >= cfg.PressureWindow {
		lower(pressTarget, ReasonMemoryPressure, pressMsg+fmt.Sprintf(", lowering %d -> %d", cur, pressTarget))
	}
	if to, msg := v.queueBacked(); to < cur {
		lower(to, ReasonUnbackedReplicas, msg+fmt.Sprintf(", lowering %d -> %d", cur, to))
	}
	if to, msg := v.unbacked(); to < cur && sinceChange >= cfg.Window {
		lower(to, ReasonUnbackedReplicas, msg+fmt.Sprintf(", lowering %d -> %d", cur, to))
	}
	if cur > cfg.MaxReplicas {
		lower(cfg.MaxReplicas, ReasonAboveMaximum, fmt.Sprintf("%d replicas is above maxReplicas %d", cur, cfg.MaxReplicas))
	}
	if low.Replicas < cur {
		return low
	}
	if cur < cfg.MinReplicas {
		return Decision{Replicas: cfg.MinReplicas, Reason: ReasonBelowMinimum,
			Message: fmt.Sprintf("%d replicas is below minReplicas %d", cur, cfg.MinReplicas)}
	}

	hold := func(reason, format string, args ...any) Decision {
		return Decision{Replicas: cur, Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case oi.incidents > 0:
		return hold(ReasonRecentOOM, "%d GPU OOM incident(s) on a full GPU in the last %s, keeping %d replicas", oi.incidents, cfg.Window, cur)
	case pressed && pressTarget >= cur:
		return hold(ReasonOngoingPressure, "%s; %d replicas is already below them, keeping it", pressMsg, cur)
	case pressed:
		return hold(ReasonMemoryPressureGuard, "%s, but the last change was %s ago (< pressureWindow %s), keeping %d replicas",
			pressMsg, sinceChange, cfg.PressureWindow, cur)
	case cur >= cfg.MaxReplicas:
		return hold(ReasonAtMaximum, "%d replicas is maxReplicas", cur)
	case sinceChange < cfg.SampleInterval:
		return hold(ReasonCooldown, "last change %s ago, less than a sample, keeping %d replicas", sinceChange, cur)
	case !covers(v.window, v.now.Add(-cfg.Window), v.now, cfg.SampleInterval):
		return hold(ReasonInsufficientHistory, "samples cover less than the %s window (%d samples, one every %s expected), keeping %d replicas",
			cfg.Window, len(v.window), cfg.SampleInterval, cur)
	}
	latest := v.window[len(v.window)-1]
	if latest.ReplicasAdvertised != 0 && latest.ReplicasAdvertised != cur {
		return hold(ReasonAwaitingApply, "%d replicas advertised, %d decided: the last change has not taken effect", latest.ReplicasAdvertised, cur)
	}
	free := max(cur-latest.ReplicasAllocated, 0)
	need, guess := v.demand(free)
	if len(need) == 0 {
		return hold(ReasonFreeReplicas, "%d of %d replicas are free, no pod needs another, keeping %d replicas", free, cur, cur)
	}
	if guess && sinceChange < cfg.Cooldown {
		return hold(ReasonCooldown, "last change %s ago, cooldown %s for a raise that admits a pod of unknown size, keeping %d replicas",
			sinceChange, cfg.Cooldown, cur)
	}
	if slices.Contains(need, 0) {
		return hold(ReasonNoWorkload, "no container memory seen in the last %s nor remembered for the pending pods, nothing to size a raise, keeping %d replicas", cfg.Window, cur)
	}
	fit, worst := v.fit(need)
	if fit <= cur {
		return hold(ReasonInsufficientHeadroom, "at %s %s of %s used with %d allocated: the next pod, %s, would pass %.0f%%, keeping %d replicas",
			worst.Time.Format(time.RFC3339), gib(worst.MemoryUsedBytes), gib(worst.MemoryTotalBytes), worst.ReplicasAllocated,
			gib(need[0]), 100*cfg.TargetUtilization, cur)
	}
	to := min(cur+cfg.MaxStepUp, cfg.MaxReplicas, fit)
	if banned, wl, at := v.banned(len(need)); banned <= cur {
		return hold(ReasonRememberedOOM, "workload %s OOMed on a full GPU with %d pods at %s, keeping %d replicas",
			wl, banned+1, at.Format(time.RFC3339), cur)
	} else {
		to = min(to, banned)
	}
	return Decision{Replicas: to, Reason: ReasonSustainedHeadroom, Message: fmt.Sprintf(
		"%d pod(s) need a replica; for %s every sample would have fit %d replicas, the new pods priced %s (tightest: %s of %s used with %d allocated, under %.0f%%), raising %d -> %d",
		len(need), cfg.Window, fit, gibs(need[:min(len(need), to-cur)]),
		gib(worst.MemoryUsedBytes), gib(worst.MemoryTotalBytes), worst.ReplicasAllocated, 100*cfg.TargetUtilization, cur, to)}
}

// demand prices the replicas a raise would hand out, in the order they would
// be taken: one per replica of each pending pod that the free replicas do
// not serve, each at its price (price). With every replica
// taken and nobody pending it is one replica at that largest footprint: the
// next pod, whoever it is. A price of 0 means nothing is known to price it.
// guess says whether a price is not the pod's own remembered peak.
func (v gpuView) demand(free int) (need []uint64, guess bool) {
	unknown := v.unknownPrice()
	full := free == 0
	for _, p := range v.obs.Pending {
		r := max(p.Replicas, 1)
		if r <= free {
			free -= r
			continue
		}
		price, known := v.price(p, unknown)
		guess = guess || !known
		for range r - free {
			need = append(need, price)
		}
		free = 0
	}
	if len(need) == 0 && full {
		need, guess = append(need, unknown), true
	}
	return need, guess
}

// price is what a pending pod is expected to use: its workload's
// remembered peak when the record is Known, else unknown, the node's
// largest footprint in the window (a pod never seen may be as large as
// anything running here now). Known says which.
func (v gpuView) price(p PendingPod, unknown uint64) (price uint64, known bool) {
	if w := v.obs.Memory.Workloads[p.Workload]; w.Known(v.cfg) {
		return w.PeakBytes, true
	}
	return unknown, false
}

// unknownPrice is what a pod of no known workload is priced at: the node's
// largest container peak in the window. Not every remembered workload's
// peak: a record prices its own workload's pods, and pricing every stranger
// at the largest peak of the last Remember would let one fine-tune a
// fortnight ago hold every small job at its size (on the seed trace, ten
// pods never started).
func (v gpuView) unknownPrice() uint64 { return v.footprint }

// queueBacked is the count that the memory left backs while pods wait: the
// pods allocated at the latest sample plus as many of the pending pods, in
// queue order and at their prices, as fit under TargetUtilization beside
// the running pods at their remembered peaks; one less than allocated when
// the running pods already pass it. A pod waiting takes a replica the moment
// one is free, from a raise or from a pod that ends, before a sample can see
// it; a count left above what the memory backs hands the next replica to a
// pod that does not fit (the seed day's 20 GiB fine-tune that took, at
// 12:50, the replica a 6 GiB job had just left). Lowering stops no running
// pod, and the raise rule gives the replica back when the memory backs it.
func (v gpuView) queueBacked() (int, string) {
	if len(v.obs.Pending) == 0 || len(v.window) == 0 {
		return v.cur, ""
	}
	s := v.window[len(v.window)-1]
	unknown := v.unknownPrice()
	if unknown == 0 || s.MemoryTotalBytes == 0 || s.ReplicasAllocated == 0 { // 0 allocated may be unknown
		return v.cur, ""
	}
	budget := v.cfg.TargetUtilization*float64(s.MemoryTotalBytes) - float64(s.MemoryUsedBytes) - float64(v.growth(s))
	free := max(v.cur-s.ReplicasAllocated, 0)
	taken, backed := 0, 0 // of the free replicas, those the queue takes and those the memory backs
	var next uint64
	for i, p := range v.obs.Pending {
		price, _ := v.price(p, unknown)
		r := max(p.Replicas, 1)
		if i == 0 {
			next = price
		}
		if taken+r > free {
			break // beyond the free replicas: the raise rule prices those
		}
		taken += r
		if backed == taken-r && price > 0 && budget >= float64(price)*float64(r) {
			budget -= float64(price) * float64(r)
			backed += r
		}
	}
	to := v.cur - (taken - backed)
	if free == 0 && float64(s.MemoryUsedBytes) > v.cfg.TargetUtilization*float64(s.MemoryTotalBytes) {
		// Measured, not projected: the pods running now are past the
		// target, and the next replica a pod leaves is not handed on.
		to = s.ReplicasAllocated - 1
	}
	to = max(to, v.cfg.MinReplicas, v.obs.Memory.Base, 1)
	return to, fmt.Sprintf("%d pod(s) wait and %s of %s is used with %d allocated: the memory left backs %d of the %d replica(s) they would take next (the first priced %s)",
		len(v.obs.Pending), gib(s.MemoryUsedBytes), gib(s.MemoryTotalBytes), s.ReplicasAllocated, backed, max(taken, 1), gib(next))
}

// unbacked is the count that the free replicas shrink to when, in every
// sample of the last Window, the memory left under
// TargetUtilization (running pods at their remembered peaks) could not back
// them, each priced as a pod of unknown size. A free replica is a promise of
// room to whichever pod comes next: one raised for a 3 GiB job at night and
// left free until a 20 GiB fine-tune arrives in the afternoon, beside
// services that grew meanwhile, breaks it. Lowering stops no running pod,
// and a pod of a known workload gets its replica back at the next sample.
func (v gpuView) unbacked() (int, string) {
	from := v.now.Add(-v.cfg.Window)
	ss := within(v.window, from, v.now)
	u := v.unknownPrice()
	if u == 0 || !covers(ss, from, v.now, v.cfg.SampleInterval) {
		return v.cur, ""
	}
	to := 0
	var last Sample
	for _, s := range ss {
		free := v.cur - s.ReplicasAllocated
		budget := v.cfg.TargetUtilization*float64(s.MemoryTotalBytes) - float64(s.MemoryUsedBytes) - float64(v.growth(s))
		if free <= 0 || s.MemoryTotalBytes == 0 || s.ReplicasAllocated == 0 { // 0 allocated may be unknown
			return v.cur, ""
		}
		backed := 0
		if budget > 0 {
			backed = int(math.Floor(budget / float64(u)))
		}
		if backed >= free {
			return v.cur, ""
		}
		to, last = max(to, s.ReplicasAllocated+backed), s
	}
	to = max(to, v.cfg.MinReplicas, v.obs.Memory.Base, 1)
	return to, fmt.Sprintf("for %s %d of %d replicas were free and the memory left (%s of %s used with %d allocated) backs %d more pod(s) of %s",
		v.cfg.PressureWindow, v.cur-last.ReplicasAllocated, v.cur, gib(last.MemoryUsedBytes), gib(last.MemoryTotalBytes),
		last.ReplicasAllocated, to-last.ReplicasAllocated, gib(u))
}

// banned is the count below which the workloads a raise involves (those
// running now and the first n pending) have not OOMed on a full GPU within
// Remember: a workload that OOMed with A pods holding replicas is not given A
// again soon, so that a workload returning daily does not cycle through
// raise, OOM and lower. It returns math.MaxInt when nothing is remembered.
func (v gpuView) banned(n int) (int, string, time.Time) {
	limit, who, when := math.MaxInt, "", time.Time{}
	check := func(wl string) {
		w, ok := v.obs.Memory.Workloads[wl]
		if !ok || w.OOMAllocated == 0 || v.now.Sub(w.LastOOM) >= v.cfg.Remember {
			return
		}
		if w.OOMAllocated-1 < limit || (w.OOMAllocated-1 == limit && wl < who) {
			limit, who, when = w.OOMAllocated-1, wl, w.LastOOM
		}
	}
	for c := range v.window[len(v.window)-1].ContainerPeaks {
		check(v.obs.workload(c))
	}
	for i, p := range v.obs.Pending {
		if i >= n {
			break
		}
		check(p.Workload)
	}
	return limit, who, when
}

// oomIncidents is what the window's OOM events call for.
type oomIncidents struct {
	// incidents counts the OOMs that sharing caused, a container's repeats
	// (a crash loop) once.
	incidents int
	// target is the count they call for, alloc the allocation at the OOM
	// that set it and fits why.
	target, alloc int
	fits          string
}

// ooms classifies the window's OOM events (see the package doc).
func (v gpuView) ooms() oomIncidents {
	out := oomIncidents{target: v.cur}
	seen := map[string]bool{}
	for i, s := range v.window {
		if s.OOMEvents <= 0 && len(s.OOMs) == 0 {
			continue
		}
		a := s.ReplicasAllocated
		if a <= 0 {
			a = v.cur
		}
		if a < 2 {
			continue // a lone pod: it would run out at any count
		}
		full := v.fullAt(i)
		sharing := 0
		for k := range max(s.OOMEvents, len(s.OOMs)) {
			var o OOM
			if k < len(s.OOMs) {
				o = s.OOMs[k]
			}
			if o.Kind == OOMCap || o.Kind == OOMEncoderSession || (o.Kind == OOMUnknown && !full) {
				continue
			}
			sharing++
			if o.Container == "" || !seen[o.Container] {
				out.incidents++
			}
			if o.Container != "" {
				seen[o.Container] = true
			}
		}
		if sharing == 0 {
			continue
		}
		k, fits := v.fitting(s.MemoryTotalBytes)
		if t := min(a-1, k); t < out.target {
			out.target, out.alloc, out.fits = t, a, fits
		}
	}
	out.target = max(out.target, v.cfg.MinReplicas)
	return out
}

// fullAt says whether the GPU was full at the OOM of window[i]: the memory in
// use then, or at the sample before (the failed process may already be
// gone), left less free than the footprint (or than the pressure margin,
// when no footprint is known).
func (v gpuView) fullAt(i int) bool {
	s := v.window[i]
	if s.MemoryTotalBytes == 0 {
		return true // nothing proves room: trust the OOM
	}
	used := s.MemoryUsedBytes
	if i > 0 && v.window[i-1].MemoryTotalBytes == s.MemoryTotalBytes {
		used = max(used, v.window[i-1].MemoryUsedBytes)
	}
	margin := max(v.footprint, uint64((1-v.cfg.PressureThreshold)*float64(s.MemoryTotalBytes)))
	return used+margin > s.MemoryTotalBytes
}

// fitting is the count the measured footprints fit on a GPU of total bytes:
// the largest k whose k hungriest container peaks of the window sum to at
// most TargetUtilization × total (math.MaxInt when no peak is known, so that
// the OOM's own evidence decides).
func (v gpuView) fitting(total uint64) (int, string) {
	peaks := map[string]uint64{}
	for _, s := range v.window {
		for c, p := range s.ContainerPeaks {
			peaks[c] = max(peaks[c], p)
		}
	}
	if len(peaks) == 0 || total == 0 {
		return math.MaxInt, ""
	}
	sorted := slices.SortedFunc(maps.Values(peaks), func(a, b uint64) int { return cmp.Compare(b, a) })
	budget := v.cfg.TargetUtilization * float64(total)
	var sum float64
	k := 0
	for _, p := range sorted {
		if sum+float64(p) > budget {
			break
		}
		sum += float64(p)
		k++
	}
	if k == len(sorted) {
		return math.MaxInt, ""
	}
	return max(k, 1), fmt.Sprintf(" and only the %d hungriest measured pods fit %.0f%% of %s", max(k, 1), 100*v.cfg.TargetUtilization, gib(total))
}

// pressure says whether every sample of the last PressureWindow was at or
// above the threshold, and the count that calls for.
func (v gpuView) pressure() (bool, int, string) {
	from := v.now.Add(-v.cfg.PressureWindow)
	ss := within(v.window, from, v.now)
	if !covers(ss, from, v.now, v.cfg.SampleInterval) {
		return false, 0, ""
	}
	lowest := math.Inf(1)
	for _, s := range ss {
		if s.MemoryTotalBytes == 0 {
			return false, 0, ""
		}
		r := float64(s.MemoryUsedBytes) / float64(s.MemoryTotalBytes)
		if r < v.cfg.PressureThreshold {
			return false, 0, ""
		}
		lowest = min(lowest, r)
	}
	alloc := ss[len(ss)-1].ReplicasAllocated
	target := v.cur
	if alloc > 0 {
		target = min(target, alloc-1)
	} else {
		target = v.cur - 1
	}
	target = max(target, v.cfg.MinReplicas)
	return true, target, fmt.Sprintf("memory at or above %.0f%% for %s (lowest %.1f%%) with %d allocated",
		100*v.cfg.PressureThreshold, v.cfg.PressureWindow, 100*lowest, alloc)
}

// fit returns the largest count that every sample of the window would still
// have fit, and the sample that limited it. A sample's running pods are
// measured, each raised to its workload's remembered peak (a service that
// peaks every afternoon will again); replicas free at that sample are priced
// at the footprint; the replicas a raise adds take the prices of need in
// order.
func (v gpuView) fit(need []uint64) (int, Sample) {
	fit, worst := math.MaxInt, v.window[0]
	for _, s := range v.window {
		n := 0 // a sample without a total, or already over the target, fits nothing more
		budget := v.cfg.TargetUtilization*float64(s.MemoryTotalBytes) - float64(s.MemoryUsedBytes) - float64(v.growth(s)) -
			float64(max(v.cur-s.ReplicasAllocated, 0))*float64(v.footprint)
		if s.MemoryTotalBytes > 0 && budget >= 0 {
			n = max(v.cur, s.ReplicasAllocated) // pods beyond a lowered count still run: room for them is measured
			for _, p := range need {
				if budget -= float64(p); budget < 0 {
					break
				}
				n++
			}
		}
		if n < fit {
			fit, worst = n, s
		}
	}
	return fit, worst
}

// growth is how much more than in sample s its containers used at their
// workloads' remembered peaks.
func (v gpuView) growth(s Sample) uint64 {
	var g uint64
	for c, p := range s.ContainerPeaks {
		if w := v.obs.Memory.Workloads[v.obs.workload(c)]; w.PeakBytes > p {
			g += w.PeakBytes - p
		}
	}
	return g
}

// within returns the samples with from <= Time <= to, keeping their order.
func within(ss []Sample, from, to time.Time) []Sample {
	lo, _ := slices.BinarySearchFunc(ss, from, func(s Sample, t time.Time) int { return s.Time.Compare(t) })
	out := ss[lo:]
	hi := len(out)
	for hi > 0 && out[hi-1].Time.After(to) {
		hi--
	}
	return out[:hi]
}

// covers says whether ss watched all of [from, to] at the given interval.
func covers(ss []Sample, from, to time.Time, interval time.Duration) bool {
	if len(ss) == 0 || ss[0].Time.Sub(from) > interval || to.Sub(ss[len(ss)-1].Time) > 2*interval {
		return false
	}
	for i := 1; i < len(ss); i++ {
		if ss[i].Time.Sub(ss[i-1].Time) > 2*interval {
			return false
		}
	}
	return true
}

// footprint is the largest per-container peak in the samples.
func footprint(ss []Sample) uint64 {
	var f uint64
	for _, s := range ss {
		for _, p := range s.ContainerPeaks {
			f = max(f, p)
		}
	}
	return f
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// gibs writes prices as "6.0 GiB, 6.0 GiB and 8.0 GiB".
func gibs(bs []uint64) string {
	var out string
	for i, b := range bs {
		switch {
		case i == 0:
		case i == len(bs)-1:
			out += " and "
		default:
			out += ", "
		}
		out += gib(b)
	}
	return out
}

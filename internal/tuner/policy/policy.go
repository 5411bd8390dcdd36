// Package policy decides how many pods may share each GPU of a node
// (time-slicing replicas) from what was measured there. Round folds the new
// samples into the node's workload memory (Remember) and judges with it
// (Decide); both are pure. The controller gathers the samples and pending
// pods, keeps the memory and applies the answer, and `gpuslice-tuner
// simulate` replays traces through the very same Round. docs/tuner-policy.md
// gives the rules with the measurements behind them.
//
// # The objective
//
// The count is the only lever on admission: a waiting pod takes the first
// replica free, and a lowering stops no running pod. Each round every count
// the node may take is weighed: a forecast of the running pods (what each
// holds and may still need), the waiting pods in queue order (priced from
// their workload's record, or, for a workload never seen, from the sizes
// this node has seen) and the pods not here yet (for spare replicas and for
// the replicas departing jobs hand on) gives the expected number of OOMs,
// each pod a mean and a measured uncertainty; the count with the lowest
// cost wins, where an OOM costs Config.OOMCost, a pod let in saves a Window
// of waiting, a spare saves the next pods a round and the apply latency,
// and a change costs Config.ChangeCost plus its apply mode's latency and
// blackout (ApplyCost, measured on the real node).
//
// # Evidence and holds
//
// A GPU OOM that sharing caused, measured fullness, a crash loop being
// evicted and maxReplicas lower at once, below the count the tuner found
// (Memory.Base) if need be; the objective never lowers below it. An OOM
// among pods that all still run and stay lowers nothing and bans nothing:
// no count parts them. No raise with a sharing OOM in the window, under
// sustained pressure, before the window is covered, at maxReplicas, or for
// the container that OOMed with that many pods within PeakHold. Nothing is
// judged while the last change is still on its way. A change is not undone
// before it has settled (its latency plus Config.Settle) unless an OOM
// came since.
//
// Each GPU is judged on its own; the node gets the smallest answer of its
// GPUs. GPUs the config leaves out of time-slicing are not judged. Below the
// minimum (MinReplicas, or Observation.Floor for a renamed resource) the
// count is raised to it at once. Replicas 1 means exclusive: the applier
// writes a config without `sharing`.
//
// Containers that OOM twice in a row on a full shared GPU are reported in
// Decision.CrashLoops; with Config.EvictCrashLoops the controller evicts
// them (the second lever: the count cannot end a loop).
//
// Samples with MemoryTotalBytes 0 (total unknown) prove neither headroom nor
// pressure.
package policy

import (
	"fmt"
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
	ReasonMemoryFull           = "MemoryFull"           // down: the pods holding replicas fill the GPU to the pressure threshold even without the smallest
	ReasonLearning             = "Learning"             // hold: the next pod's workload is still being learnt from its first pod
	ReasonSettling             = "Settling"             // hold: the last change has not settled, and no OOM since says it was wrong
	ReasonCrashLoop            = "CrashLoop"            // down: a container OOMs again and again on a full GPU
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
	// ContainerLimits maps a container key to the memory limit it started
	// with, on a GPU shared through MPS (its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:
	// the GPU's memory / the replicas at its start); nil or a missing key
	// when unknown or not MPS (mps.go).
	ContainerLimits map[string]uint64
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
	// Apply is what a change costs in the cluster's apply mode: its latency
	// delays what a raise saves, and a change is not undone before it has
	// settled (ApplyCost.Settle) unless a GPU OOM says it was wrong.
	Apply ApplyCost
	// LastDirection is the direction of the change made at LastChange
	// (DirectionUp or DirectionDown; "" when unknown).
	LastDirection string
	// MPS says the node's GPUs are shared through CUDA MPS (sharing.mps):
	// the count sets the memory limit of each new client, not how many pods
	// crowd one memory (decideMPSGPU, mps.go).
	MPS bool
}

// PendingPod is one pod waiting for a replica.
type PendingPod struct {
	// Workload is the pod's workload key (WorkloadKey).
	Workload string
	// Replicas is how many replicas it asks for (its resource request).
	Replicas int
	// Since is when it started waiting (its creation); zero when unknown.
	// It tells a pod that came after the tuner's first look from one the
	// node was given with the pods it runs (late), and a service's
	// replacement from a queued job (restarted). It does not make a pod
	// worth more risk: a patience that grew with the wait was tried and
	// let in pods that did not fit (docs/tuner-policy.md).
	Since time.Time
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
	// CrashLoops are the containers that OOMed again and again on a full
	// GPU beside other pods, with whether Config.EvictCrashLoops asks the
	// controller to evict them. Reported either way (Event, metric).
	CrashLoops []CrashLoop
}

// CrashLoop is a container that OOMs in a row on a full, shared GPU: the
// count cannot end its loop (a lowering stops no running pod, and the
// kubelet restarts it in place), only its eviction can.
type CrashLoop struct {
	// Container is the container key, namespace/pod/container.
	Container string
	GPU       string
	// OOMs is how many times in a row it OOMed.
	OOMs int
	// Evict says Config.EvictCrashLoops is on: the controller evicts the
	// pod if a controller recreates it.
	Evict bool
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
	var loops []CrashLoop
	judged := 0
	for _, g := range obs.GPUs {
		if g.Exclusive {
			continue
		}
		decideOne := decideGPU
		if obs.MPS {
			decideOne = decideMPSGPU
		}
		d := decideOne(cfg, obs, g, nodeFootprint)
		loops = append(loops, d.CrashLoops...)
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
	best.CrashLoops = loops
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

// footprint is the largest peak in the samples of a container still
// running at the last of them.
func footprint(ss []Sample) uint64 {
	if len(ss) == 0 {
		return 0
	}
	var f uint64
	running := ss[len(ss)-1].ContainerPeaks
	for _, s := range ss {
		for c, p := range s.ContainerPeaks {
			if _, ok := running[c]; ok {
				f = max(f, p)
			}
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

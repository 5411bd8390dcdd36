package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/gpuslice/gpuslice/internal/mps"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// Sharing modes of a trace (its optional `sharing` field).
const (
	SharingTimeSlicing = "time-slicing"
	SharingMPS         = "mps"
)

// A trace with `sharing: mps` replays a GPU shared through CUDA MPS, as
// gpuslice-plugin (and NVIDIA's) sets it up:
//
//   - A pod gets, when it is admitted (its allocation), the limit of the
//     replica count in effect then: mps.MemoryLimit(total, replicas), the
//     GPU's memory / replicas rounded down to MiB. It keeps that limit for
//     its whole run, its OOM restarts included: a later count changes the
//     limit of pods admitted after it only, in both directions.
//   - A pod whose memory would pass its own limit fails with an OOM of kind
//     process-cap (policy.OOMCap), and restarts RestartDelay later like any
//     OOMed pod, with the same limit: a pod larger than its limit loops
//     until its run ends.
//   - No pod fails because its neighbours crowd it while the limits of the
//     pods holding replicas add up to no more than the GPU (each used
//     memory is under its limit). Only when they add up to more (a raise
//     while pods started under the lower count run with their larger
//     limits) can a pod still find the GPU full; that is the time-slicing
//     rule's OOM (kind device), which the replay keeps.
//   - Each sample carries the limits of the pods holding replicas
//     (policy.Sample.ContainerLimits, the exporter's
//     gpuslice_container_gpu_memory_limit_bytes), and the policy is told the
//     GPU is shared through MPS (policy.Observation.MPS, at least 2
//     replicas).
//
// Replicas 1 means no sharing: a pod admitted at 1 gets the whole GPU.

// MPSResult is what a replay under MPS adds to Result.
type MPSResult struct {
	// Sharing is "mps".
	Sharing string `json:"sharing"`
	// CapOOMEvents are the OOM events of pods at their own limit
	// (process-cap); the rest of OOMEvents found the GPU full.
	CapOOMEvents int `json:"capOOMEvents"`
	// MaxCommittedBytes is the most the limits of the pods holding replicas
	// added up to: above the GPU's memory they over-commit it.
	MaxCommittedBytes uint64 `json:"maxCommittedBytes"`
	// StartsWithOtherLimits counts admissions while a pod admitted under
	// another limit held a replica: how often running clients kept a limit
	// the count no longer gives.
	StartsWithOtherLimits int `json:"startsWithOtherLimits"`
}

// mpsReplay is the replay's MPS state.
type mpsReplay struct {
	limit map[*podRun]uint64 // the limit each pod was admitted with
	res   *MPSResult
}

// parseSharing reads a trace's sharing field: Trace.Sharing is "" for a
// time-sliced GPU (the field left out or time-slicing), SharingMPS for MPS.
func parseSharing(tr *Trace, s *string) error {
	if s == nil {
		return nil
	}
	switch *s {
	case SharingTimeSlicing:
		return nil
	case SharingMPS:
		if tr.InitialReplicas < 2 {
			return fmt.Errorf("sharing: mps needs initialReplicas >= 2 (NVIDIA refuses fewer), got %d", tr.InitialReplicas)
		}
	default:
		return fmt.Errorf("sharing must be %s or %s, got %q", SharingTimeSlicing, SharingMPS, *s)
	}
	tr.Sharing = *s
	return nil
}

// startMPS sets the replay up for an MPS trace.
func (r *replay) startMPS() {
	if r.tr.Sharing != SharingMPS {
		return
	}
	r.mps = &mpsReplay{limit: map[*podRun]uint64{}, res: &MPSResult{Sharing: SharingMPS}}
	r.res.MPSResult = r.mps.res
}

// overLimit says whether pod p growing to bytes passes its own limit.
func (m *mpsReplay) overLimit(p *podRun, bytes uint64) bool {
	return m != nil && bytes > m.limit[p]
}

// mpsAdmit gives pod p, admitted now, the limit of the count in effect.
func (r *replay) mpsAdmit(p *podRun) {
	if r.mps == nil {
		return
	}
	limit := mps.MemoryLimit(r.tr.MemoryTotalBytes, r.replicas)
	committed, other := limit, false
	for _, q := range r.pods {
		if q != p && (q.state == running || q.state == restarting) {
			// Limits of several counts can add up past 2^64 on a GPU
			// a trace says is that large; the sum stops at the most.
			committed += min(r.mps.limit[q], math.MaxUint64-committed)
			other = other || r.mps.limit[q] != limit
		}
	}
	r.mps.limit[p] = limit
	r.mps.res.MaxCommittedBytes = max(r.mps.res.MaxCommittedBytes, committed)
	if other {
		r.mps.res.StartsWithOtherLimits++
	}
}

// capOOM fails pod p at its own limit at t: grow's OOM, of kind
// process-cap.
func (r *replay) capOOM(p *podRun, t time.Duration) {
	r.mps.res.CapOOMEvents++
	if r.beforeRaise > 0 && r.held > r.beforeRaise && p.admitted >= r.raisedAt {
		// A pod fails at its own limit whoever runs beside it, and a pod
		// keeps the limit it was admitted with: only a pod admitted since
		// the raise can have had its limit lowered by it. One admitted
		// before fails at the count it came in at, whatever the raise did.
		r.res.RaiseOOMEvents++
	}
	r.oom(p, t, policy.OOMCap)
}

// mpsSample adds the limits of the pods holding replicas to a sample.
func (r *replay) mpsSample(s *policy.Sample) {
	if r.mps == nil {
		return
	}
	s.ContainerLimits = map[string]uint64{}
	for _, p := range r.pods {
		if p.state == running || p.state == restarting {
			s.ContainerLimits[p.Name] = r.mps.limit[p]
		}
	}
}

// mpsObserve tells the policy the GPU is shared through MPS.
func (r *replay) mpsObserve(obs *policy.Observation) {
	if r.mps == nil {
		return
	}
	obs.MPS, obs.Floor = true, 2
}

package controller

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/mps"
)

// Nodes whose device-plugin config shares the GPUs through CUDA MPS
// (sharing.mps) are tuned like time-sliced ones, with their MPS replicas:
// the tuner reads and writes sharing.mps.resources[].replicas
// (dpconfig.SharedReplicas, SetSharedReplicas), never adds timeSlicing to
// such a config nor turns one mode into the other, and never goes below
// dpconfig.MinMPSReplicas (2, NVIDIA's minimum under MPS): the named
// configs below 2 are not written for an MPS base, and the policy's floor
// is 2 (policy.Observation.MPS, policy/mps.go). A count changes the memory
// limit of the containers started after it only (docs/mps.md, "Changing
// the replica count"); ReasonMPSLimitsKept says so on the Node.

// ReasonMPSLimitsKept is the Event of an MPS count changed while clients
// started under the old count run: they keep the limit they started with.
const ReasonMPSLimitsKept = "MPSLimitsKept"

// expectedMPS is what a node with gpus GPUs advertises under an MPS
// config: every GPU shared (NVIDIA's plugin and gpuslice-plugin ignore
// devices under sharing.mps, and dpconfig refuses it), its replicas under
// the nvidia.com/gpu entry's name, or name.shared with renameByDefault.
func (s semantics) expectedMPS(c dpconfig.Config, gpus int) (string, int64) {
	for _, r := range c.MPSSharing.Resources {
		if r.Name == dpconfig.GPUResource {
			return c.MPSSharing.AdvertisedName(r), int64(gpus * r.Replicas)
		}
	}
	return dpconfig.GPUResource, int64(gpus)
}

// namedFloor is the least count a named config is written for: 2 when
// the base shares through MPS (NVIDIA refuses fewer there, and 1 would be
// another mode), else no floor.
func (c *Controller) namedFloor(cm *corev1.ConfigMap) int {
	if f, err := c.baseFile(cm); err == nil && f.MPS() {
		return dpconfig.MinMPSReplicas
	}
	return 0
}

// mpsLimitsChanged records, after an MPS count was changed from → to, an
// Event naming the containers still running with a limit the new count no
// longer gives: running containers keep the limit they started with. A
// raise leaves them their larger limits beside the new, smaller ones (the
// GPU may be over-committed until they end: a Warning); a lowering leaves
// them their smaller limits (the GPU is under-used until they end).
func (c *Controller) mpsLimitsChanged(w *work, from, to int) {
	if !w.mps || from == to {
		return
	}
	var total uint64
	stale := map[string]uint64{}
	for _, g := range w.gpus {
		if len(g.Samples) == 0 {
			continue
		}
		s := g.Samples[len(g.Samples)-1]
		total = max(total, s.MemoryTotalBytes)
		newLimit := mps.MemoryLimit(s.MemoryTotalBytes, to)
		for ctr := range s.ContainerPeaks {
			l, known := s.ContainerLimits[ctr]
			if !known {
				l = mps.MemoryLimit(s.MemoryTotalBytes, from) // started under the count before this change, at best
			}
			if l != newLimit {
				stale[ctr] = l
			}
		}
	}
	if len(stale) == 0 {
		return
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range stale {
			if !yield(k) {
				return
			}
		}
	})
	list := ""
	for i, n := range names {
		if i == 6 {
			list += fmt.Sprintf(" and %d more", len(names)-6)
			break
		}
		if i > 0 {
			list += ", "
		}
		list += fmt.Sprintf("%s (%.1f GiB)", n, float64(stale[n])/(1<<30))
	}
	typ, effect := corev1.EventTypeNormal, "the GPU holds less than it could until they end"
	if to > from {
		typ, effect = corev1.EventTypeWarning, "their limits and the new ones may add up to more than the GPU until they end"
	}
	c.event(w, typ, ReasonMPSLimitsKept, fmt.Sprintf("%d>%d", from, to),
		"MPS replicas %d -> %d: containers started from now get %.1f GiB each; %d running container(s) keep the limit they started with: %s; %s (restart them to apply the new limit)",
		from, to, float64(mps.MemoryLimit(total, to))/(1<<30), len(names), list, effect)
}

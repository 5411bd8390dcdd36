package policy

import (
	"cmp"
	"math"
	"slices"
	"strings"
)

// MemoryRequestGranularity is what recommended DRA memory requests are
// rounded up to: fine enough not to waste a GPU's memory, coarse enough
// that a peak moving by a few MiB does not change the advice every round.
const MemoryRequestGranularity = 256 << 20

// MemoryRequest is the `memory` capacity one container should request, on
// one GPU, from a DRA driver that shares GPUs by consumable capacity.
type MemoryRequest struct {
	// Container is the container key, namespace/pod/container.
	Container string
	UUID      string
	// PeakBytes is the container's largest memory in the window.
	PeakBytes uint64
	// RequestBytes is PeakBytes / TargetUtilization, rounded up to
	// MemoryRequestGranularity.
	RequestBytes uint64
}

// RecommendMemoryRequests is the advice for a node whose GPUs DRA manages.
// There is no replica count to tune there: a claim's devices are fixed once
// it is allocated, and how many pods share a GPU is the driver's business
// (its sharing flags, or each claim's memory request under consumable
// capacity). What the measurements can still say is how much memory each
// workload needs: its peak over the window, with the same margin a raise
// leaves (divided by TargetUtilization). Containers with no measured memory
// get no advice. The answer is sorted by container, then GPU.
func RecommendMemoryRequests(cfg Config, obs Observation) []MemoryRequest {
	peaks := map[[2]string]uint64{}
	for _, g := range obs.GPUs {
		for _, s := range within(g.Samples, obs.Now.Add(-cfg.Window), obs.Now) {
			for c, p := range s.ContainerPeaks {
				k := [2]string{c, g.UUID}
				peaks[k] = max(peaks[k], p)
			}
		}
	}
	util := cfg.TargetUtilization
	if util <= 0 || util > 1 {
		util = 1
	}
	out := make([]MemoryRequest, 0, len(peaks))
	for k, p := range peaks {
		if p == 0 {
			continue
		}
		req := uint64(math.Ceil(float64(p) / util))
		req = (req + MemoryRequestGranularity - 1) / MemoryRequestGranularity * MemoryRequestGranularity
		out = append(out, MemoryRequest{Container: k[0], UUID: k[1], PeakBytes: p, RequestBytes: req})
	}
	slices.SortFunc(out, func(a, b MemoryRequest) int {
		return cmp.Or(strings.Compare(a.Container, b.Container), strings.Compare(a.UUID, b.UUID))
	})
	return out
}

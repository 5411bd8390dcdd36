package controller

import (
	"slices"
	"strconv"
	"strings"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// semantics is how the cluster's device plugin reads a config. NVIDIA's
// plugin (v0.19.0, api/config/v1 disableResoureRenaming) ignores `rename`
// and `devices` in sharing.timeSlicing with a warning: every GPU is
// time-sliced, under <name>.shared with renameByDefault, else under the
// name. gpuslice-plugin follows both. Checking a node's allocatable with the
// wrong reading fails verification for nothing and holds the node.
type semantics struct{ nvidia bool }

// advertisedName is the resource r's replicas are advertised under.
func (s semantics) advertisedName(c dpconfig.Config, r dpconfig.Resource) string {
	if !s.nvidia {
		return c.AdvertisedName(r)
	}
	if c.RenameByDefault {
		return r.Name + dpconfig.SharedSuffix
	}
	return r.Name
}

// expected is what a node with gpus physical GPUs advertises under the
// config: each time-sliced GPU counts its replicas under the advertised
// name; GPUs left out of the device selection stay whole under
// nvidia.com/gpu.
func (s semantics) expected(c dpconfig.Config, gpus int) (resource string, count int64) {
	if c.MPS {
		return s.expectedMPS(c, gpus)
	}
	for _, r := range c.Resources {
		if r.Name != dpconfig.GPUResource {
			continue
		}
		k := gpus
		if !s.nvidia {
			switch {
			case r.Devices.Count > 0:
				k = min(r.Devices.Count, gpus)
			case len(r.Devices.List) > 0:
				k = min(len(r.Devices.List), gpus)
			}
		}
		name := s.advertisedName(c, r)
		count = int64(k * r.Replicas)
		if name == dpconfig.GPUResource {
			count += int64(gpus - k)
		}
		return name, count
	}
	return dpconfig.GPUResource, int64(gpus)
}

// resource is the resource a config advertises the node's GPUs under.
func (s semantics) resource(c dpconfig.Config) string {
	r, _ := s.expected(c, 0)
	return r
}

// floor is the least count a node with the sharing config c may get: 2
// when c renames the shared resource, since 1 replica (a config without
// sharing) advertises plain nvidia.com/gpu and pods asking for the shared
// name could never run again; 0 (no floor) otherwise.
func (s semantics) floor(c dpconfig.Config) int {
	if c.MPS {
		return dpconfig.MinMPSReplicas
	}
	if len(c.Resources) > 0 && s.resource(c) != dpconfig.GPUResource {
		return 2
	}
	return 0
}

// markExclusive returns the GPUs with Exclusive set on those the config's
// device selection leaves out of time-slicing (gpuslice-plugin only: NVIDIA
// slices every GPU). A GPU is selected by UUID or by its index on the node
// (the exporter's gpu label); a count selects the first GPUs by index. When
// an index is needed and unknown, the GPU is taken as time-sliced, as
// before.
func (s semantics) markExclusive(c dpconfig.Config, gpus []policy.GPUObservation) []policy.GPUObservation {
	if s.nvidia {
		return gpus
	}
	var sel dpconfig.Devices
	found := false
	for _, r := range c.Resources {
		if r.Name == dpconfig.GPUResource {
			sel, found = r.Devices, true
		}
	}
	if !found || sel.All || (sel.Count == 0 && len(sel.List) == 0) {
		return gpus
	}
	index := func(g policy.GPUObservation) (int, bool) {
		if len(g.Samples) == 0 {
			return 0, false
		}
		i, err := strconv.Atoi(g.Samples[len(g.Samples)-1].GPU)
		return i, err == nil
	}
	out := slices.Clone(gpus)
	for i, g := range out {
		idx, known := index(g)
		if sel.Count > 0 {
			out[i].Exclusive = known && idx >= sel.Count
			continue
		}
		selected := slices.Contains(sel.List, g.UUID) || (known && slices.Contains(sel.List, strconv.Itoa(idx)))
		// A GPU whose index is unknown cannot be matched against indexes.
		out[i].Exclusive = !selected && (known || !slices.ContainsFunc(sel.List, isIndexRef))
	}
	return out
}

// isIndexRef is a device reference by index ("0", or "0:1" for MIG).
func isIndexRef(ref string) bool {
	return !strings.HasPrefix(ref, "GPU-") && !strings.HasPrefix(ref, "MIG-")
}

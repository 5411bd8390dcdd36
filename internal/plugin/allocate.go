package plugin

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/mps"
	"github.com/gpuslice/gpuslice/internal/podresources"
)

// Environment variables of an allocation.
const (
	// EnvVisibleDevices is read by the NVIDIA container runtime: the GPUs
	// the container may use.
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	// EnvMemoryBudget is the container's advisory share of GPU memory: the
	// GPU's memory divided by its replicas (the smallest share when the
	// container holds several GPUs). Nothing enforces it; applications can
	// cap themselves with it (PyTorch's
	// torch.cuda.set_per_process_memory_fraction, TensorFlow's memory
	// limit, JAX's XLA_PYTHON_CLIENT_MEM_FRACTION).
	EnvMemoryBudget = "GPUSLICE_GPU_MEMORY_BUDGET_BYTES"
)

// ErrRequest is wrapped by Allocate's errors about a request itself.
var ErrRequest = errors.New("invalid allocation request")

// tooLargeError is a request over failRequestsGreaterThanOne, worded as
// NVIDIA's plugin words it since v0.15 (internal/rm ValidateRequest), so
// that users find its documentation and issues. It matches ErrRequest.
type tooLargeError struct{ n int }

func (e tooLargeError) Error() string {
	return fmt.Sprintf("invalid request: maximum request size for shared resources is 1; found %d", e.n)
}

func (tooLargeError) Is(target error) bool { return target == ErrRequest }

// Policy orders the devices GetPreferredAllocation prefers.
type Policy string

const (
	// Distributed prefers the GPU with the fewest replicas in use, and
	// different GPUs for the replicas of one request, so that pods share a
	// GPU with as few others as possible.
	Distributed Policy = "distributed"
	// Packed prefers the GPU with the most replicas in use, keeping other
	// GPUs free for pods that want a GPU of their own.
	Packed Policy = "packed"
)

// ParsePolicy reads a --preferred-allocation value.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case Distributed, Packed:
		return p, nil
	}
	return "", fmt.Errorf("unknown allocation policy %q, want %s or %s", s, Distributed, Packed)
}

// containerResponse computes one container's allocation. resource names
// the resource in errors, as NVIDIA's plugin does; requestID is the
// container's CDI annotation key suffix.
func containerResponse(p plan, resource string, ids []string, failGreaterThanOne bool, requestID string) (*pluginapi.ContainerAllocateResponse, error) {
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w for '%s': no devices", ErrRequest, resource)
	}
	var gpus []gpuInfo
	shared := false
	var budget uint64
	for _, raw := range ids {
		id, err := podresources.ParseDeviceID(raw)
		if err != nil {
			return nil, fmt.Errorf("%w for '%s': unknown device: %s", ErrRequest, resource, raw)
		}
		g, ok := p.GPUs[id.UUID]
		if !ok {
			return nil, fmt.Errorf("%w for '%s': unknown device: %s", ErrRequest, resource, raw)
		}
		shared = shared || id.Shared
		if !slices.ContainsFunc(gpus, func(h gpuInfo) bool { return h.UUID == g.UUID }) {
			gpus = append(gpus, g)
			share := g.MemoryTotalBytes / uint64(max(p.Replicas[id.UUID], 1))
			if _, ok := p.MPS[g.UUID]; ok {
				// What the client's pinned limit is (MiB-rounded): a
				// budget a hair above it would have an application that
				// sizes itself to the budget hit the limit first.
				share = mps.MemoryLimit(g.MemoryTotalBytes, p.Replicas[id.UUID])
			}
			if budget == 0 || share < budget {
				budget = share
			}
		}
	}
	if failGreaterThanOne && shared && len(ids) > 1 {
		return nil, tooLargeError{len(ids)}
	}
	return p.Inject.response(gpus, budget, requestID), nil
}

// preferred picks size devices out of available for one container, after the
// must-include ones. inUse counts the replicas in use on each GPU. Draining
// IDs (held beyond what the config asks for) come last, so a released one is
// not handed out again while a wanted one is free.
func preferred(policy Policy, p plan, resource string, available, mustInclude []string, size int, inUse map[string]int) []string {
	out := slices.Clone(mustInclude)
	if size <= len(out) {
		return out[:max(size, 0)]
	}
	info := map[string]advertised{}
	for _, d := range p.Resources[resource] {
		info[d.ID] = d
	}
	used := make(map[string]int, len(inUse))
	for g, n := range inUse {
		used[g] = n
	}
	chosenOn := map[string]int{}
	for _, id := range mustInclude {
		if d, ok := info[id]; ok {
			used[d.GPU]++
			chosenOn[d.GPU]++
		}
	}
	var candidates []advertised
	for _, id := range available {
		if slices.Contains(mustInclude, id) {
			continue
		}
		d, ok := info[id]
		if !ok {
			d = advertised{ID: id, Draining: true} // not ours any more: last
			if parsed, err := podresources.ParseDeviceID(id); err == nil {
				d.GPU, d.Replica = parsed.UUID, parsed.Replica
			}
		}
		candidates = append(candidates, d)
	}
	index := func(uuid string) int {
		if g, ok := p.GPUs[uuid]; ok {
			return g.Index
		}
		return int(^uint(0) >> 1)
	}
	for len(out) < size && len(candidates) > 0 {
		best := 0
		for i := 1; i < len(candidates); i++ {
			if better(policy, candidates[i], candidates[best], used, chosenOn, index) {
				best = i
			}
		}
		c := candidates[best]
		out = append(out, c.ID)
		used[c.GPU]++
		chosenOn[c.GPU]++
		candidates = slices.Delete(candidates, best, best+1)
	}
	return out
}

// better reports whether a should be preferred over b.
func better(policy Policy, a, b advertised, used, chosenOn map[string]int, index func(string) int) bool {
	if a.Draining != b.Draining {
		return !a.Draining
	}
	var c int
	switch policy {
	case Packed:
		c = cmp.Or(-cmp.Compare(used[a.GPU], used[b.GPU]), cmp.Compare(index(a.GPU), index(b.GPU)))
	default:
		c = cmp.Or(cmp.Compare(chosenOn[a.GPU], chosenOn[b.GPU]), cmp.Compare(used[a.GPU], used[b.GPU]), cmp.Compare(index(a.GPU), index(b.GPU)))
	}
	return cmp.Or(c, cmp.Compare(a.Replica, b.Replica), cmp.Compare(a.ID, b.ID)) < 0
}

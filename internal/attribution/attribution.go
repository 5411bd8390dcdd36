// Package attribution joins what the GPU reports (processes and their memory
// on each physical GPU), what /proc says about each process (its pod and
// container) and what the kubelet allocated (replica IDs per container) into
// per-container usage. It is pure: every input is read by the caller, so the
// join is table-tested without a node.
//
// The central rule: a container's memory on a GPU is the sum of its
// processes' memory on that physical GPU, counted once, however many replica
// IDs of that GPU the container holds. Time-sliced replicas are only
// scheduling tokens; the memory belongs to the processes.
//
// MIG devices are allocations of the physical GPU they are carved from: a
// MIG device ID counts as an ID of its parent GPU, found through the GPU
// reading (each MIG device's UUID) or, in the old MIG-GPU-<uuid>/<gi>/<ci>
// form, the ID itself. A process that NVML lists in a MIG instance is
// also counted on its MIG device, beside its GPU.
package attribution

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/pods"
)

// ProcessRef is what /proc told about one process: the pod UID and container
// runtime ID of its cgroup.
type ProcessRef struct {
	PodUID      string
	ContainerID string
}

// Container names a container the Kubernetes way.
type Container struct {
	Namespace, Pod, Container string
	// PodUID is kept for log paths and de-duplication; it is not a label.
	PodUID string
}

// Usage is one container's use of one physical GPU.
type Usage struct {
	Container
	GPUIndex    int
	UUID        string
	MemoryBytes uint64
	// MemoryUnknown is true when the driver gave the memory of one of its
	// processes as not available: MemoryBytes is then a lower bound.
	MemoryUnknown bool
	SMUtilization float64 // sum over its processes, capped at 1
	HasSM         bool    // at least one process had an SM sample
	Processes     int
}

// Holding is the number of replica IDs of one GPU and resource a container
// holds.
type Holding struct {
	Container
	UUID     string
	Resource string
	IDs      int
}

// MIGHolding is the number of replica IDs of one MIG device a container
// holds (1 for a MIG device that is not time-sliced). A MIG device is
// advertised under one resource, which the container's Holding names.
type MIGHolding struct {
	Container
	UUID    string // the physical GPU
	MIGUUID string
	IDs     int
}

// MIGUsage is one container's use of one MIG device, from the processes
// that NVML lists in its GPU and compute instance.
type MIGUsage struct {
	Container
	GPUIndex    int
	UUID        string // the physical GPU
	MIGUUID     string
	MemoryBytes uint64
	// MemoryUnknown is as Usage's.
	MemoryUnknown bool
	Processes     int
}

// ResourceGPU keys per-GPU, per-resource replica counts.
type ResourceGPU struct {
	UUID, Resource string
}

// Input is everything read for one scrape.
type Input struct {
	Devices []gpu.Device
	// Refs maps a PID to its pod; a PID absent here is a host process, one
	// that vanished, or one outside Kubernetes.
	Refs map[int]ProcessRef
	// Gone holds PIDs whose /proc entry vanished between the GPU reading
	// and the /proc reading. Their memory counts as unattributed: the GPU
	// reading listed it, and the device's used memory of the same reading
	// includes it, so dropping it would make the per-container and
	// unattributed series add up to less than the GPU's used memory.
	Gone map[int]bool
	// Pods looks pod UIDs up.
	Pods pods.Source
	// Allocations is the kubelet's PodResources List (GPU ones or all; non-GPU
	// device IDs are ignored).
	Allocations []podresources.Allocation
	// Allocatable is the kubelet's GetAllocatableResources.
	Allocatable []podresources.Allocatable
	// MIGParents maps MIG device UUIDs to their GPU's UUID, beside the MIG
	// devices of Devices: the caller keeps those seen in earlier readings,
	// so that allocations on a GPU that failed this reading still count.
	MIGParents map[string]string
}

// Result is the join.
type Result struct {
	// Usage is sorted by UUID, namespace, pod, container.
	Usage []Usage
	// Unattributed is memory on each GPU (by UUID) held by processes that
	// belong to no known pod container.
	Unattributed map[string]uint64
	// UnattributedUnknown holds the GPUs whose Unattributed figure is a
	// lower bound: one of those processes' memory was not available.
	UnattributedUnknown map[string]bool
	// Holdings is sorted like Usage.
	Holdings []Holding
	// Replicas counts advertised replica IDs per GPU and resource.
	Replicas map[ResourceGPU]int
	// Allocated counts distinct allocated replica IDs per GPU and resource.
	Allocated map[ResourceGPU]int
	// MIGHoldings are the holdings of MIG devices, sorted by GPU, MIG
	// device, namespace, pod and container. Each is also in
	// Holdings, summed into its GPU.
	MIGHoldings []MIGHolding
	// MIGUsage is the usage of MIG devices, sorted by GPU, MIG device,
	// namespace, pod and container. Each process in it is also in Usage.
	MIGUsage []MIGUsage
}

type usageKey struct {
	uuid string
	c    Container
}

type holdingKey struct {
	uuid, resource string
	c              Container
}

// Join computes the Result. It never fails: what cannot be attributed is
// reported as unattributed, never dropped.
func Join(in Input) Result {
	res := Result{
		Unattributed:        map[string]uint64{},
		UnattributedUnknown: map[string]bool{},
		Replicas:            map[ResourceGPU]int{},
		Allocated:           map[ResourceGPU]int{},
	}

	// Allocations first: they name containers that hold a GPU, which is also
	// the fallback for processes whose container ID the pod status does not
	// show yet (a container that started after the last status update).
	ids := newDeviceIDs(in)
	allocated := 0
	for _, a := range in.Allocations {
		allocated += len(a.DeviceIDs)
	}
	// The values live in one array each, sized for the most there can be,
	// rather than one allocation each: this runs at every scrape.
	holdingValues := make([]Holding, 0, allocated)
	holdings := make(map[holdingKey]*Holding, len(in.Allocations))
	migHoldings := map[usageKey]*MIGHolding{} // keyed by MIG UUID
	holdersOf := map[podGPU][]Container{}     // (namespace/pod, uuid) → holders
	seenID := make(map[resourceID]bool, allocated)
	for _, a := range in.Allocations {
		for _, raw := range a.DeviceIDs {
			uuid, mig, ok := ids.gpuOf(raw)
			if !ok {
				continue
			}
			c := Container{Namespace: a.Namespace, Pod: a.Pod, Container: a.Container}
			k := holdingKey{uuid: uuid, resource: a.Resource, c: c}
			h := holdings[k]
			if h == nil {
				holdingValues = append(holdingValues, Holding{Container: c, UUID: uuid, Resource: a.Resource})
				h = &holdingValues[len(holdingValues)-1]
				holdings[k] = h
				pk := podGPU{ns: a.Namespace, pod: a.Pod, uuid: uuid}
				if !slices.Contains(holdersOf[pk], c) {
					holdersOf[pk] = append(holdersOf[pk], c)
				}
			}
			h.IDs++
			if mig != "" {
				mk := usageKey{uuid: mig, c: c}
				m := migHoldings[mk]
				if m == nil {
					m = &MIGHolding{Container: c, UUID: uuid, MIGUUID: mig}
					migHoldings[mk] = m
				}
				m.IDs++
			}
			rk := ResourceGPU{UUID: uuid, Resource: a.Resource}
			// The kubelet never gives one ID to two containers, but count
			// distinct IDs anyway so a kubelet bug cannot inflate the gauge.
			if key := (resourceID{a.Resource, raw}); !seenID[key] {
				seenID[key] = true
				res.Allocated[rk]++
			}
		}
	}
	res.Holdings = sorted(holdings, func(a, b *Holding) int {
		return cmp.Or(compare(a.UUID, a.Container, b.UUID, b.Container), strings.Compare(a.Resource, b.Resource))
	})
	res.MIGHoldings = sorted(migHoldings, func(a, b *MIGHolding) int {
		return cmp.Or(strings.Compare(a.UUID, b.UUID), compare(a.MIGUUID, a.Container, b.MIGUUID, b.Container))
	})

	for _, a := range in.Allocatable {
		for _, raw := range a.DeviceIDs {
			if uuid, _, ok := ids.gpuOf(raw); ok {
				res.Replicas[ResourceGPU{UUID: uuid, Resource: a.Resource}]++
			}
		}
	}

	procs := 0
	for _, d := range in.Devices {
		procs += len(d.Processes)
	}
	usageValues := make([]Usage, 0, procs)
	usage := make(map[usageKey]*Usage, procs)
	migUsage := map[usageKey]*MIGUsage{} // keyed by MIG UUID
	for _, d := range in.Devices {
		for _, p := range d.Processes {
			c, ok := Container{}, false
			if !in.Gone[p.PID] {
				c, ok = resolve(in, p.PID, d.UUID, holdersOf)
			}
			if !ok {
				res.Unattributed[d.UUID] += p.UsedMemoryBytes
				if p.MemoryUnknown {
					res.UnattributedUnknown[d.UUID] = true
				}
				continue
			}
			k := usageKey{uuid: d.UUID, c: c}
			u := usage[k]
			if u == nil {
				usageValues = append(usageValues, Usage{Container: c, GPUIndex: d.Index, UUID: d.UUID})
				u = &usageValues[len(usageValues)-1]
				usage[k] = u
			}
			u.MemoryBytes += p.UsedMemoryBytes
			u.MemoryUnknown = u.MemoryUnknown || p.MemoryUnknown
			u.Processes++
			if p.HasSMUtilization {
				u.HasSM = true
				u.SMUtilization += p.SMUtilization
			}
			if !p.InMIG {
				continue
			}
			m, ok := d.MIGDevice(p.GPUInstanceID, p.ComputeInstanceID)
			if !ok {
				continue
			}
			mk := usageKey{uuid: m.UUID, c: c}
			mu := migUsage[mk]
			if mu == nil {
				mu = &MIGUsage{Container: c, GPUIndex: d.Index, UUID: d.UUID, MIGUUID: m.UUID}
				migUsage[mk] = mu
			}
			mu.MemoryBytes += p.UsedMemoryBytes
			mu.MemoryUnknown = mu.MemoryUnknown || p.MemoryUnknown
			mu.Processes++
		}
		if _, ok := res.Unattributed[d.UUID]; !ok {
			res.Unattributed[d.UUID] = 0
		}
	}
	for _, u := range usage {
		if u.SMUtilization > 1 {
			u.SMUtilization = 1
		}
	}
	res.Usage = sorted(usage, func(a, b *Usage) int { return compare(a.UUID, a.Container, b.UUID, b.Container) })
	res.MIGUsage = sorted(migUsage, func(a, b *MIGUsage) int {
		return cmp.Or(strings.Compare(a.UUID, b.UUID), compare(a.MIGUUID, a.Container, b.MIGUUID, b.Container))
	})
	return res
}

// deviceIDs maps device IDs to GPUs for one join.
type deviceIDs struct {
	// migParent maps MIG device UUIDs to their GPU's UUID; nil on a node
	// without MIG.
	migParent map[string]string
}

func newDeviceIDs(in Input) deviceIDs {
	var ids deviceIDs
	for _, d := range in.Devices {
		for _, m := range d.MIGDevices {
			if ids.migParent == nil {
				ids.migParent = make(map[string]string, len(in.MIGParents)+len(d.MIGDevices))
				maps.Copy(ids.migParent, in.MIGParents)
			}
			ids.migParent[m.UUID] = d.UUID
		}
	}
	if ids.migParent == nil {
		ids.migParent = in.MIGParents
	}
	return ids
}

// gpuOf returns the UUID of the GPU that device ID raw is on and, for a MIG
// device, the MIG device's UUID. ok is false for IDs that are not GPUs or
// MIG devices, and for a MIG device in the "MIG-<uuid>" form that no GPU
// reading has listed: only NVML knows its GPU.
func (ids deviceIDs) gpuOf(raw string) (uuid, mig string, ok bool) {
	if id, err := podresources.ParseDeviceID(raw); err == nil {
		return id.UUID, "", true
	}
	m, err := podresources.ParseMIGDeviceID(raw)
	if err != nil {
		return "", "", false
	}
	if parent, ok := ids.migParent[m.UUID]; ok {
		return parent, m.UUID, true
	}
	if m.ParentUUID != "" {
		return m.ParentUUID, m.UUID, true
	}
	return "", "", false
}

// sorted returns the values of m in the order of cmp. It sorts pointers
// and copies each value once: the values are large, and this runs at every
// scrape over every container and GPU.
func sorted[K comparable, V any](m map[K]*V, cmp func(a, b *V) int) []V {
	if len(m) == 0 {
		return nil
	}
	ptrs := make([]*V, 0, len(m))
	for _, v := range m {
		ptrs = append(ptrs, v)
	}
	slices.SortFunc(ptrs, cmp)
	out := make([]V, len(ptrs))
	for i, v := range ptrs {
		out[i] = *v
	}
	return out
}

type podGPU struct{ ns, pod, uuid string }

// resourceID is one device ID of one resource.
type resourceID struct{ resource, id string }

// resolve finds the container of a process on GPU uuid.
func resolve(in Input, pid int, uuid string, holdersOf map[podGPU][]Container) (Container, bool) {
	ref, ok := in.Refs[pid]
	if !ok || ref.PodUID == "" || in.Pods == nil {
		return Container{}, false
	}
	pod, ok := in.Pods.Get(ref.PodUID)
	if !ok {
		return Container{}, false
	}
	if name, ok := pods.ContainerName(pod, ref.ContainerID); ok {
		return Container{Namespace: pod.Namespace, Pod: pod.Name, Container: name, PodUID: string(pod.UID)}, true
	}
	// The status does not list this container ID yet. If exactly one
	// container of the pod holds this GPU, the process is that container's;
	// otherwise guessing could blame the wrong one.
	if h := holdersOf[podGPU{ns: pod.Namespace, pod: pod.Name, uuid: uuid}]; len(h) == 1 {
		c := h[0]
		c.PodUID = string(pod.UID)
		return c, true
	}
	if only, ok := onlyContainer(pod); ok {
		return Container{Namespace: pod.Namespace, Pod: pod.Name, Container: only, PodUID: string(pod.UID)}, true
	}
	return Container{}, false
}

func onlyContainer(p *corev1.Pod) (string, bool) {
	if len(p.Status.ContainerStatuses) == 1 && len(p.Status.InitContainerStatuses) == 0 {
		return p.Status.ContainerStatuses[0].Name, true
	}
	return "", false
}

// compare orders by GPU, then namespace, pod and container.
func compare(u1 string, c1 Container, u2 string, c2 Container) int {
	return cmp.Or(strings.Compare(u1, u2), strings.Compare(c1.Namespace, c2.Namespace),
		strings.Compare(c1.Pod, c2.Pod), strings.Compare(c1.Container, c2.Container))
}

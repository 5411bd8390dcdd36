// Package dra maps the devices of Kubernetes DRA ResourceClaims to GPU
// UUIDs, so that GPUs allocated through DRA are attributed to pods like
// device-plugin GPUs.
//
// The kubelet's PodResources API names a claim's devices by driver, pool and
// device ("gpu.nvidia.com", "node-a", "gpu-0"); only the ResourceSlices the
// driver publishes for the node say which GPU that is, in a device
// attribute (NVIDIA's DRA driver: "uuid"). Devices that carry no GPU UUID
// (NICs, MIG slices, other vendors) are not GPUs to the exporter and are
// dropped.
package dra

import (
	"context"
	"log/slog"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/gpuslice/gpuslice/internal/podresources"
)

// UUIDAttribute is the device attribute that holds a GPU's UUID, as NVIDIA's
// DRA driver publishes it. It is read unqualified (the driver's own domain)
// or qualified by the driver's name ("gpu.nvidia.com/uuid").
const UUIDAttribute = "uuid"

// DeviceKey names a DRA device the way allocation results and the kubelet
// do.
type DeviceKey struct {
	Driver, Pool, Device string
}

// Devices maps the node's DRA devices that are whole GPUs to their UUIDs.
type Devices map[DeviceKey]string

// FromSlices indexes ResourceSlices. Only the newest generation of each
// pool counts: while a driver republishes a pool, slices of the old
// generation may still be listed, and their devices may be gone.
func FromSlices(slices []*resourcev1.ResourceSlice) Devices {
	type pool struct{ driver, name string }
	newest := map[pool]int64{}
	for _, s := range slices {
		p := pool{s.Spec.Driver, s.Spec.Pool.Name}
		if g, ok := newest[p]; !ok || s.Spec.Pool.Generation > g {
			newest[p] = s.Spec.Pool.Generation
		}
	}
	out := Devices{}
	for _, s := range slices {
		if s.Spec.Pool.Generation != newest[pool{s.Spec.Driver, s.Spec.Pool.Name}] {
			continue
		}
		for _, d := range s.Spec.Devices {
			if uuid, ok := gpuUUID(s.Spec.Driver, d); ok {
				out[DeviceKey{Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Device: d.Name}] = uuid
			}
		}
	}
	return out
}

// gpuUUID is the UUID of a device that is a whole GPU.
func gpuUUID(driver string, d resourcev1.Device) (string, bool) {
	for _, name := range []resourcev1.QualifiedName{UUIDAttribute, resourcev1.QualifiedName(driver + "/" + UUIDAttribute)} {
		a, ok := d.Attributes[name]
		if !ok || a.StringValue == nil {
			continue
		}
		id, err := podresources.ParseDeviceID(*a.StringValue)
		if err != nil || id.Shared {
			return "", false
		}
		return id.UUID, true
	}
	return "", false
}

// Resolve returns allocs with every DRA allocation (one with Claims) given
// its GPUs' UUIDs as DeviceIDs, each once per container. A DRA allocation
// with no GPU among its devices is dropped. unknown counts devices of
// drivers that publish GPUs here whose device is not (yet) in a slice: a
// claim allocated before its driver's slice reached the informer.
func Resolve(allocs []podresources.Allocation, gpus Devices) (out []podresources.Allocation, unknown int) {
	drivers := map[string]bool{}
	for k := range gpus {
		drivers[k.Driver] = true
	}
	out = make([]podresources.Allocation, 0, len(allocs))
	for _, a := range allocs {
		if len(a.Claims) == 0 {
			out = append(out, a)
			continue
		}
		var ids []string
		for _, c := range a.Claims {
			uuid, ok := gpus[DeviceKey{Driver: c.Driver, Pool: c.Pool, Device: c.Device}]
			if !ok {
				if drivers[c.Driver] {
					unknown++
				}
				continue
			}
			if !contains(ids, uuid) {
				ids = append(ids, uuid)
			}
		}
		if len(ids) == 0 {
			continue
		}
		a.DeviceIDs = ids
		out = append(out, a)
	}
	return out, unknown
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Lister is the PodResources client the exporter uses.
type Lister interface {
	List(ctx context.Context) ([]podresources.Allocation, error)
	Allocatable(ctx context.Context) ([]podresources.Allocatable, error)
}

// Kubelet is a Lister whose List resolves DRA allocations to GPUs through
// the node's ResourceSlices.
type Kubelet struct {
	Lister
	Slices Slices
	Logger *slog.Logger
}

// Slices is what Kubelet needs of the ResourceSlice informer.
type Slices interface {
	Devices() Devices
	Err() error
}

// Instance is the PodResources socket the kubelet answers on, when the
// Lister tells it (*podresources.Client does): the exporter takes a new one
// for a kubelet that started again, whose first lists are empty until it
// has read its pods back. The zero Instance otherwise.
func (k Kubelet) Instance() podresources.Instance {
	if i, ok := k.Lister.(podresources.InstanceTeller); ok {
		return i.Instance()
	}
	return podresources.Instance{}
}

// List implements Lister.
func (k Kubelet) List(ctx context.Context) ([]podresources.Allocation, error) {
	allocs, err := k.Lister.List(ctx)
	if !hasClaims(allocs) {
		return allocs, err
	}
	out, unknown := Resolve(allocs, k.Slices.Devices())
	if unknown > 0 && k.Logger != nil {
		k.Logger.Debug("DRA devices not in any ResourceSlice of this node yet", "devices", unknown, "slices", k.Slices.Err())
	}
	return out, err
}

func hasClaims(allocs []podresources.Allocation) bool {
	for _, a := range allocs {
		if len(a.Claims) > 0 {
			return true
		}
	}
	return false
}

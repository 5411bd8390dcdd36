package plugin

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/podresources"
)

// gpuInfo is one physical GPU as the plugin knows it.
type gpuInfo struct {
	UUID             string
	Index            int
	MemoryTotalBytes uint64
	Healthy          bool
	// MIGEnabled: the GPU's MIG mode is on. Its whole-GPU ID is then
	// advertised only under migStrategy none (desires says why).
	MIGEnabled bool
}

// held is a device ID the kubelet has given to a container, with the
// resource it was given under.
type held struct {
	ID       string
	Resource string
}

// advertised is one device ID in a resource's list.
type advertised struct {
	ID       string
	GPU      string // UUID
	Replica  int
	Healthy  bool
	Draining bool // held beyond what the config asks for: kept until released
}

// plan is what the plugin advertises for one config, GPU inventory and set of
// held IDs.
type plan struct {
	// Resources maps a resource name to its devices, sorted by GPU index
	// then replica.
	Resources map[string][]advertised
	// Replicas is the configured replica count of each GPU (1 when it is
	// not shared, 0 when it is not advertised), for the per-replica memory
	// budget.
	Replicas map[string]int
	// GPUs by UUID.
	GPUs map[string]gpuInfo
	// MPS maps the UUID of each GPU shared through CUDA MPS to the
	// resource its replicas are advertised under; such a GPU never also
	// serves time-slicing replicas.
	MPS map[string]string
	// Inject is how allocations name their GPUs to the container runtime.
	Inject injection
	// Warnings about parts of the config the plan could not follow.
	Warnings []string
}

// desire is what the config asks of one GPU: ids, in order, under resource.
type desire struct {
	resource string
	replicas int
	ids      []string
	mps      bool
}

// computePlan decides what to advertise. Every GPU gets the IDs its config
// entry asks for: <uuid>::0 … <uuid>::<replicas-1> under the (possibly
// renamed) time-slicing resource, or its bare UUID under nvidia.com/gpu when
// no entry selects it.
//
// IDs the kubelet has given to containers are always advertised, under the
// resource they were given under, even when the config no longer asks for
// them: a running pod never loses its device. They take the place of free IDs
// of the same GPU, so a GPU advertises max(replicas, held) IDs: after a
// shrink from 4 to 2 with <uuid>::3 in use, the GPU advertises ::0 and ::3,
// the kubelet's allocatable drops to 2 at once, and ::3 gives way to ::1 when
// its pod ends.
func computePlan(cfg dpconfig.Config, gpus []gpuInfo, heldIDs []held) plan {
	p := plan{Resources: map[string][]advertised{}, Replicas: map[string]int{}, GPUs: map[string]gpuInfo{}, MPS: map[string]string{}}
	sorted := slices.Clone(gpus)
	slices.SortFunc(sorted, func(a, b gpuInfo) int { return cmp.Compare(a.Index, b.Index) })
	for _, g := range sorted {
		p.GPUs[g.UUID] = g
	}
	desires, warnings := desires(cfg, sorted)
	var w string
	p.Inject, w = injectionOf(cfg)
	if w != "" {
		warnings = append(warnings, w)
	}
	p.Warnings = warnings

	byGPU := map[string][]held{}
	for _, h := range heldIDs {
		id, err := podresources.ParseDeviceID(h.ID)
		if err != nil {
			continue
		}
		if _, ok := p.GPUs[id.UUID]; ok {
			byGPU[id.UUID] = append(byGPU[id.UUID], h)
		}
	}

	for _, g := range sorted {
		d := desires[g.UUID]
		p.Replicas[g.UUID] = d.replicas
		if d.mps {
			p.MPS[g.UUID] = d.resource
		}
		wanted := map[string]bool{}
		for _, id := range d.ids {
			wanted[id] = true
		}
		isHeld := map[string]bool{}
		for _, h := range byGPU[g.UUID] {
			if isHeld[h.Resource+"\x00"+h.ID] {
				continue
			}
			isHeld[h.Resource+"\x00"+h.ID] = true
			draining := h.Resource != d.resource || !wanted[h.ID]
			p.add(h.Resource, g, h.ID, draining)
		}
		free := d.replicas - len(isHeld)
		for _, id := range d.ids {
			if free <= 0 {
				break
			}
			if !isHeld[d.resource+"\x00"+id] {
				p.add(d.resource, g, id, false)
				free--
			}
		}
	}
	for name, devs := range p.Resources {
		slices.SortFunc(devs, func(a, b advertised) int {
			return cmp.Or(cmp.Compare(p.GPUs[a.GPU].Index, p.GPUs[b.GPU].Index), cmp.Compare(a.Replica, b.Replica), cmp.Compare(a.ID, b.ID))
		})
		p.Resources[name] = devs
	}
	return p
}

func (p *plan) add(resource string, g gpuInfo, id string, draining bool) {
	replica := 0
	if d, err := podresources.ParseDeviceID(id); err == nil {
		replica = d.Replica
	}
	p.Resources[resource] = append(p.Resources[resource], advertised{
		ID: id, GPU: g.UUID, Replica: replica, Healthy: g.Healthy, Draining: draining,
	})
}

// desires maps every GPU to what the config asks of it. Only entries for
// nvidia.com/gpu apply: gpuslice-plugin does not handle MIG devices. The
// config has either time-slicing or MPS resources, never both (dpconfig
// refuses that), so a GPU is shared one way only.
//
// A MIG-enabled GPU is advertised whole only under migStrategy none, as
// NVIDIA's plugin does (v0.19 internal/rm/device_map.go): under single or
// mixed NVIDIA's plugin advertises its MIG devices instead and never the
// GPU itself, and CUDA in a container given a whole MIG-enabled GPU finds
// no device to run on. Advertising it would place pods that fail there;
// leaving it out places them on a node that can run them.
func desires(cfg dpconfig.Config, gpus []gpuInfo) (map[string]desire, []string) {
	var warnings []string
	out := make(map[string]desire, len(gpus))
	whole := make([]gpuInfo, 0, len(gpus))
	migWhole := cfg.MigStrategy == "" || cfg.MigStrategy == "none"
	if !migWhole {
		warnings = append(warnings, fmt.Sprintf("flags.migStrategy %q: gpuslice-plugin advertises no MIG devices; GPUs with MIG enabled are not advertised, the others are shared whole", cfg.MigStrategy))
	}
	for _, g := range gpus {
		switch {
		case !g.MIGEnabled:
		case migWhole:
			warnings = append(warnings, fmt.Sprintf("GPU %s has MIG enabled: advertised whole, as NVIDIA's plugin does under migStrategy none; CUDA finds no device on it in a container that is not given its MIG devices", g.UUID))
		default:
			warnings = append(warnings, fmt.Sprintf("GPU %s has MIG enabled: not advertised under migStrategy %q (its MIG devices are not shared by gpuslice-plugin)", g.UUID, cfg.MigStrategy))
			out[g.UUID] = desire{resource: dpconfig.GPUResource}
			continue
		}
		out[g.UUID] = desire{resource: dpconfig.GPUResource, replicas: 1, ids: []string{g.UUID}}
		whole = append(whole, g)
	}
	resources, mode, name := cfg.Resources, "time-slicing", cfg.AdvertisedName
	if cfg.MPS {
		resources, mode, name = cfg.MPSSharing.Resources, "MPS", cfg.MPSSharing.AdvertisedName
	}
	for _, r := range resources {
		if r.Name != dpconfig.GPUResource {
			warnings = append(warnings, fmt.Sprintf("%s resource %q ignored: gpuslice-plugin shares whole GPUs only (no MIG)", mode, r.Name))
			continue
		}
		if r.Replicas > maxReplicas {
			// applyConfig refuses such a config (checkSize); this keeps
			// computePlan safe on its own.
			warnings = append(warnings, fmt.Sprintf("%s resource %q ignored: %d replicas is above the limit of %d", mode, r.Name, r.Replicas, maxReplicas))
			continue
		}
		selected, w := selectGPUs(r.Devices, whole)
		warnings = append(warnings, w...)
		name := name(r)
		for _, g := range selected {
			ids := make([]string, r.Replicas)
			for i := range ids {
				ids[i] = podresources.FormatDeviceID(g.UUID, i)
			}
			out[g.UUID] = desire{resource: name, replicas: r.Replicas, ids: ids, mps: cfg.MPS}
		}
	}
	return out, warnings
}

// ErrTooManyDevices means a config asks for more device IDs than
// gpuslice-plugin advertises (maxReplicas, maxDevices).
var ErrTooManyDevices = errors.New("too many device IDs")

// The kubelet receives a resource's whole device list as one ListAndWatch
// message, through a gRPC client left at gRPC's default 4 MiB receive limit
// (kubelet v1.37.1 devicemanager/plugin/v1beta1/client.go sets none): a
// longer list fails the stream and the node advertises none of the
// resource. A device takes at most 61 bytes of that message (the longest
// ID below the cap, <uuid>::1023, listed "Unhealthy";
// TestDeviceListFitsOneMessage measures it), so:
//
//   - maxReplicas caps the replicas per GPU. Every ID of a GPU is then its
//     UUID or <uuid>::n with n below the cap, so a resource's list, with
//     IDs held above a lowered count and IDs still retiring
//     (Options.RetireAfter) included, never holds more than
//     GPUs × (maxReplicas+1) IDs, whatever configs came before: about
//     1 MiB on 16 GPUs. 1024 is far past any useful sharing: an 80 GB
//     GPU leaves 80 MB to each replica.
//   - maxDevices caps the IDs one config advertises under one resource on
//     this node, for nodes with more GPUs: under 1 MiB, so that the list
//     of a new config plus the IDs of the one before, retiring, stays
//     under half the limit.
//
// Without them a config crashed the plugin (replicas 2^63-1: make panics),
// or made it use gigabytes (replicas 1000000 on 8 GPUs: about 4.4 GiB), or
// advertise nothing (replicas 10000 on 8 GPUs: a 4.7 MB message).
const (
	maxReplicas = 1024
	maxDevices  = 16384
)

// checkSize returns an error wrapping ErrTooManyDevices when cfg asks for
// more than maxReplicas IDs on a GPU, or more than maxDevices IDs under one
// resource on these GPUs. GPUs found later are checked again when the plan
// is made (recomputeLocked).
func checkSize(cfg dpconfig.Config, gpus []gpuInfo) error {
	resources, path, name := cfg.Resources, "sharing.timeSlicing.resources", cfg.AdvertisedName
	if cfg.MPS {
		resources, path, name = cfg.MPSSharing.Resources, "sharing.mps.resources", cfg.MPSSharing.AdvertisedName
	}
	for i, r := range resources {
		if r.Name == dpconfig.GPUResource && r.Replicas > maxReplicas {
			return fmt.Errorf("%s[%d].replicas: %d for resource %q is above gpuslice-plugin's limit of %d per GPU: %w",
				path, i, r.Replicas, name(r), maxReplicas, ErrTooManyDevices)
		}
	}
	sorted := slices.Clone(gpus)
	slices.SortFunc(sorted, func(a, b gpuInfo) int { return cmp.Compare(a.Index, b.Index) })
	d, _ := desires(cfg, sorted)
	count := map[string]int{}
	for _, g := range sorted {
		count[d[g.UUID].resource] += d[g.UUID].replicas
	}
	for i, r := range resources {
		if r.Name != dpconfig.GPUResource {
			continue
		}
		if n := count[name(r)]; n > maxDevices {
			return fmt.Errorf("%s[%d].replicas: %d on this node's %d GPUs gives resource %q %d device IDs, above gpuslice-plugin's limit of %d: %w",
				path, i, r.Replicas, len(gpus), name(r), n, maxDevices, ErrTooManyDevices)
		}
	}
	return nil
}

// selectGPUs applies a "devices" selection to the GPUs (sorted by index).
// Where NVIDIA's plugin would refuse to start (a count above the number of
// GPUs, a UUID not on this node) it selects what it can and warns: one
// config often serves many nodes.
func selectGPUs(d dpconfig.Devices, gpus []gpuInfo) ([]gpuInfo, []string) {
	switch {
	case d.All:
		return gpus, nil
	case d.Count > 0:
		if d.Count > len(gpus) {
			return gpus, []string{fmt.Sprintf("devices: %d requested but this node has %d GPUs; sharing all of them", d.Count, len(gpus))}
		}
		return gpus[:d.Count], nil
	}
	var out []gpuInfo
	var warnings []string
	seen := map[string]bool{}
	for _, ref := range d.List {
		i := slices.IndexFunc(gpus, func(g gpuInfo) bool { return g.UUID == ref || strconv.Itoa(g.Index) == ref })
		if i < 0 {
			warnings = append(warnings, fmt.Sprintf("devices: %q matches no whole GPU on this node; ignored", ref))
			continue
		}
		if !seen[gpus[i].UUID] {
			seen[gpus[i].UUID] = true
			out = append(out, gpus[i])
		}
	}
	return out, warnings
}

// apiDevices converts a resource's list for ListAndWatch.
func apiDevices(devs []advertised) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(devs))
	for i, d := range devs {
		health := pluginapi.Healthy
		if !d.Healthy {
			health = pluginapi.Unhealthy
		}
		out[i] = &pluginapi.Device{ID: d.ID, Health: health}
	}
	return out
}

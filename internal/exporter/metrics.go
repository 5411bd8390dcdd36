package exporter

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/internal/attribution"
	"github.com/gpuslice/gpuslice/internal/gpu"
)

const ns = "gpuslice"

var (
	gpuLabels       = []string{"gpu", "uuid"}
	containerLabels = []string{"namespace", "pod", "container", "gpu", "uuid"}
	migLabels       = []string{"gpu", "uuid", "mig_uuid"}

	gpuInfo = gauge(ns+"_gpu_info",
		"Information about a GPU; always 1.", []string{"gpu", "uuid", "name", "driver_version"})
	gpuMemTotal = gauge(ns+"_gpu_memory_total_bytes",
		"Total memory of the GPU.", gpuLabels)
	gpuMemUsed = gauge(ns+"_gpu_memory_used_bytes",
		"Memory in use on the GPU, by any process.", gpuLabels)
	gpuUtil = gauge(ns+"_gpu_utilization_ratio",
		"Share of the time since the previous reading during which a kernel ran on the GPU (0..1); the driver's last sample period on a GPU that keeps no samples.", gpuLabels)
	gpuTemp = gauge(ns+"_gpu_temperature_celsius",
		"GPU core temperature.", gpuLabels)
	gpuPower = gauge(ns+"_gpu_power_watts",
		"GPU power draw.", gpuLabels)
	gpuXid = counter(ns+"_gpu_xid_errors_total",
		"Xid error events reported by the driver since the exporter started.", []string{"gpu", "uuid", "xid"})
	gpuReplicas = gauge(ns+"_gpu_replicas",
		"Replica IDs of the GPU that the kubelet can allocate, per resource (1 for an unshared GPU).", []string{"gpu", "uuid", "resource"})
	gpuReplicasAllocated = gauge(ns+"_gpu_replicas_allocated",
		"Replica IDs of the GPU allocated to containers, per resource.", []string{"gpu", "uuid", "resource"})
	containerAlloc = gauge(ns+"_container_gpu_allocation",
		"Replica IDs of the GPU that the container holds.", []string{"namespace", "pod", "container", "gpu", "uuid", "resource"})
	containerMem = gauge(ns+"_container_gpu_memory_used_bytes",
		"GPU memory used by the container's processes on this physical GPU, counted once however many replica IDs it holds.", containerLabels)
	containerUtil = gauge(ns+"_container_gpu_utilization_ratio",
		"Share of the GPU's SMs the container's processes kept busy since the previous reading, over the window of gpuslice_gpu_utilization_ratio (0..1); a GPU's containers add up to no more than it.", containerLabels)
	containerProcs = gauge(ns+"_container_gpu_processes",
		"Processes of the container with a context on the GPU.", containerLabels)
	containerIdle = gauge(ns+"_container_gpu_idle_seconds",
		"Time since the container, which holds replica IDs of the GPU, last had a process there that ran a kernel (0 while it does); counted from when this exporter first saw it hold the GPU.", containerLabels)
	containerEnergy = counter(ns+"_container_gpu_energy_joules_total",
		"Estimated GPU energy of the container: the GPU's energy between two scrapes (mean power × time) apportioned by the container's share of SM utilization over that time. An estimate: time-slicing gives no per-process power.", containerLabels)
	unattributedEnergy = counter(ns+"_unattributed_gpu_energy_joules_total",
		"Estimated GPU energy not apportioned to any container: idle power, processes outside pods, processes without an SM figure, and a container's first interval (its counter starts at 0). With the containers' counters it adds up to the GPU's estimated energy.", gpuLabels)
	unattributedMem = gauge(ns+"_unattributed_gpu_memory_used_bytes",
		"GPU memory used by processes that belong to no known pod container (host processes, pods not known yet).", gpuLabels)
	oomEvents = counter(ns+"_gpu_oom_events_total",
		"GPU out-of-memory failures of a container, from its log or its termination status, each failure counted once, by what ran out: kind device (the GPU's memory), process-cap (a limit of the process's own: a framework's memory fraction or budget, a CUDA MPS client's pinned limit), encoder-session (NVENC) or unknown (an --oom.pattern outside the catalogue).",
		[]string{"namespace", "pod", "container", "gpu", "uuid", "source", "kind"})
	// MIG devices (docs/mig.md): each MIG device of a MIG-enabled GPU, its
	// own memory, and the containers holding and using it. The GPU-level
	// series above keep counting MIG allocations and memory on the GPU.
	migInfo = gauge(ns+"_mig_info",
		"Information about a MIG device of a MIG-enabled GPU; always 1.",
		[]string{"gpu", "uuid", "mig_uuid", "name", "gpu_instance", "compute_instance"})
	migMemTotal = gauge(ns+"_mig_memory_total_bytes",
		"Memory of the MIG device's GPU instance, its hardware share of the GPU's.", migLabels)
	migMemUsed = gauge(ns+"_mig_memory_used_bytes",
		"Memory in use in the MIG device's GPU instance, by any process.", migLabels)
	containerMIGAlloc = gauge(ns+"_container_mig_allocation",
		"Replica IDs of the MIG device that the container holds (1 for a MIG device that is not time-sliced); the resource is on gpuslice_container_gpu_allocation.",
		[]string{"namespace", "pod", "container", "gpu", "uuid", "mig_uuid"})
	containerMIGMem = gauge(ns+"_container_mig_memory_used_bytes",
		"GPU memory used by the container's processes in the MIG device's instance.",
		[]string{"namespace", "pod", "container", "gpu", "uuid", "mig_uuid"})
	collectDuration = gauge(ns+"_exporter_collect_duration_seconds",
		"Time the collector took in the last scrape.", []string{"collector"})
	collectSuccess = gauge(ns+"_exporter_collect_success",
		"1 when the collector read everything in the last scrape, 0 when part or all of it failed.", []string{"collector"})
)

// emitter records one scrape's series in the exporter's series set.
type emitter struct{ set *seriesSet }

func (e emitter) gauge(f *family, v float64, labels ...string) {
	e.set.set(f, prometheus.GaugeValue, v, labels...)
}

func (e emitter) counter(f *family, v float64, labels ...string) {
	e.set.set(f, prometheus.CounterValue, v, labels...)
}

func emitDevices(em emitter, s gpu.Snapshot) {
	for _, d := range s.Devices {
		idx := strconv.Itoa(d.Index)
		em.gauge(gpuInfo, 1, idx, d.UUID, d.Name, s.DriverVersion)
		em.gauge(gpuMemTotal, float64(d.MemoryTotalBytes), idx, d.UUID)
		em.gauge(gpuMemUsed, float64(d.MemoryUsedBytes), idx, d.UUID)
		// A reading the GPU did not give has no series: a 0 would be read
		// as an idle GPU or a card drawing no power.
		if !d.Missing.Has(gpu.ReadingUtilization) {
			em.gauge(gpuUtil, d.Utilization, idx, d.UUID)
		}
		if !d.Missing.Has(gpu.ReadingTemperature) {
			em.gauge(gpuTemp, d.TemperatureCelsius, idx, d.UUID)
		}
		if !d.Missing.Has(gpu.ReadingPower) {
			em.gauge(gpuPower, d.PowerWatts, idx, d.UUID)
		}
		for _, m := range d.MIGDevices {
			em.gauge(migInfo, 1, idx, d.UUID, m.UUID, m.Name, strconv.Itoa(m.GPUInstanceID), strconv.Itoa(m.ComputeInstanceID))
			if m.HasMemory {
				em.gauge(migMemTotal, float64(m.MemoryTotalBytes), idx, d.UUID, m.UUID)
				em.gauge(migMemUsed, float64(m.MemoryUsedBytes), idx, d.UUID, m.UUID)
			}
		}
	}
}

// AlertedXids are the Xids whose counters exist at 0 on every GPU the
// exporter reads. A counter born at its first event has no earlier sample,
// so Prometheus' increase() misses that event; these are the ones the
// GPUSliceXidCritical alert and the dashboards' Xid bars must not miss:
// NVIDIA's hardware and driver Xids (48 double-bit ECC, 63/64 ECC page
// retirement and row remapping, 74 NVLink, 79 fallen off the bus, 92 high
// single-bit ECC rate, 94/95 contained and uncontained ECC, 119/120 GSP).
// None is in the alert's list of application Xids; a test checks that.
var AlertedXids = []uint64{48, 63, 64, 74, 79, 92, 94, 95, 119, 120}

// emitXids sends the Xid counts, and 0 for each AlertedXids entry a device
// has not reported.
func emitXids(em emitter, devices []gpu.Device, xids []gpu.XidCount) {
	type key struct {
		uuid string
		xid  uint64
	}
	counted := make(map[key]bool, len(xids))
	for _, x := range xids {
		counted[key{x.UUID, x.Xid}] = true
		em.counter(gpuXid, float64(x.Count), strconv.Itoa(x.Index), x.UUID, strconv.FormatUint(x.Xid, 10))
	}
	for _, d := range devices {
		for _, xid := range AlertedXids {
			if !counted[key{d.UUID, xid}] {
				em.counter(gpuXid, 0, strconv.Itoa(d.Index), d.UUID, strconv.FormatUint(xid, 10))
			}
		}
	}
}

func emitAttribution(em emitter, r attribution.Result, index map[string]string) {
	for k, n := range r.Replicas {
		em.gauge(gpuReplicas, float64(n), index[k.UUID], k.UUID, k.Resource)
	}
	// A GPU with advertised replicas and no allocation reports 0, so the
	// dashboards can show "0 of 4 used" rather than no data.
	for k := range r.Replicas {
		if _, ok := r.Allocated[k]; !ok {
			em.gauge(gpuReplicasAllocated, 0, index[k.UUID], k.UUID, k.Resource)
		}
	}
	for k, n := range r.Allocated {
		em.gauge(gpuReplicasAllocated, float64(n), index[k.UUID], k.UUID, k.Resource)
	}
	for _, h := range r.Holdings {
		em.gauge(containerAlloc, float64(h.IDs), h.Namespace, h.Pod, h.Container.Container, index[h.UUID], h.UUID, h.Resource)
	}
	for i := range r.Usage {
		u := &r.Usage[i]
		idx := strconv.Itoa(u.GPUIndex)
		// A lower bound read as the figure would undercount the pod to
		// the tuner and the dashboards alike: no series says "unknown".
		if !u.MemoryUnknown {
			em.gauge(containerMem, float64(u.MemoryBytes), u.Namespace, u.Pod, u.Container.Container, idx, u.UUID)
		}
		em.gauge(containerProcs, float64(u.Processes), u.Namespace, u.Pod, u.Container.Container, idx, u.UUID)
		if u.HasSM {
			em.gauge(containerUtil, u.SMUtilization, u.Namespace, u.Pod, u.Container.Container, idx, u.UUID)
		}
	}
	for uuid, b := range r.Unattributed {
		if !r.UnattributedUnknown[uuid] {
			em.gauge(unattributedMem, float64(b), index[uuid], uuid)
		}
	}
	for _, h := range r.MIGHoldings {
		em.gauge(containerMIGAlloc, float64(h.IDs), h.Namespace, h.Pod, h.Container.Container, index[h.UUID], h.UUID, h.MIGUUID)
	}
	for _, u := range r.MIGUsage {
		if u.MemoryUnknown {
			continue
		}
		em.gauge(containerMIGMem, float64(u.MemoryBytes), u.Namespace, u.Pod, u.Container.Container, strconv.Itoa(u.GPUIndex), u.UUID, u.MIGUUID)
	}
}

package plugin

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	replicasDesc = prometheus.NewDesc("gpuslice_plugin_replicas",
		"Device IDs the plugin advertises, per resource and GPU (replicas of a shared GPU, 1 for an exclusive one, more while IDs above a lowered count are still in use).",
		[]string{"resource", "uuid"}, nil)
	unhealthyDesc = prometheus.NewDesc("gpuslice_plugin_unhealthy_gpus",
		"GPUs whose device IDs are advertised as unhealthy (critical Xid, failed or missing reading, within the recovery interval).",
		nil, nil)
	mpsLimitDesc = prometheus.NewDesc("gpuslice_plugin_mps_memory_limit_bytes",
		"Pinned device-memory limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) a container allocated now gets on a GPU shared through MPS: the GPU's memory / replicas, in whole MiB.",
		[]string{"resource", "uuid"}, nil)
	mpsStaleDesc = prometheus.NewDesc("gpuslice_plugin_mps_stale_limit_devices",
		"Device IDs in use on a GPU shared through MPS whose container started with another limit than gpuslice_plugin_mps_memory_limit_bytes (the replica count changed since): an MPS client keeps the limit it started with. Counts the allocations this plugin process made.",
		[]string{"resource", "uuid"}, nil)
)

// metrics is the plugin's collector: counters it owns, and gauges read from
// the current plan when scraped.
type metrics struct {
	p              *Plugin
	reloads        prometheus.Counter
	reloadFailures prometheus.Counter
	// configValid is what an alert can hold on to: the failure counter
	// stops growing while a rejected config stays in place.
	configValid prometheus.Gauge
	allocations *prometheus.CounterVec
}

func newMetrics(p *Plugin) *metrics {
	return &metrics{
		p: p,
		reloads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuslice_plugin_reloads_total",
			Help: "Device-plugin configs applied (the first one included).",
		}),
		reloadFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuslice_plugin_reload_failures_total",
			Help: "Device-plugin configs rejected (invalid, unsupported or unreadable); the last good one stays.",
		}),
		configValid: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuslice_plugin_config_valid",
			Help: "1 when the last device-plugin config read passed validation and is in use; 0 while a rejected (invalid, unsupported or unreadable) config is ignored and the last good one stays, and before any config is read.",
		}),
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuslice_plugin_allocations_total",
			Help: "Containers given devices by Allocate, per resource.",
		}, []string{"resource"}),
	}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- replicasDesc
	ch <- unhealthyDesc
	ch <- mpsLimitDesc
	ch <- mpsStaleDesc
	m.reloads.Describe(ch)
	m.reloadFailures.Describe(ch)
	m.configValid.Describe(ch)
	m.allocations.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.p.mu.Lock()
	pl := m.p.plan
	unhealthy := m.p.health.unhealthy()
	mps := m.p.mpsSeriesLocked()
	m.p.mu.Unlock()
	for _, s := range mps {
		ch <- prometheus.MustNewConstMetric(mpsLimitDesc, prometheus.GaugeValue, float64(s.limit), s.resource, s.uuid)
		ch <- prometheus.MustNewConstMetric(mpsStaleDesc, prometheus.GaugeValue, float64(s.stale), s.resource, s.uuid)
	}
	for resource, devs := range pl.Resources {
		perGPU := map[string]int{}
		for _, d := range devs {
			perGPU[d.GPU]++
		}
		for uuid, n := range perGPU {
			ch <- prometheus.MustNewConstMetric(replicasDesc, prometheus.GaugeValue, float64(n), resource, uuid)
		}
	}
	ch <- prometheus.MustNewConstMetric(unhealthyDesc, prometheus.GaugeValue, float64(unhealthy))
	m.reloads.Collect(ch)
	m.reloadFailures.Collect(ch)
	m.configValid.Collect(ch)
	m.allocations.Collect(ch)
}

// Package metricnames holds the metric names that gpuslice's programs export
// (the contract in DESIGN.md) and a PromQL scanner that finds the metric names
// an expression reads. Dashboards and alert rules are checked against it, so a
// panel or rule that queries a metric nobody exports fails a test instead of
// showing "No data" in production.
//
// When a program adds or renames a metric, change the list here in the same
// commit as DESIGN.md, the dashboards and the rules.
package metricnames

import "slices"

// Exporter lists the metrics gpuslice-exporter serves (DESIGN.md, "Exporter
// contract").
var Exporter = []string{
	"gpuslice_gpu_info",
	"gpuslice_gpu_memory_total_bytes",
	"gpuslice_gpu_memory_used_bytes",
	"gpuslice_gpu_utilization_ratio",
	"gpuslice_gpu_temperature_celsius",
	"gpuslice_gpu_power_watts",
	"gpuslice_gpu_xid_errors_total",
	"gpuslice_gpu_replicas",
	"gpuslice_gpu_replicas_allocated",
	"gpuslice_container_gpu_allocation",
	"gpuslice_container_gpu_memory_used_bytes",
	"gpuslice_container_gpu_utilization_ratio",
	"gpuslice_container_gpu_processes",
	"gpuslice_container_gpu_idle_seconds",
	"gpuslice_container_gpu_energy_joules_total",
	"gpuslice_unattributed_gpu_energy_joules_total",
	"gpuslice_unattributed_gpu_memory_used_bytes",
	"gpuslice_gpu_oom_events_total",
	"gpuslice_exporter_collect_duration_seconds",
	"gpuslice_exporter_collect_success",
}

// ExporterMIG lists the metrics gpuslice-exporter serves only on a node
// with MIG-enabled GPUs (docs/mig.md); beyond DESIGN.md.
var ExporterMIG = []string{
	"gpuslice_mig_info",
	"gpuslice_mig_memory_total_bytes",
	"gpuslice_mig_memory_used_bytes",
	"gpuslice_container_mig_allocation",
	"gpuslice_container_mig_memory_used_bytes",
}

// ExporterMPS lists the metrics gpuslice-exporter serves only for GPUs
// shared through CUDA MPS (docs/mps.md); beyond DESIGN.md.
var ExporterMPS = []string{
	"gpuslice_gpu_mps_server_memory_used_bytes",
	"gpuslice_container_gpu_memory_limit_bytes",
}

// Tuner lists the metrics gpuslice-tuner serves (DESIGN.md, "Tuner metrics").
var Tuner = []string{
	"gpuslice_tuner_replicas",
	"gpuslice_tuner_recommended_replicas",
	"gpuslice_tuner_changes_total",
	"gpuslice_tuner_apply_failures_total",
	"gpuslice_tuner_verify_failures_total",
	"gpuslice_tuner_last_change_timestamp_seconds",
	"gpuslice_tuner_leader",
	// Beyond DESIGN.md: set while a node's config does not parse.
	"gpuslice_tuner_config_invalid",
	// Beyond DESIGN.md: what was done about crash-looping pods.
	"gpuslice_tuner_crash_loop_evictions_total",
	// Beyond DESIGN.md: on nodes whose GPUs DRA manages, the memory each
	// container should request (docs/dra.md).
	"gpuslice_tuner_recommended_memory_request_bytes",
	// Beyond DESIGN.md: the leader's rounds (docs/tuner.md, "What it
	// records"): failed ones, and when the last one succeeded.
	"gpuslice_tuner_round_failures_total",
	"gpuslice_tuner_last_successful_round_timestamp_seconds",
}

// Plugin lists the metrics gpuslice-plugin serves (DESIGN.md, "Plugin
// metrics").
var Plugin = []string{
	"gpuslice_plugin_replicas",
	"gpuslice_plugin_reloads_total",
	"gpuslice_plugin_reload_failures_total",
	"gpuslice_plugin_allocations_total",
	"gpuslice_plugin_unhealthy_gpus",
	// Beyond DESIGN.md: 0 while a rejected config is ignored.
	"gpuslice_plugin_config_valid",
}

// PluginMPS lists the metrics gpuslice-plugin serves only for GPUs shared
// through CUDA MPS (docs/mps.md); beyond DESIGN.md.
var PluginMPS = []string{
	"gpuslice_plugin_mps_memory_limit_bytes",
	"gpuslice_plugin_mps_stale_limit_devices",
}

// Scrape lists the series Prometheus itself writes for every scrape target;
// rules about a target being down read them.
var Scrape = []string{
	"up",
	"scrape_duration_seconds",
	"scrape_samples_scraped",
	"scrape_samples_post_metric_relabeling",
	"scrape_series_added",
}

// Process lists the process metrics every gpuslice program serves
// (internal/procmetrics, under client_golang's names) that a rule reads:
// the alerts tell an exporter restarted under the same instance by its
// start time.
var Process = []string{"process_start_time_seconds"}

// Prometheus lists series the Prometheus server writes itself, not per
// target: the alerts' state, which the dashboards show.
var Prometheus = []string{"ALERTS"}

// Known reports whether name is a metric that one of gpuslice's programs, or
// Prometheus for each of their scrape targets, produces.
func Known(name string) bool {
	return slices.Contains(Exporter, name) || slices.Contains(ExporterMIG, name) || slices.Contains(ExporterMPS, name) ||
		slices.Contains(Tuner, name) || slices.Contains(Plugin, name) || slices.Contains(PluginMPS, name) || slices.Contains(Scrape, name) ||
		slices.Contains(Process, name) || slices.Contains(Prometheus, name)
}

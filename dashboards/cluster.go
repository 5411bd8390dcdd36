package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/bargauge"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/units"
)

// Cluster builds "GPU sharing — cluster": how many GPUs and replica slots the
// cluster has, how full they are, where CUDA OOMs happen and what the tuner
// changed.
func Cluster() (dashboard.Dashboard, error) {
	b := newDashboard(clusterUID, "GPU sharing — cluster",
		"Time-sliced GPUs across the cluster: replica slots advertised and allocated, GPU memory, CUDA OOMs and gpuslice-tuner's decisions.",
		true)

	// Health first: whether the data below can be trusted, and what is
	// wrong now. up is the scrape's own series, so a target that is down
	// still counts here while its metrics are gone.
	b.WithRow(dashboard.NewRowBuilder("Health")).
		WithPanel(statPanel("Exporters up", "gpuslice-exporter targets Prometheus scraped at the last attempt, of all it knows. Fewer: see GPUSliceExporterDown; none at all: GPUSliceExporterAbsent.", units.Number,
			`sum(up{job=~".*gpuslice-exporter.*", `+nodeSel+`}) or vector(0)`).
			WithTarget(target("B", `count(up{job=~".*gpuslice-exporter.*", `+nodeSel+`})`, "targets")).
			Decimals(0).
			Thresholds(thresholds(step(nil, "red"), step(cog.ToPtr(1.0), "green")))).
		WithPanel(statPanel("Tuner and plugins up", "gpuslice-tuner and gpuslice-plugin targets Prometheus scraped at the last attempt.", units.Number,
			`sum by (job) (up{job=~".*gpuslice-(tuner|plugin).*"})`).
			Decimals(0)).
		WithPanel(statPanel("Critical Xids", "Xid errors that point at the GPU (not the application's 13, 31, 43, 45, 68, 109) in the dashboard's time range.", units.Number,
			`sum(`+xidEvents(`xid!~"13|31|43|45|68|109", `+gpuSel, "$__range")+`) or vector(0)`).
			Decimals(0).
			Thresholds(thresholds(step(nil, "green"), step(cog.ToPtr(1.0), "red")))).
		WithPanel(statPanel("Unhealthy GPUs", "GPUs the device plugins have marked unhealthy: the kubelet allocates none of their replicas.", units.Number,
			`sum(gpuslice_plugin_unhealthy_gpus{`+nodeSel+`}) or vector(0)`).
			Decimals(0).
			Thresholds(thresholds(step(nil, "green"), step(cog.ToPtr(1.0), "red")))).
		// or on (): the 0 only when nothing fires; a plain or would add it
		// beside every severity's count, its labels never matching theirs.
		WithPanel(statPanel("Firing alerts", "gpuslice alerts firing now, by severity. Each has a section in the alert runbook (link at the top).", units.Number,
			`sum by (severity) (ALERTS{alertname=~"GPUSlice.*", alertstate="firing"}) or on () vector(0)`).
			Decimals(0).
			Thresholds(thresholds(step(nil, "green"), step(cog.ToPtr(1.0), "orange")))).
		WithPanel(tablePanel("Firing gpuslice alerts", "Alerts firing now, with their node and severity; see the alert runbook.", 4, 4,
			`sum by (alertname, severity, node) (ALERTS{alertname=~"GPUSlice.*", alertstate="firing"})`,
			[]string{"Value"},
			[]column{{"alertname", "Alert"}, {"severity", "Severity"}, {"node", "Node"}}))

	b.WithRow(dashboard.NewRowBuilder("Overview")).
		WithPanel(statPanel("GPUs", "Physical GPUs reported by gpuslice-exporter.", units.Number,
			`count(gpuslice_gpu_info{`+gpuSel+`})`)).
		WithPanel(statPanel("Replicas advertised", "Replica slots the device plugins advertise to the scheduler, summed over GPUs.", units.Number,
			`sum(gpuslice_gpu_replicas{`+gpuSel+`})`)).
		WithPanel(statPanel("Replicas allocated", "Replica slots held by pods.", units.Number,
			`sum(gpuslice_gpu_replicas_allocated{`+gpuSel+`})`)).
		WithPanel(statPanel("GPU memory used", "Memory in use over memory installed, all selected GPUs.", units.PercentUnit,
			`sum(gpuslice_gpu_memory_used_bytes{`+gpuSel+`}) / sum(gpuslice_gpu_memory_total_bytes{`+gpuSel+`})`).
			Thresholds(thresholds(step(nil, "green"), step(cog.ToPtr(0.8), "orange"), step(cog.ToPtr(0.95), "red")))).
		WithPanel(statPanel("CUDA OOMs", "Out-of-memory events in pods over the dashboard's time range.", units.Number,
			`sum(`+oomEvents(podSel, "$__range")+`)`).
			Decimals(0).
			Thresholds(thresholds(step(nil, "green"), step(cog.ToPtr(1.0), "red")))).
		WithPanel(statPanel("Tuner changes", "Replica changes gpuslice-tuner made over the dashboard's time range.", units.Number,
			`sum(increase(gpuslice_tuner_changes_total{`+nodeSel+`}[$__range]))`).
			Decimals(0))

	b.WithRow(dashboard.NewRowBuilder("Nodes")).
		WithPanel(versus("Replicas advertised vs allocated per node",
			"Dashed: slots the node advertises. Solid: slots held by pods. When they meet, new GPU pods stay Pending.",
			units.Number, 9, 12,
			`sum by (node) (gpuslice_gpu_replicas_allocated{`+gpuSel+`})`, "{{node}} allocated",
			`sum by (node) (gpuslice_gpu_replicas{`+gpuSel+`})`, "{{node}} advertised").
			Decimals(0).
			LineInterpolation(common.LineInterpolationStepAfter)).
		WithPanel(versus("GPU memory used vs total per node",
			"Dashed: memory installed. Solid: memory in use by every process on the node's GPUs.",
			units.BytesIEC, 9, 12,
			`sum by (node) (gpuslice_gpu_memory_used_bytes{`+gpuSel+`})`, "{{node}} used",
			`sum by (node) (gpuslice_gpu_memory_total_bytes{`+gpuSel+`})`, "{{node}} total").
			Min(0)).
		WithPanel(bargauge.NewPanelBuilder().
			Title("GPU memory used per GPU").
			Description("Share of each GPU's memory in use now.").
			Datasource(datasource()).
			Unit(units.PercentUnit).
			Min(0).
			Max(1).
			Height(8).
			Span(12).
			DisplayMode(common.BarGaugeDisplayModeGradient).
			Orientation(common.VizOrientationHorizontal).
			Thresholds(thresholds(step(nil, "green"), step(cog.ToPtr(0.8), "orange"), step(cog.ToPtr(0.95), "red"))).
			WithTarget(target("A",
				`sum by (node, gpu, uuid) (gpuslice_gpu_memory_used_bytes{`+gpuSel+`}) / sum by (node, gpu, uuid) (gpuslice_gpu_memory_total_bytes{`+gpuSel+`})`,
				"{{node}} GPU {{gpu}}").Instant())).
		WithPanel(tablePanel("GPU inventory", "Every GPU the exporters see, with its model and driver.", 8, 12,
			`max by (node, gpu, uuid, name, driver_version) (gpuslice_gpu_info{`+gpuSel+`})`,
			[]string{"Value"},
			[]column{{"node", "Node"}, {"gpu", "GPU"}, {"uuid", "UUID"}, {"name", "Model"}, {"driver_version", "Driver"}}))

	b.WithRow(dashboard.NewRowBuilder("CUDA out of memory")).
		WithPanel(bars("CUDA OOMs per node", "Out-of-memory events in pods, per interval.", 8, 12).
			WithTarget(target("A", `sum by (node) `+oomEvents(podSel, "$__rate_interval"), "{{node}}"))).
		WithPanel(tablePanel("CUDA OOMs by pod", "Pods that ran out of GPU memory in the dashboard's time range, by kind: device (the GPU was full), process-cap (a limit of the pod's own, such as its CUDA MPS pinned limit), encoder-session (NVENC), unknown.", 8, 12,
			`sort_desc(sum by (node, namespace, pod, container, kind) `+oomEvents(podSel, "$__range")+` > 0)`,
			nil,
			[]column{{"node", "Node"}, {"namespace", "Namespace"}, {"pod", "Pod"}, {"container", "Container"}, {"kind", "Kind"}, {"Value", "OOM events"}}))

	b.WithRow(dashboard.NewRowBuilder("Tuner")).
		WithPanel(versus("Replicas: recommended vs current",
			"Dashed: what gpuslice-tuner recommends from the measured memory. Solid: what the node runs with.",
			units.Number, 9, 12,
			leaderOnly(`gpuslice_tuner_replicas{`+nodeSel+`}`), "{{node}} {{resource}} current",
			leaderOnly(`gpuslice_tuner_recommended_replicas{`+nodeSel+`}`), "{{node}} {{resource}} recommended").
			Decimals(0).
			LineInterpolation(common.LineInterpolationStepAfter)).
		WithPanel(bars("Tuner changes", "Replica changes per interval, by direction.", 9, 12).
			WithTarget(target("A", `sum by (node, direction) (increase(gpuslice_tuner_changes_total{`+nodeSel+`}[$__rate_interval]))`, "{{node}} {{direction}}"))).
		WithPanel(bars("Tuner failures", "Failed attempts to apply a replica count, and applied counts the node did not take up.", 8, 16).
			WithTarget(target("A", `sum by (node) (increase(gpuslice_tuner_apply_failures_total{`+nodeSel+`}[$__rate_interval]))`, "{{node}} apply")).
			WithTarget(target("B", `sum by (node) (increase(gpuslice_tuner_verify_failures_total{`+nodeSel+`}[$__rate_interval]))`, "{{node}} verify"))).
		WithPanel(statPanel("Tuner leaders", "gpuslice-tuner replicas holding the leader lease; anything but 1 needs a look.", units.Number,
			`sum(gpuslice_tuner_leader)`).
			Height(8).
			Span(8).
			Thresholds(thresholds(step(nil, "red"), step(cog.ToPtr(1.0), "green"), step(cog.ToPtr(2.0), "red"))))

	b.WithRow(dashboard.NewRowBuilder("Device plugin")).
		WithPanel(timeSeries("gpuslice-plugin replicas per node", "Replica slots gpuslice-plugin advertises, summed over each node's GPUs. Not drawn when NVIDIA's plugin serves the node.", units.Number, 8, 8).
			Min(0).
			Decimals(0).
			LineInterpolation(common.LineInterpolationStepAfter).
			WithTarget(target("A", `sum by (node, resource) (max by (node, resource, uuid) (gpuslice_plugin_replicas{`+nodeSel+`}))`, "{{node}} {{resource}}"))).
		WithPanel(bars("Config reloads", "Configs gpuslice-plugin accepted and rejected, per interval. A rejected one leaves the previous replica count in place (alert GPUSlicePluginReloadFailing).", 8, 8).
			WithTarget(target("A", `sum by (node) (increase(gpuslice_plugin_reloads_total{`+nodeSel+`}[$__rate_interval]))`, "{{node}} accepted")).
			WithTarget(target("B", `sum by (node) (increase(gpuslice_plugin_reload_failures_total{`+nodeSel+`}[$__rate_interval]))`, "{{node}} rejected"))).
		WithPanel(timeSeries("Plugin health", "Per node: GPUs marked unhealthy (kubelet allocates none of their replicas), and 0 while the plugin ignores a rejected config.", units.Number, 8, 8).
			Min(0).
			Decimals(0).
			LineInterpolation(common.LineInterpolationStepAfter).
			WithTarget(target("A", `max by (node) (gpuslice_plugin_unhealthy_gpus{`+nodeSel+`})`, "{{node}} unhealthy GPUs")).
			WithTarget(target("B", `min by (node) (gpuslice_plugin_config_valid{`+nodeSel+`})`, "{{node}} config valid"))).
		WithPanel(bars("Allocations", "Replica slots the kubelet allocated through gpuslice-plugin, per interval.", 8, 24).
			WithTarget(target("A", `sum by (node, resource) (increase(gpuslice_plugin_allocations_total{`+nodeSel+`}[$__rate_interval]))`, "{{node}} {{resource}}")))

	b.WithRow(dashboard.NewRowBuilder("Exporters")).
		WithPanel(timeSeries("Collector success", "1 when a collector of gpuslice-exporter succeeded at the last scrape.", units.Number, 8, 12).
			Min(0).
			Max(1).
			LineInterpolation(common.LineInterpolationStepAfter).
			WithTarget(target("A", `min by (node, collector) (gpuslice_exporter_collect_success{`+nodeSel+`})`, "{{node}} {{collector}}"))).
		WithPanel(timeSeries("Collector duration", "Time each collector of gpuslice-exporter took at the last scrape.", units.Seconds, 8, 12).
			Min(0).
			WithTarget(target("A", `max by (node, collector) (gpuslice_exporter_collect_duration_seconds{`+nodeSel+`})`, "{{node}} {{collector}}")))

	return build(b)
}

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
			`sum(increase(gpuslice_gpu_oom_events_total{`+podSel+`}[$__range]))`).
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
			WithTarget(target("A", `sum by (node) (increase(gpuslice_gpu_oom_events_total{`+podSel+`}[$__rate_interval]))`, "{{node}}"))).
		WithPanel(tablePanel("CUDA OOMs by pod", "Pods that ran out of GPU memory in the dashboard's time range.", 8, 12,
			`sort_desc(sum by (node, namespace, pod, container) (increase(gpuslice_gpu_oom_events_total{`+podSel+`}[$__range])) > 0)`,
			nil,
			[]column{{"node", "Node"}, {"namespace", "Namespace"}, {"pod", "Pod"}, {"container", "Container"}, {"Value", "OOM events"}}))

	b.WithRow(dashboard.NewRowBuilder("Tuner")).
		WithPanel(versus("Replicas: recommended vs current",
			"Dashed: what gpuslice-tuner recommends from the measured memory. Solid: what the node runs with.",
			units.Number, 9, 12,
			`gpuslice_tuner_replicas{`+nodeSel+`}`, "{{node}} {{resource}} current",
			`gpuslice_tuner_recommended_replicas{`+nodeSel+`}`, "{{node}} {{resource}} recommended").
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

package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/bargauge"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/units"
)

// Node builds "GPU sharing — node": one node's GPUs, who holds their memory and
// replica slots, how close the pods' peaks come to the GPU's total, and the
// GPUs' health. CUDA OOMs and the tuner's decisions are annotations.
func Node() (dashboard.Dashboard, error) {
	b := newDashboard(nodeUID, "GPU sharing — node",
		"One node's time-sliced GPUs: memory and SM use by pod, peaks against the GPU's total, replica slots by pod, Xid errors, temperature and power. Red marks: CUDA OOMs; blue marks: gpuslice-tuner decisions.",
		false)

	b.WithRow(dashboard.NewRowBuilder("Memory")).
		WithPanel(timeSeries("GPU memory by pod — GPU ${gpu:text}",
			"Stacked: memory each pod holds on this GPU, and memory held by processes outside any pod. Dashed red: the GPU's total. Pods have no memory isolation under time-slicing: when the stack reaches the line, the next allocation fails.",
			units.BytesIEC, 10, 24).
			Repeat("gpu").
			RepeatDirection(dashboard.PanelRepeatDirectionH).
			MaxPerRow(2).
			Min(0).
			FillOpacity(35).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal).Group("A")).
			WithTarget(target("A", `sum by (namespace, pod) (gpuslice_container_gpu_memory_used_bytes{`+podSel+`})`, "{{namespace}}/{{pod}}")).
			WithTarget(target("B", `sum(gpuslice_unattributed_gpu_memory_used_bytes{`+gpuSel+`})`, "outside pods")).
			WithTarget(target("C", `sum(gpuslice_gpu_memory_total_bytes{`+gpuSel+`})`, "total")).
			OverrideByQuery("C", limitLine("red"))).
		// The same expression as GPUSliceMemoryOvercommitted: each running
		// container's peak over every exporter instance that reported it
		// (a rollout gives a new instance), so no pod counts twice.
		WithPanel(versus("Sum of pods' 1h memory peaks vs total",
			"Solid: for each GPU, the sum of every running pod's highest memory use over the past hour. Dashed: the GPU's total. Above the line, the pods fit only as long as their peaks do not coincide (alert GPUSliceMemoryOvercommitted).",
			units.BytesIEC, 10, 12,
			`sum by (gpu, uuid) (max by (node, namespace, pod, container, gpu, uuid) (max_over_time(gpuslice_container_gpu_memory_used_bytes{`+podSel+`}[1h]))`+
				` and on (node, namespace, pod, container, uuid) gpuslice_container_gpu_memory_used_bytes{`+podSel+`})`, "GPU {{gpu}} sum of peaks",
			`max by (gpu, uuid) (gpuslice_gpu_memory_total_bytes{`+gpuSel+`})`, "GPU {{gpu}} total").
			Min(0)).
		WithPanel(bargauge.NewPanelBuilder().
			Title("Memory peak by pod").
			Description("Each pod's highest GPU memory use in the dashboard's time range: the sum of its containers' peaks (for a pod with one GPU container, its peak), which is what must fit beside the others.").
			Datasource(datasource()).
			Unit(units.BytesIEC).
			Min(0).
			Height(10).
			Span(12).
			DisplayMode(common.BarGaugeDisplayModeGradient).
			Orientation(common.VizOrientationHorizontal).
			WithTarget(target("A",
				`sort_desc(sum by (namespace, pod, gpu) (max by (namespace, pod, container, gpu) (max_over_time(gpuslice_container_gpu_memory_used_bytes{`+podSel+`}[$__range]))))`,
				"{{namespace}}/{{pod}} on GPU {{gpu}}").Instant())).
		// Per container first, over exporter instances (a rollout is a new
		// one), then summed over a pod's containers.
		WithPanel(timeSeries("Memory by pod, 1h rolling peak",
			"Each pod's highest memory use over the hour before each point: the sum of its containers' peaks.",
			units.BytesIEC, 10, 12).
			Min(0).
			WithTarget(target("A",
				`sum by (namespace, pod, gpu) (max by (namespace, pod, container, gpu) (max_over_time(gpuslice_container_gpu_memory_used_bytes{`+podSel+`}[1h])))`,
				"{{namespace}}/{{pod}} on GPU {{gpu}}"))).
		// Only containers with a limit series: GPUs shared through MPS
		// (docs/mps.md). On a time-sliced node the panel stays empty.
		WithPanel(versus("MPS memory: used vs limit by pod",
			"GPUs shared through CUDA MPS only. Solid: memory each pod's MPS clients hold. Dashed: their pinned limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, given by gpuslice-plugin at start: the GPU's memory / replicas). A pod reaching its dashed line gets an out-of-memory error of its own; its neighbours keep their memory. Pods started before a replica change keep their older limit.",
			units.BytesIEC, 10, 12,
			`sum by (namespace, pod, gpu) (gpuslice_container_gpu_memory_used_bytes{`+podSel+`}`+
				` and on (node, namespace, pod, container, uuid) gpuslice_container_gpu_memory_limit_bytes{`+podSel+`})`, "{{namespace}}/{{pod}} on GPU {{gpu}} used",
			`sum by (namespace, pod, gpu) (max by (node, namespace, pod, container, gpu, uuid) (gpuslice_container_gpu_memory_limit_bytes{`+podSel+`}))`, "{{namespace}}/{{pod}} on GPU {{gpu}} limit").
			Min(0))

	b.WithRow(dashboard.NewRowBuilder("Compute")).
		WithPanel(versus("SM utilization by pod",
			"Share of the GPU's streaming multiprocessors each pod kept busy. Dashed: the whole GPU. No per-pod line on GPUs shared through MPS: NVML reports only the MPS server's utilization there.",
			units.PercentUnit, 9, 12,
			`sum by (namespace, pod, gpu) (gpuslice_container_gpu_utilization_ratio{`+podSel+`})`, "{{namespace}}/{{pod}} on GPU {{gpu}}",
			`max by (gpu) (gpuslice_gpu_utilization_ratio{`+gpuSel+`})`, "GPU {{gpu}}").
			Min(0).
			Max(1)).
		WithPanel(timeSeries("GPU processes by pod", "Processes each pod runs on the node's GPUs.", units.Number, 9, 12).
			Min(0).
			Decimals(0).
			LineInterpolation(common.LineInterpolationStepAfter).
			WithTarget(target("A",
				`sum by (namespace, pod, gpu) (gpuslice_container_gpu_processes{`+podSel+`})`,
				"{{namespace}}/{{pod}} on GPU {{gpu}}")))

	b.WithRow(dashboard.NewRowBuilder("Replica slots")).
		WithPanel(tablePanel("Replica slots held by pods", "Which pod holds how many of each GPU's time-slicing replicas now.", 9, 14,
			`sum by (gpu, uuid, resource, namespace, pod, container) (gpuslice_container_gpu_allocation{`+podSel+`})`,
			nil,
			[]column{{"gpu", "GPU"}, {"uuid", "UUID"}, {"resource", "Resource"}, {"namespace", "Namespace"},
				{"pod", "Pod"}, {"container", "Container"}, {"Value", "Slots"}})).
		WithPanel(versus("Replicas advertised vs allocated per GPU",
			"Dashed: replicas the device plugin advertises for the GPU. Solid: replicas held by pods.",
			units.Number, 9, 10,
			`sum by (gpu, resource) (gpuslice_gpu_replicas_allocated{`+gpuSel+`})`, "GPU {{gpu}} {{resource}} allocated",
			`sum by (gpu, resource) (gpuslice_gpu_replicas{`+gpuSel+`})`, "GPU {{gpu}} {{resource}} advertised").
			Min(0).
			Decimals(0).
			LineInterpolation(common.LineInterpolationStepAfter)).
		// max by drops instance, so a rollout's overlap counts no slot twice.
		WithPanel(versus("Replicas held by idle pods",
			"Solid: replica slots of each GPU held by containers that have run no kernel there for over an hour (gpuslice_container_gpu_idle_seconds). Dashed: replicas advertised. Slots held idle on a full GPU keep other pods Pending (alert GPUSliceIdleGPUHolder).",
			units.Number, 9, 24,
			`sum by (gpu) (max by (namespace, pod, container, gpu, uuid) (gpuslice_container_gpu_allocation{`+podSel+`})`+
				` and on (namespace, pod, container, gpu, uuid) (max by (namespace, pod, container, gpu, uuid) (gpuslice_container_gpu_idle_seconds{`+podSel+`}) > 3600))`, "GPU {{gpu}} held idle",
			`sum by (gpu) (gpuslice_gpu_replicas{`+gpuSel+`})`, "GPU {{gpu}} advertised").
			Min(0).
			Decimals(0).
			LineInterpolation(common.LineInterpolationStepAfter))

	b.WithRow(dashboard.NewRowBuilder("Events")).
		WithPanel(bars("CUDA OOMs by pod", "Out-of-memory events per interval, by kind: device (the GPU was full), process-cap (a limit of the pod's own, such as its CUDA MPS pinned limit), encoder-session (NVENC), unknown.", 8, 8).
			WithTarget(target("A",
				`sum by (namespace, pod, kind) `+oomEvents(podSel, "$__rate_interval"),
				"{{namespace}}/{{pod}} {{kind}}"))).
		WithPanel(bars("Xid errors", "Xid errors the driver reported, per interval. 13, 31, 43, 45, 68 and 109 are usually an application's fault; others point at the GPU.", 8, 8).
			WithTarget(target("A",
				`sum by (gpu, xid) `+xidEvents(gpuSel, "$__rate_interval"),
				"GPU {{gpu}} Xid {{xid}}"))).
		WithPanel(versus("Tuner: recommended vs current replicas",
			"Dashed: what gpuslice-tuner recommends for this node. Solid: what the node runs with.",
			units.Number, 8, 8,
			leaderOnly(`gpuslice_tuner_replicas{`+nodeSel+`}`), "{{resource}} current",
			leaderOnly(`gpuslice_tuner_recommended_replicas{`+nodeSel+`}`), "{{resource}} recommended").
			Decimals(0).
			LineInterpolation(common.LineInterpolationStepAfter))

	b.WithRow(dashboard.NewRowBuilder("Health")).
		WithPanel(timeSeries("Temperature", "GPU temperature; the red line is the GPUSliceTemperatureHigh threshold.", units.Celsius, 8, 12).
			Thresholds(thresholds(step(nil, "green"), step(cog.ToPtr(85.0), "red"))).
			ThresholdsStyle(common.NewGraphThresholdsStyleConfigBuilder().Mode(common.GraphThresholdsStyleModeLine)).
			WithTarget(target("A", `max by (gpu) (gpuslice_gpu_temperature_celsius{`+gpuSel+`})`, "GPU {{gpu}}"))).
		WithPanel(timeSeries("Power", "GPU power draw.", units.Watt, 8, 12).
			Min(0).
			WithTarget(target("A", `max by (gpu) (gpuslice_gpu_power_watts{`+gpuSel+`})`, "GPU {{gpu}}"))).
		WithPanel(timeSeries("Estimated power by pod",
			"Stacked: each pod's share of the GPUs' power, estimated from gpuslice_container_gpu_energy_joules_total (the GPU's energy between scrapes split by the pods' SM utilization), and the part no pod's SMs account for (idle power, processes outside pods). An estimate: time-slicing gives no per-process power.",
			units.Watt, 8, 24).
			Min(0).
			FillOpacity(35).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal).Group("A")).
			WithTarget(target("A", `sum by (namespace, pod) (rate(gpuslice_container_gpu_energy_joules_total{`+podSel+`}[$__rate_interval]))`, "{{namespace}}/{{pod}}")).
			WithTarget(target("B", `sum(rate(gpuslice_unattributed_gpu_energy_joules_total{`+gpuSel+`}[$__rate_interval]))`, "no pod (idle, outside pods)")))

	return build(b)
}

package controller

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// SpanDecide is the name of the span recorded for each decision.
const SpanDecide = "gpuslice.tuner.decide"

// decide runs the policy for one node inside a span carrying its inputs
// and its answer. The caller ends the span once the decision is applied
// (or refused), adding what happened.
// floor is the least count the node's config can take (semantics.floor);
// resource is what the node's current config advertises its GPUs under,
// the resource pending pods must ask for to count as its demand.
// lastDirection is the direction of the change at lastChange, as stored
// beside it.
func (c *Controller) decide(ctx context.Context, w *work, cur int, lastChange time.Time, lastDirection string, now time.Time, floor int, resource string) (policy.Decision, trace.Span) {
	waiting := c.waitingPods(w.node, resource)
	pending := asPending(waiting, resource)
	_, span := c.tracer.Start(ctx, SpanDecide, trace.WithAttributes(
		attribute.String("k8s.node.name", w.node.Name),
		attribute.Int("gpuslice.replicas.current", cur),
		attribute.String("gpuslice.apply.mode", c.cfg.Apply.Mode),
		attribute.Bool("gpuslice.dry_run", c.cfg.DryRun),
		attribute.String("gpuslice.resource", resource),
		attribute.Int("gpuslice.pending_pods", len(pending)),
		attribute.String("gpuslice.last_change_direction", lastDirection),
	))
	if span.IsRecording() {
		span.SetAttributes(inputAttributes(w.gpus, lastChange, now.Add(-c.cfg.Policy.Window))...)
	}
	obs := c.observation(w, cur, lastChange, lastDirection, now, floor)
	obs.Pending, obs.ContainerWorkloads = pending, c.owners.containerWorkloads(ctx, now, w.gpus)
	d, mem := policy.Round(c.cfg.Policy, obs)
	c.mem.put(w.node.Name, mem)
	c.crashLoops(ctx, w, d.CrashLoops, now)
	c.explainWaiting(w, waiting, resource, cur, d, now)
	span.SetAttributes(
		attribute.Int("gpuslice.replicas.decided", d.Replicas),
		attribute.String("gpuslice.direction", d.Direction),
		attribute.String("gpuslice.reason", d.Reason),
		attribute.String("gpuslice.message", d.Message),
		attribute.String("gpuslice.decision.gpu", d.GPU),
		attribute.Int64("gpuslice.footprint_bytes", int64(d.FootprintBytes)),
	)
	return d, span
}

// observation is what the policy is told about a node, short of its
// pending pods and workload names (read from the API): with what a change
// costs in this cluster's apply mode and the direction of the last one, so
// that a change is not undone before it has settled (ApplyCost.Settle).
func (c *Controller) observation(w *work, cur int, lastChange time.Time, lastDirection string, now time.Time, floor int) policy.Observation {
	return policy.Observation{
		Node: w.node.Name, Now: now, CurrentReplicas: cur, LastChange: lastChange, LastDirection: lastDirection,
		Apply: c.applyCost, GPUs: w.gpus, Floor: floor, Memory: c.mem.get(w.node.Name), MPS: w.mps,
	}
}

// inputAttributes summarises what Decide saw: per GPU (in the order of
// gpuslice.gpu.uuids) the samples in the window, the latest memory and
// replicas, the largest used memory and container peak, and the OOM events.
func inputAttributes(gpus []policy.GPUObservation, lastChange, from time.Time) []attribute.KeyValue {
	n := len(gpus)
	uuids := make([]string, n)
	samples := make([]int, n)
	total, used, usedMax, peak := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	adv, alloc, ooms := make([]int, n), make([]int, n), make([]int, n)
	for i, g := range gpus {
		uuids[i] = g.UUID
		for _, s := range g.Samples {
			if s.Time.Before(from) {
				continue
			}
			samples[i]++
			usedMax[i] = max(usedMax[i], int64(s.MemoryUsedBytes))
			ooms[i] += s.OOMEvents
			for _, p := range s.ContainerPeaks {
				peak[i] = max(peak[i], int64(p))
			}
		}
		if len(g.Samples) > 0 {
			l := g.Samples[len(g.Samples)-1]
			total[i], used[i] = int64(l.MemoryTotalBytes), int64(l.MemoryUsedBytes)
			adv[i], alloc[i] = l.ReplicasAdvertised, l.ReplicasAllocated
		}
	}
	last := ""
	if !lastChange.IsZero() {
		last = lastChange.UTC().Format(time.RFC3339)
	}
	return []attribute.KeyValue{
		attribute.String("gpuslice.last_change", last),
		attribute.StringSlice("gpuslice.gpu.uuids", uuids),
		attribute.IntSlice("gpuslice.gpu.samples", samples),
		attribute.Int64Slice("gpuslice.gpu.memory_total_bytes", total),
		attribute.Int64Slice("gpuslice.gpu.memory_used_bytes", used),
		attribute.Int64Slice("gpuslice.gpu.memory_used_max_bytes", usedMax),
		attribute.Int64Slice("gpuslice.gpu.container_peak_bytes", peak),
		attribute.IntSlice("gpuslice.gpu.replicas_advertised", adv),
		attribute.IntSlice("gpuslice.gpu.replicas_allocated", alloc),
		attribute.IntSlice("gpuslice.gpu.oom_events", ooms),
	}
}

package controller

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// ReasonRecommendedMemoryRequest is the Event reason of a DRA memory
// request recommendation.
const ReasonRecommendedMemoryRequest = "RecommendedMemoryRequest"

// draAdvice is what the tuner reports for nodes whose GPUs DRA manages:
// there it writes no device-plugin config, and says instead how much
// memory each workload should request (policy.RecommendMemoryRequests).
type draAdvice struct {
	gauge *prometheus.GaugeVec
	// sent is each node's last advice, key container|uuid → bytes: an
	// Event only when it changes, and gauges of containers that are gone
	// are deleted.
	sent map[string]map[string]uint64
}

// newDRAAdvice reports through gauge (metrics.memoryRequest).
func newDRAAdvice(gauge *prometheus.GaugeVec) *draAdvice {
	return &draAdvice{gauge: gauge, sent: map[string]map[string]uint64{}}
}

// forget drops what was sent: a replica that leads again sends every
// advice again, its gauges having been dropped when it stepped down.
func (a *draAdvice) forget() { clear(a.sent) }

// draManaged says whether the exporter measures GPUs on a node that no
// device plugin advertises: no nvidia.com/ resource in its capacity (which
// a device plugin's resources keep even while it is stopped) nor in its
// allocatable. Such GPUs reach pods through DRA claims, and a device-plugin
// config would change nothing there.
func draManaged(n *corev1.Node, gpus []policy.GPUObservation) bool {
	if len(gpus) == 0 || hasGPUs(n) {
		return false
	}
	for name := range n.Status.Allocatable {
		if strings.HasPrefix(string(name), "nvidia.com/") {
			return false
		}
	}
	return true
}

// adviseDRA sets the node's gauges and records an Event for each
// recommendation that is new or changed.
func (c *Controller) adviseDRA(n *corev1.Node, gpus []policy.GPUObservation, now time.Time) {
	a := c.dra
	recs := policy.RecommendMemoryRequests(c.cfg.Policy, policy.Observation{Node: n.Name, Now: now, GPUs: gpus})
	prev := a.sent[n.Name]
	next := make(map[string]uint64, len(recs))
	for _, r := range recs {
		ns, pod, ctr := splitContainer(r.Container)
		a.gauge.WithLabelValues(n.Name, ns, pod, ctr, r.UUID).Set(float64(r.RequestBytes))
		key := r.Container + "|" + r.UUID
		next[key] = r.RequestBytes
		if prev[key] == r.RequestBytes {
			continue
		}
		c.rec.Event(nodeRef(n.Name), corev1.EventTypeNormal, ReasonRecommendedMemoryRequest, fmt.Sprintf(
			"%s on %s: peak %s in the last %s; request memory: %dMi in its DRA claim (consumable capacity). The tuner writes no device-plugin config on this node: its GPUs are not advertised by a device plugin",
			r.Container, r.UUID, gibString(r.PeakBytes), c.cfg.Policy.Window, r.RequestBytes>>20))
	}
	for key := range prev {
		if _, ok := next[key]; !ok {
			container, uuid, _ := strings.Cut(key, "|")
			ns, pod, ctr := splitContainer(container)
			a.gauge.DeleteLabelValues(n.Name, ns, pod, ctr, uuid)
		}
	}
	a.sent[n.Name] = next
}

// forgetDRA drops the advice of a node no longer seen as DRA-managed.
func (c *Controller) forgetDRA(node string) {
	if _, ok := c.dra.sent[node]; !ok {
		return
	}
	c.dra.gauge.DeletePartialMatch(prometheus.Labels{"node": node})
	delete(c.dra.sent, node)
}

func splitContainer(key string) (namespace, pod, container string) {
	namespace, rest, _ := strings.Cut(key, "/")
	pod, container, _ = strings.Cut(rest, "/")
	return namespace, pod, container
}

func gibString(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

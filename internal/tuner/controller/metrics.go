package controller

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// metrics are the gpuslice_tuner_* series (DESIGN.md, "Tuner metrics").
type metrics struct {
	replicas       *prometheus.GaugeVec
	recommended    *prometheus.GaugeVec
	changes        *prometheus.CounterVec
	applyFailures  *prometheus.CounterVec
	verifyFailures *prometheus.CounterVec
	lastChange     *prometheus.GaugeVec
	configInvalid  *prometheus.GaugeVec
	leader         prometheus.Gauge
	// crashLoopEvictions counts what was done about crash-looping pods
	// (evict.go), once per loop and outcome.
	crashLoopEvictions *prometheus.CounterVec
	// memoryRequest is the DRA advice (dra.go): per container, the GPU
	// memory it should request, on nodes whose GPUs DRA manages.
	memoryRequest *prometheus.GaugeVec
}

// stepDown is what a replica does when it stops leading: it no longer
// decides, so its per-node gauges (replicas, recommendation, last change,
// config validity, DRA memory requests) would only draw stale duplicate
// lines beside the new leader's in every panel; they are dropped.
// Counters stay: their increase() is 0 from now on.
func (m *metrics) stepDown() {
	m.leader.Set(0)
	m.replicas.Reset()
	m.recommended.Reset()
	m.lastChange.Reset()
	m.configInvalid.Reset()
	m.memoryRequest.Reset()
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuslice_tuner_replicas",
			Help: "Replicas per GPU configured for the node (1: exclusive GPUs)."}, []string{"node", "resource"}),
		recommended: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuslice_tuner_recommended_replicas",
			Help: "Replicas per GPU the policy decided for the node in the last round."}, []string{"node", "resource"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuslice_tuner_changes_total",
			Help: "Replica changes written, by direction (up, down). Dry runs write none."}, []string{"node", "resource", "direction"}),
		applyFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuslice_tuner_apply_failures_total",
			Help: "Writes of a decided change that the API server refused after retries."}, []string{"node"}),
		verifyFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuslice_tuner_verify_failures_total",
			Help: "Changes after which the node's allocatable did not reach GPUs x replicas within apply.verifyTimeout."}, []string{"node"}),
		lastChange: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuslice_tuner_last_change_timestamp_seconds",
			Help: "When the tuner last changed the node's replicas (Unix time)."}, []string{"node"}),
		configInvalid: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuslice_tuner_config_invalid",
			Help: "1 when the node's existing device-plugin config does not parse, so the tuner leaves the node alone."}, []string{"node"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpuslice_tuner_leader",
			Help: "1 while this replica holds the leader lease and makes decisions."}),
		crashLoopEvictions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuslice_tuner_crash_loop_evictions_total",
			Help: "Pods whose container OOMed again and again on a full shared GPU, by what the tuner did: evicted, or not (disabled, bare, pdb, dry_run, error). Once per loop and outcome."},
			[]string{"node", "result"}),
		memoryRequest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuslice_tuner_recommended_memory_request_bytes",
			Help: "On nodes whose GPUs DRA manages: the GPU memory a container should request (a DRA claim's memory capacity under consumable-capacity sharing), from its peak in the policy window divided by targetUtilization."},
			[]string{"node", "namespace", "pod", "container", "uuid"}),
	}
	if reg != nil {
		reg.MustRegister(m.replicas, m.recommended, m.changes, m.applyFailures, m.verifyFailures, m.lastChange, m.configInvalid, m.leader, m.crashLoopEvictions, m.memoryRequest)
	}
	return m
}

// setReplicas sets a node's gauges, moving them when the resource name
// changed (renameByDefault and replicas 1 advertise under another name).
func (m *metrics) setReplicas(st *nodeState, node, resource string, configured, recommended int) {
	if st.resource != "" && st.resource != resource {
		m.replicas.DeleteLabelValues(node, st.resource)
		m.recommended.DeleteLabelValues(node, st.resource)
	}
	st.resource = resource
	m.replicas.WithLabelValues(node, resource).Set(float64(configured))
	m.recommended.WithLabelValues(node, resource).Set(float64(recommended))
	m.createCounters(node, resource)
}

// createCounters creates a managed node's counters at 0. A counter born at
// its first event has no earlier sample, so Prometheus' increase() cannot
// see that event: the dashboards' change marks and the verify-failure alert
// would miss the first change or failure on every node.
func (m *metrics) createCounters(node, resource string) {
	m.changes.WithLabelValues(node, resource, policy.DirectionUp)
	m.changes.WithLabelValues(node, resource, policy.DirectionDown)
	m.applyFailures.WithLabelValues(node)
	m.verifyFailures.WithLabelValues(node)
	for _, r := range evictResults {
		m.crashLoopEvictions.WithLabelValues(node, r)
	}
}

// forget drops the gauges of a node the tuner no longer manages; counters
// stay, as Prometheus expects of counters.
func (m *metrics) forget(node, resource string) {
	m.replicas.DeleteLabelValues(node, resource)
	m.recommended.DeleteLabelValues(node, resource)
	m.configInvalid.DeleteLabelValues(node)
	m.lastChange.DeleteLabelValues(node)
}

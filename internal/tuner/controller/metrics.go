package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

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
	// lastSuccessfulRound is when the leader last finished a round without
	// an error; a vector without labels so that it exists only while this
	// replica leads and has had one (stepDown drops it). roundFailures
	// counts the rounds that ended with one: without them a tuner whose
	// signal source is down only logs.
	lastSuccessfulRound *prometheus.GaugeVec
	roundFailures       prometheus.Counter
}

// nodeVec is a vector with a node label.
type nodeVec interface {
	prometheus.Collector
	DeletePartialMatch(prometheus.Labels) int
}

// perNode are the vectors with a node label.
func (m *metrics) perNode() []nodeVec {
	return []nodeVec{m.replicas, m.recommended, m.changes, m.applyFailures, m.verifyFailures, m.lastChange,
		m.configInvalid, m.crashLoopEvictions, m.memoryRequest}
}

// nodes are the node names of every per-node series this replica exports.
func (m *metrics) nodes() map[string]bool {
	ch := make(chan prometheus.Metric)
	go func() {
		for _, v := range m.perNode() {
			v.Collect(ch)
		}
		close(ch)
	}()
	out := map[string]bool{}
	for metric := range ch {
		var d dto.Metric
		if metric.Write(&d) != nil {
			continue
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == "node" {
				out[l.GetValue()] = true
			}
		}
	}
	return out
}

// forgetNode drops every series of a node that no longer exists, counters
// included: no node will count on them again under that name, and one set
// per deleted node would pile up in a cluster whose nodes come and go.
func (m *metrics) forgetNode(node string) {
	for _, v := range m.perNode() {
		v.DeletePartialMatch(prometheus.Labels{"node": node})
	}
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
	m.lastSuccessfulRound.Reset()
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
		lastSuccessfulRound: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuslice_tuner_last_successful_round_timestamp_seconds",
			Help: "When this replica, while leading, last finished a round without an error (Unix time). Absent on a replica that does not lead."}, nil),
		roundFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuslice_tuner_round_failures_total",
			Help: "Rounds of the leader that ended with an error: the signals could not be gathered, the device-plugin ConfigMap not read, the workload memory not saved."}),
	}
	if reg != nil {
		reg.MustRegister(m.replicas, m.recommended, m.changes, m.applyFailures, m.verifyFailures, m.lastChange, m.configInvalid, m.leader, m.crashLoopEvictions, m.memoryRequest,
			m.lastSuccessfulRound, m.roundFailures)
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

// Package controller is `gpuslice-tuner run`: every interval the leader
// gathers each node's GPU signals, asks policy.Decide for the node's replica
// count, writes the device-plugin config the way the cluster's plugin reads
// it, and then checks that the node's allocatable GPU resource followed.
//
// The decision stays a pure function (internal/tuner/policy); this package
// only gathers, calls it and applies. A round walks: round (gather the
// signals and the selected nodes) → the mode's applier (applier.go,
// configmanager.go, restart.go) → policy.Decide (trace.go) → gate (gate.go:
// pure, state in, verdict out) → the write helpers (write.go). Its rules for
// writing:
//
//   - Every write reads the object fresh, changes only the tuner's own keys,
//     labels and annotations, carries the resourceVersion it read (a
//     conflicting concurrent edit makes the API server refuse it, and the
//     write is redone from a fresh read, so the other edit survives), and
//     uses the field manager "gpuslice-tuner". Nothing is written when
//     nothing would change.
//   - A write checks that what the decision was based on (the node's config
//     label, the replica count in the config) is still what the API server
//     has; if someone changed it meanwhile, the write is dropped and the node
//     decided again next round.
//   - An existing config that does not parse (dpconfig.Parse) is never
//     overwritten: the node is skipped with a Warning Event (ConfigInvalid),
//     the gpuslice_tuner_config_invalid metric and a log line.
//   - After a change the node's status.allocatable[resource] must reach
//     physical GPUs × replicas within apply.verifyTimeout (checked on later
//     rounds, never by blocking). If it does not, a Warning Event
//     (VerifyFailed) and gpuslice_tuner_verify_failures_total, and the node
//     is held: no further change until its allocatable or its config changes,
//     or apply.verifyHold passes.
//   - The time and direction of the last change are stored with the change
//     itself (the node's gpuslice.io/last-decision annotation in the same
//     update as the label; the ConfigMap's gpuslice.io/last-change and
//     gpuslice.io/last-change-direction annotations in the same update as
//     the key), so a new leader keeps the cooldown, never repeats a change
//     its predecessor made, and does not undo one before it has settled.
//
// A node's demand (policy.Observation.PendingRequest) comes from a
// cluster-wide informer over the pods the scheduler could not place
// (pending.go).
//
// Only the leader (a Lease, released on cancel) decides and writes. Every
// replica keeps its informers and signal window warm, so a new leader
// acts at once. On shutdown a round in progress is finished before the
// lease is released.
package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"

	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
	"github.com/gpuslice/gpuslice/internal/tuner/signals"
)

// FieldManager is the field manager of every write.
const FieldManager = "gpuslice-tuner"

// Labels and annotations the tuner reads or writes.
const (
	// ConfigLabel is the node label naming the ConfigMap key of a node's
	// device-plugin config; NVIDIA's config-manager and gpuslice-plugin read
	// it.
	ConfigLabel = "nvidia.com/device-plugin.config"
	// AnnotationReplicas is the node's configured replica count.
	AnnotationReplicas = "gpuslice.io/replicas"
	// AnnotationLastDecision is the node's last decision, a JSON Record.
	AnnotationLastDecision = "gpuslice.io/last-decision"
	// AnnotationLastChange is, on the ConfigMap in restart mode, when the
	// tuner last changed the key (RFC 3339).
	AnnotationLastChange = "gpuslice.io/last-change"
	// AnnotationLastChangeDirection is, beside AnnotationLastChange and in
	// the same update, the direction of that change (up, down): the policy
	// does not undo a change before it has settled.
	AnnotationLastChangeDirection = "gpuslice.io/last-change-direction"
	// AnnotationRestartedAt is what `kubectl rollout restart` sets on a pod
	// template.
	AnnotationRestartedAt = "kubectl.kubernetes.io/restartedAt"
)

// Event reasons, on the Node.
const (
	ReasonReplicasRaised   = "ReplicasRaised"
	ReasonReplicasLowered  = "ReplicasLowered"
	ReasonReplicasVerified = "ReplicasVerified"
	ReasonVerifyFailed     = "VerifyFailed"
	ReasonChangeHeld       = "ChangeHeld"
	ReasonConfigInvalid    = "ConfigInvalid"
	ReasonConfigNotManaged = "ConfigNotManaged"
	ReasonApplyFailed      = "ApplyFailed"
	// ReasonNoSignals: a node with GPUs that the signal source has no
	// samples for; recorded when the lapse starts.
	ReasonNoSignals = "NoSignals"
	// ReasonConfigRewritten: a named config a node uses was rewritten and
	// nothing will restart its plugin (config-manager mode without
	// apply.daemonSet).
	ReasonConfigRewritten = "ConfigRewritten"
	// ReasonDecisionUnreadable: the node's gpuslice.io/last-decision
	// annotation does not parse; the node is left as it is until it does.
	ReasonDecisionUnreadable = "DecisionUnreadable"
	// ReasonAwaitingVerify is recorded in the node's annotation, not as an
	// Event: a raise waits while the last change is not verified, so two
	// raises are never stacked blindly. Lowering does not wait.
	ReasonAwaitingVerify = "AwaitingVerify"
)

// ErrStale means an object changed between the decision and the write; the
// write is dropped and the node decided again next round.
var ErrStale = errors.New("changed since the decision")

// ErrConfigInvalid wraps a device-plugin config that does not parse.
var ErrConfigInvalid = errors.New("device-plugin config does not parse")

// Options configures New.
type Options struct {
	Config config.Config
	Client kubernetes.Interface
	Source signals.Source
	Logger *slog.Logger
	// Registerer receives the gpuslice_tuner_* metrics; nil registers none.
	Registerer prometheus.Registerer
	// Tracer records a span per decision; nil records nothing.
	Tracer trace.Tracer
	// Recorder records Events; nil sends them to the API server.
	Recorder record.EventRecorder
	// Identity is this replica's name in the Lease.
	Identity string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Controller is the tuner's control loop.
type Controller struct {
	cfg     config.Config
	client  kubernetes.Interface
	source  signals.Source
	log     *slog.Logger
	tracer  trace.Tracer
	rec     record.EventRecorder
	bcast   record.EventBroadcaster
	now     func() time.Time
	id      string
	m       *metrics
	dra     *draAdvice
	nodeSel labels.Selector
	// sem is how the cluster's plugin reads a config; applier writes.
	sem     semantics
	applier applier
	// applyCost is what a change costs in the apply mode (the policy's
	// Observation.Apply).
	applyCost policy.ApplyCost

	informers informers.SharedInformerFactory
	nodes     listersv1.NodeLister
	// podInformers watches the pending pods of every namespace
	// (pending.go).
	podInformers informers.SharedInformerFactory
	pods         listersv1.PodLister
	// mem is the policy's workload record per node (memory.go); owners
	// names the workloads of the measured containers (workload.go).
	mem    *memoryStore
	owners *owners
	// idle is this round's idle replica holders per node; explained the
	// WaitingForReplica Events given (explain.go).
	idle      map[string][]signals.IdleHolder
	explained map[string]explained
	// toExplain is this round's notes for waiting pods, by pod UID.
	toExplain map[string]*toExplain

	// state is per node, touched only by the goroutine running rounds.
	state map[string]*nodeState
	// unsignalled holds the GPU nodes that had no signals last round: since
	// when, and whether that was reported (once per lapse, not every round).
	unsignalled map[string]*lapse

	// roundBudget is how long a round may gather its signals, and then
	// how long it may decide and write: max(interval, 30 s) each.
	roundBudget time.Duration
	// afterRound, when set (tests), is called after every round.
	afterRound func(error)
	leaderMu   sync.Mutex
}

// New builds a controller; Run runs it.
func New(o Options) (*Controller, error) {
	if err := o.Config.Validate(); err != nil {
		return nil, err
	}
	if o.Client == nil || o.Source == nil {
		return nil, errors.New("controller: a client and a signal source are required")
	}
	sel, err := labels.Parse(o.Config.Apply.NodeSelector)
	if err != nil {
		return nil, fmt.Errorf("apply.nodeSelector: %w", err)
	}
	cost, err := policy.ApplyCostOf(o.Config.Apply.Mode)
	if err != nil {
		return nil, fmt.Errorf("apply.mode: %w", err)
	}
	c := &Controller{
		cfg: o.Config, client: o.Client, source: o.Source, log: o.Logger, tracer: o.Tracer,
		rec: o.Recorder, now: o.Now, id: o.Identity, nodeSel: sel, state: map[string]*nodeState{},
		applyCost: cost, roundBudget: max(o.Config.Interval, 30*time.Second),
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	if c.tracer == nil {
		c.tracer = noop.NewTracerProvider().Tracer("")
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.rec == nil {
		c.bcast = record.NewBroadcaster()
		c.rec = c.bcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: FieldManager})
	}
	c.sem = semantics{nvidia: o.Config.Apply.Mode != config.ModePlugin}
	c.applier = newApplier(c)
	c.m = newMetrics(o.Registerer)
	c.dra = newDRAAdvice(c.m.memoryRequest)
	c.informers = informers.NewSharedInformerFactory(o.Client, 0)
	c.nodes = c.informers.Core().V1().Nodes().Lister()
	c.podInformers = pendingPods(c)
	c.pods = c.podInformers.Core().V1().Pods().Lister()
	c.mem = newMemoryStore(c)
	c.owners = &owners{client: c.client, cache: c.pods, known: map[string]ownerEntry{}, log: c.log}
	c.explained = map[string]explained{}
	return c, nil
}

// Run runs until ctx ends: the node and pending-pod informers and, while
// this replica leads, a round every interval.
func (c *Controller) Run(ctx context.Context) error {
	if c.bcast != nil {
		c.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
		defer c.bcast.Shutdown()
	}
	if err := c.startInformers(ctx); err != nil {
		return err
	}
	defer c.informers.Shutdown()
	defer c.podInformers.Shutdown()
	if ctx.Err() != nil {
		// Stopped while the informers synced: a round on a partial node
		// list would take the nodes not listed yet for deleted ones and
		// drop their workload memory.
		return nil
	}
	if !c.cfg.LeaderElection.Enabled {
		c.m.leader.Set(1)
		defer c.m.leader.Set(0)
		c.loop(context.WithoutCancel(ctx), ctx.Done())
		return nil
	}
	for ctx.Err() == nil {
		if err := c.elect(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (c *Controller) startInformers(ctx context.Context) error {
	// An informer the API server forbids waits for ever: say what is
	// missing instead (RBAC from before pending pods were read).
	if _, err := c.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Pending", Limit: 1}); apierrors.IsForbidden(err) {
		return fmt.Errorf("listing pending pods in every namespace (the tuner's ClusterRole needs list and watch on pods): %w", err)
	}
	c.informers.Core().V1().Nodes().Informer()
	c.podInformers.Core().V1().Pods().Informer()
	for _, f := range []informers.SharedInformerFactory{c.informers, c.podInformers} {
		f.Start(ctx.Done())
	}
	for _, f := range []informers.SharedInformerFactory{c.informers, c.podInformers} {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok && ctx.Err() == nil {
				return fmt.Errorf("syncing the %v informer", typ)
			}
		}
	}
	return nil
}

// elect takes part in one leader election until leadership is lost or ctx
// ends. The election's own context outlives ctx until the loop has finished
// its round, because ReleaseOnCancel hands the lease over the moment that
// context ends.
func (c *Controller) elect(ctx context.Context) error {
	le := c.cfg.LeaderElection
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, le.Namespace, le.Name,
		c.client.CoreV1(), c.client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: c.id})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}
	electCtx, cancelElect := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelElect()
	var loopDone chan struct{}
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-ctx.Done():
		case <-finished: // leadership lost: the next elect watches ctx
			return
		}
		c.leaderMu.Lock()
		d := loopDone
		c.leaderMu.Unlock()
		if d != nil {
			<-d
		}
		cancelElect()
	}()
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            le.Name,
		LeaseDuration:   le.LeaseDuration,
		RenewDeadline:   le.RenewDeadline,
		RetryPeriod:     le.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				c.leaderMu.Lock()
				if ctx.Err() != nil {
					c.leaderMu.Unlock()
					return
				}
				d := make(chan struct{})
				loopDone = d
				c.leaderMu.Unlock()
				defer close(d)
				c.log.Info("leading: deciding and writing", "identity", c.id)
				c.m.leader.Set(1)
				defer c.dra.forget() // after the loop, which alone reads it
				defer c.m.stepDown()
				c.loop(lctx, ctx.Done())
			},
			OnStoppedLeading: c.m.stepDown,
			OnNewLeader: func(id string) {
				if id != c.id {
					c.log.Info("standing by", "leader", id, "identity", c.id)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	elector.Run(electCtx)
	// Run returns once the loop's context is cancelled, possibly before the
	// loop has noticed; wait for it so two loops never overlap.
	c.leaderMu.Lock()
	d := loopDone
	c.leaderMu.Unlock()
	if d != nil {
		<-d
	}
	return nil
}

// loop runs rounds every interval until lead ends (leadership lost: a
// round in progress is abandoned) or stop closes (shutdown: the round in
// progress is finished).
func (c *Controller) loop(lead context.Context, stop <-chan struct{}) {
	c.mem.reset()
	// What this replica knew of each node in an earlier leadership is stale:
	// another leader may have changed, verified or held a node since. A
	// leadership starts as a new replica would, from the nodes' annotations
	// (adopt), so that it watches its predecessor's change instead of
	// stacking another on it.
	c.state = map[string]*nodeState{}
	c.unsignalled = nil
	tick := time.NewTicker(c.cfg.Interval)
	defer tick.Stop()
	for {
		err := c.round(lead, stop)
		switch {
		case err == nil:
			c.m.lastSuccessfulRound.WithLabelValues().Set(float64(c.now().Unix()))
		case errors.Is(err, errStopped):
			c.log.Info("shutting down: the round in progress stopped before writing")
		case lead.Err() == nil: // not a round cut short by lost leadership
			c.m.roundFailures.Inc()
			c.log.Error("tuner round failed", "err", err)
		}
		if c.afterRound != nil {
			c.afterRound(err)
		}
		// Shutdown first: a select between stop and a tick already due
		// picks at random, and could start a whole round (and its writes)
		// after SIGTERM.
		select {
		case <-lead.Done():
			return
		case <-stop:
			return
		default:
		}
		select {
		case <-lead.Done():
			return
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// errStopped is a round that stopped at shutdown before it wrote anything.
var errStopped = errors.New("shutting down")

// work is one node in one round.
type work struct {
	node *corev1.Node // informer cache: read only
	gpus []policy.GPUObservation
	st   *nodeState
	// record is the node's last-decision annotation, nil when absent or
	// unreadable; recordErr says why it cannot be read (refuseUnreadable).
	record    *Record
	recordErr error
	// mps says the node's config shares its GPUs through MPS (mps.go).
	mps bool
}

// round gathers, then hands the nodes with signals to the mode's applier,
// which decides and writes. lead ends when leadership does.
//
// Gathering and writing each get their own budget (roundBudget): the
// prometheus source alone may take its 30 s timeout, and the idle holders'
// query as long again, which under one budget for the whole round left the
// writes none, every one of them failing on a context that had already
// ended.
func (c *Controller) round(lead context.Context, stop <-chan struct{}) error {
	now := c.now()
	gctx, cancel := context.WithTimeout(lead, c.roundBudget)
	// Shutdown ends the gathering, which writes nothing: a signal source
	// that does not answer (the prometheus source waits up to 30 s) would
	// otherwise keep the tuner past its pod's grace period and the lease
	// unreleased. Writes begun are finished (their own budget, below).
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-stop:
			cancel()
		case <-gctx.Done():
		}
	}()
	obs, err := c.source.Observe(gctx, now, c.cfg.Policy.Window)
	if err == nil {
		c.gatherIdle(gctx, now)
	}
	cancel()
	<-stopped
	if isClosed(stop) {
		return errStopped
	}
	if err != nil {
		return fmt.Errorf("gathering signals: %w", err)
	}
	ctx, cancel := context.WithTimeout(lead, c.roundBudget)
	defer cancel()
	c.owners.newRound()
	c.forgetExplained(now)
	if err := c.mem.load(ctx); err != nil {
		// Decide from the record in memory; nothing is saved until a
		// read succeeds.
		c.log.Error("tuner round without the stored workload memory", "err", err)
	}
	nodes, err := c.nodes.List(c.nodeSel)
	if err != nil {
		return err
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	var r roundInput
	seen := map[string]bool{}
	for _, n := range nodes {
		gpus := obs[n.Name]
		if draManaged(n, gpus) {
			c.adviseDRA(n, gpus, now)
			continue
		}
		c.forgetDRA(n.Name)
		if len(gpus) == 0 {
			if hasGPUs(n) {
				r.unsignalled = append(r.unsignalled, n.Name)
			}
			continue
		}
		st := c.state[n.Name]
		if st == nil {
			st = &nodeState{}
			c.state[n.Name] = st
		}
		seen[n.Name] = true
		rec, rerr := ParseRecord(n.Annotations[AnnotationLastDecision])
		r.ws = append(r.ws, &work{node: n, gpus: gpus, st: st, record: rec, recordErr: rerr})
	}
	listed := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		listed[n.Name] = true
	}
	for name := range c.dra.sent {
		if !listed[name] {
			c.forgetDRA(name)
		}
	}
	c.reportUnsignalled(now, r.unsignalled, seen)
	for name, st := range c.state {
		if !seen[name] {
			c.m.forget(name, st.resource)
			// A node still here whose signals lapsed (its exporter down
			// for a window) keeps what the tuner knows of it: a hold
			// after a failed verification, a change to verify, the loops
			// reported. Only a node gone, or no longer selected, is
			// forgotten.
			if !listed[name] {
				delete(c.state, name)
			}
		}
	}
	err = c.applier.apply(ctx, now, r)
	c.flushExplanations(now)
	all, lerr := c.nodes.List(labels.Everything())
	if lerr != nil {
		return errors.Join(err, lerr)
	}
	exists := make(map[string]bool, len(all))
	for _, n := range all {
		exists[n.Name] = true
	}
	// A deleted node's series, counters included, would otherwise stay
	// until the process ends: one set per node name ever seen. Those of a
	// node that is only no longer selected stay (its counters keep
	// counting if it is selected again); c.m.forget dropped its gauges.
	for name := range c.m.nodes() {
		if !exists[name] {
			c.m.forgetNode(name)
		}
	}
	return errors.Join(err, c.mem.save(ctx, now, func(n string) bool { return exists[n] }))
}

// lapse is a GPU node's time without signals.
type lapse struct {
	since time.Time
	told  bool
}

// reportUnsignalled says when a GPU node's signals lapse and when they
// return. Without them the tuner leaves the node as it is (in restart mode
// it also holds raises of the shared config, gate.go), and nothing else
// would tell the operator why a node is never tuned: an exporter down
// there, or Prometheus labelling its series with another name than the
// Kubernetes node's. A lapse is told once it has lasted two sample
// intervals or one round, whichever is longer: a leadership's first rounds
// may come before the exporters source's first scrape.
func (c *Controller) reportUnsignalled(now time.Time, names []string, seen map[string]bool) {
	grace := max(2*c.cfg.Policy.SampleInterval, c.cfg.Interval)
	lapses := make(map[string]*lapse, len(names))
	for _, name := range names {
		l := c.unsignalled[name]
		if l == nil {
			l = &lapse{since: now}
		}
		lapses[name] = l
		if l.told || now.Sub(l.since) < grace {
			continue
		}
		l.told = true
		why := "the exporter may not run there"
		if c.cfg.Signals.Source == config.SourcePrometheus {
			why = fmt.Sprintf("the exporter may not run there, or its series' %q label (signals.prometheus.nodeLabel) may not hold the Kubernetes node name", c.cfg.Signals.Prometheus.NodeLabel)
		}
		msg := fmt.Sprintf("no GPU samples for this node over the last %s from signals.source %s: the tuner leaves its replicas as they are until they return; %s",
			c.cfg.Policy.Window, c.cfg.Signals.Source, why)
		c.log.Warn("GPU node without signals, left as it is", "node", name, "source", c.cfg.Signals.Source, "window", c.cfg.Policy.Window, "msg", msg)
		c.rec.Event(nodeRef(name), corev1.EventTypeWarning, ReasonNoSignals, msg)
	}
	for name, l := range c.unsignalled {
		if l.told && seen[name] {
			c.log.Info("GPU node's signals returned", "node", name)
		}
	}
	c.unsignalled = lapses
}

// hasGPUs says whether a node has NVIDIA GPUs under a device plugin: any
// nvidia.com/ resource in its capacity (kept when the plugin stops, unlike
// allocatable).
func hasGPUs(n *corev1.Node) bool {
	for name, q := range n.Status.Capacity {
		if strings.HasPrefix(string(name), "nvidia.com/") && !q.IsZero() {
			return true
		}
	}
	return false
}

// isClosed says whether ch is closed; a nil ch never is.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

package controller

import (
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// Record is the JSON of a node's gpuslice.io/last-decision annotation.
type Record struct {
	Time time.Time `json:"time"`
	// Replicas is the node's configured count after the decision.
	Replicas int `json:"replicas"`
	// Recommended is what the policy asked for (differs from Replicas when
	// the change was refused or held).
	Recommended int    `json:"recommended"`
	Direction   string `json:"direction,omitempty"`
	Reason      string `json:"reason"`
	Message     string `json:"message"`
	// LastChange is when the tuner last changed this node's count.
	LastChange *time.Time `json:"lastChange,omitempty"`
	// LastChangeDirection is the direction of the change at LastChange
	// (policy.DirectionUp or DirectionDown), kept beside it so that a new
	// leader, like this one, does not undo a change before it has settled
	// (policy.Observation.LastDirection).
	LastChangeDirection string `json:"lastChangeDirection,omitempty"`
	// Hold is the hold after a failed verification in force when the
	// record was written, so that a new leader keeps it (adopt): no change
	// until it lifts.
	Hold *RecordHold `json:"hold,omitempty"`
}

// RecordHold is a hold after a failed verification (Record.Hold).
type RecordHold struct {
	// Until is when it lifts by itself (apply.verifyHold after the
	// failure).
	Until time.Time `json:"until"`
	// Replicas is the count written; Resource and Allocatable what the
	// node advertised when verification gave up: a change of either lifts
	// the hold.
	Replicas    int    `json:"replicas"`
	Resource    string `json:"resource"`
	Allocatable int64  `json:"allocatable"`
	Why         string `json:"why"`
}

// ParseRecord reads a node's gpuslice.io/last-decision annotation: nil
// and no error when it is empty. An error means the annotation is there
// and cannot be read: it may hold a hold after a failed verification or
// the last change, so the controller leaves the node alone until it parses
// (refuseUnreadable), and `gpuslice-tuner status` says so. Unknown fields
// are no error: a newer tuner may have added some.
func ParseRecord(s string) (*Record, error) {
	if s == "" {
		return nil, nil
	}
	var r Record
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return nil, err
	}
	return &r, nil
}

func (r Record) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// lastChange is the record's LastChange, zero when unknown.
func (r *Record) lastChange() time.Time {
	if r == nil || r.LastChange == nil {
		return time.Time{}
	}
	return *r.LastChange
}

// hold is the record's Hold, nil when none.
func (r *Record) hold() *RecordHold {
	if r == nil {
		return nil
	}
	return r.Hold
}

// lastChangeDirection is the direction of the change at lastChange, ""
// when unknown. A record written before the field existed still knows it
// when it was written by the change itself.
func (r *Record) lastChangeDirection() string {
	switch {
	case r == nil || r.LastChange == nil:
		return ""
	case r.LastChangeDirection != "":
		return r.LastChangeDirection
	case r.LastChange.Equal(r.Time):
		return r.Direction
	}
	return ""
}

// nodeState is what the controller remembers about a node between rounds.
type nodeState struct {
	// pending is a change waiting for the node's allocatable to follow.
	pending *expectation
	// held is set after a failed verification: no change until it lifts.
	held *hold
	// adopted is set once a leader has looked at the node's annotation for
	// a change of its predecessor still waiting to be verified.
	adopted bool
	// lastEvent dedupes Events: the same reason for the same change is
	// recorded once, not every round.
	lastEvent string
	// resource is the resource label of the node's gauges.
	resource string
	// loops is what was done about each crash-looping container of the
	// node (evict.go), so that a loop is reported once, not every round.
	loops map[string]loopReport
}

// expectation is what a node's allocatable must reach after a change:
// want, plus up to draining more. gpuslice-plugin keeps advertising replica
// IDs above a lowered count while pods hold them (so the kubelet keeps
// their allocation consistent), and drops each when it is released;
// NVIDIA's plugin drops them at once. draining is the most IDs that can be
// held above the new count: per GPU, the allocated replicas beyond it.
type expectation struct {
	replicas int
	resource string
	want     int64
	draining int64
	gpus     int
	deadline time.Time
}

func (p *expectation) met(got int64) bool { return got >= p.want && got <= p.want+p.draining }

func (p *expectation) String() string {
	if p.draining == 0 {
		return fmt.Sprintf("%d %s (%d GPUs × %d)", p.want, p.resource, p.gpus, p.replicas)
	}
	return fmt.Sprintf("%d to %d %s (%d GPUs × %d, plus up to %d IDs still held above it)", p.want, p.want+p.draining, p.resource, p.gpus, p.replicas, p.draining)
}

type hold struct {
	replicas    int
	resource    string
	allocatable int64
	until       time.Time
	why         string
}

func allocatable(n *corev1.Node, resource string) int64 {
	q, ok := n.Status.Allocatable[corev1.ResourceName(resource)]
	if !ok {
		return 0
	}
	return q.Value()
}

// currentGPUs are the GPUs the node's latest look reported: those whose
// newest sample is within two sample intervals of the node's newest (a GPU
// removed a minute ago still has samples in the window).
func currentGPUs(gpus []policy.GPUObservation, interval time.Duration) []policy.GPUObservation {
	var newest time.Time
	for _, g := range gpus {
		if t := g.Samples[len(g.Samples)-1].Time; t.After(newest) {
			newest = t
		}
	}
	var out []policy.GPUObservation
	for _, g := range gpus {
		if newest.Sub(g.Samples[len(g.Samples)-1].Time) <= 2*interval {
			out = append(out, g)
		}
	}
	return out
}

// nodeRef is how Events name a node: with its name as UID, as the kubelet's
// events do, so `kubectl describe node` lists them.
func nodeRef(name string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: name, UID: types.UID(name)}
}

// event records an Event on the node unless the same one was the node's
// last (refusals repeat every round; a change is recorded once), and says
// whether it did.
func (c *Controller) event(w *work, eventType, reason, key, format string, args ...any) bool {
	k := reason + "|" + key
	if w.st.lastEvent == k {
		return false
	}
	w.st.lastEvent = k
	msg := fmt.Sprintf(format, args...)
	if c.cfg.DryRun {
		msg = "dry run: " + msg
	}
	c.rec.Event(nodeRef(w.node.Name), eventType, reason, msg)
	return true
}

// refuseUnreadable leaves a node whose last-decision annotation does not
// parse as it is: no decision, no write, and the annotation is not
// overwritten. It may hold a hold after a failed verification (or the
// last change, for the cooldown and settling) that a new leader must keep;
// read as absent, the hold was lost and the held node changed, and the
// next write replaced the evidence. One Warning Event and one log line per
// error, not every round.
func (c *Controller) refuseUnreadable(w *work) {
	if c.event(w, corev1.EventTypeWarning, ReasonDecisionUnreadable, w.recordErr.Error(),
		"annotation %s of node %s cannot be read (%v); it may hold a hold or the last change, so the tuner leaves this node and the annotation as they are until it parses (fix it, or delete it to start the node afresh)",
		AnnotationLastDecision, w.node.Name, w.recordErr) {
		c.log.Error("node's last decision cannot be read; node left as it is until it parses", "node", w.node.Name,
			"annotation", AnnotationLastDecision, "err", w.recordErr)
	}
}

// checkVerify settles a pending change and lifts a hold whose cause is
// gone. cur is the node's configured count now.
func (c *Controller) checkVerify(w *work, now time.Time, cur int) {
	st := w.st
	if p := st.pending; p != nil {
		got := allocatable(w.node, p.resource)
		switch {
		case cur != p.replicas:
			c.log.Info("pending change superseded: the config changed", "node", w.node.Name, "replicas", cur, "expected", p.replicas)
			st.pending = nil
		case p.met(got):
			st.pending = nil
			c.event(w, corev1.EventTypeNormal, ReasonReplicasVerified, fmt.Sprint(p.replicas),
				"node advertises %d %s, as expected: %s", got, p.resource, p)
			c.log.Info("change verified", "node", w.node.Name, "resource", p.resource, "allocatable", got, "replicas", p.replicas)
		case now.After(p.deadline):
			st.pending = nil
			why := fmt.Sprintf("%d replicas were written, but after %s the node advertises %d %s, want %s; not changing it again until its allocatable or config changes, or %s",
				p.replicas, c.cfg.Apply.VerifyTimeout, got, p.resource, p, c.cfg.Apply.VerifyHold)
			st.held = &hold{replicas: p.replicas, resource: p.resource, allocatable: got, until: now.Add(c.cfg.Apply.VerifyHold), why: why}
			c.m.verifyFailures.WithLabelValues(w.node.Name).Inc()
			c.event(w, corev1.EventTypeWarning, ReasonVerifyFailed, fmt.Sprint(p.replicas), "%s", why)
			c.log.Warn("change not verified", "node", w.node.Name, "resource", p.resource, "allocatable", got, "want", p.want, "hold", c.cfg.Apply.VerifyHold)
		}
	}
	if h := st.held; h != nil {
		lift := ""
		switch {
		case cur != h.replicas:
			lift = fmt.Sprintf("its config changed to %d replicas", cur)
		case allocatable(w.node, h.resource) != h.allocatable:
			lift = fmt.Sprintf("its allocatable %s changed to %d", h.resource, allocatable(w.node, h.resource))
		case !now.Before(h.until):
			lift = "verifyHold passed"
		}
		if lift != "" {
			c.log.Info("hold after a failed verification lifted", "node", w.node.Name, "because", lift)
			st.held = nil
		}
	}
}

// expect starts waiting for the node's allocatable to follow a change.
func (c *Controller) expect(w *work, cfg dpconfig.Config, replicas int, deadline time.Time) {
	current := currentGPUs(w.gpus, c.cfg.Policy.SampleInterval)
	res, want := c.sem.expected(cfg, len(current))
	var draining int64
	for _, g := range current {
		draining += int64(max(0, g.Samples[len(g.Samples)-1].ReplicasAllocated-replicas))
	}
	w.st.pending = &expectation{replicas: replicas, resource: res, want: want, draining: draining, gpus: len(current), deadline: deadline}
	w.st.held = nil
}

// adopt picks up, once per leadership, a change the previous leader made
// whose verification it could not finish, or the hold it was keeping after
// one failed (checkVerify then lifts it as it would have).
func (c *Controller) adopt(w *work, now time.Time, cur int, cfg dpconfig.Config) {
	if w.st.adopted {
		return
	}
	w.st.adopted = true
	if c.cfg.DryRun || w.st.pending != nil {
		return
	}
	if h := w.record.hold(); h != nil && w.st.held == nil && now.Before(h.Until) {
		w.st.held = &hold{replicas: h.Replicas, resource: h.Resource, allocatable: h.Allocatable, until: h.Until, why: h.Why}
		c.log.Info("hold after a failed verification kept from the node's last decision", "node", w.node.Name, "until", h.Until)
		return
	}
	last := w.record.lastChange()
	if last.IsZero() || w.record.Replicas != cur || !now.Before(last.Add(c.cfg.Apply.VerifyTimeout)) {
		return
	}
	c.expect(w, cfg, cur, last.Add(c.cfg.Apply.VerifyTimeout))
}

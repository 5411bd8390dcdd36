package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
	"github.com/gpuslice/gpuslice/internal/tuner/signals"
)

// ReasonWaitingForReplica is the Event on a pod waiting for a replica that
// the tuner does not raise for: why not, and who holds replicas of the node
// without using them (`kubectl describe pod` shows it where the user looks).
const ReasonWaitingForReplica = "WaitingForReplica"

// maxNamedIdle is the most idle holders one Event names; the rest are
// counted.
const maxNamedIdle = 5

// reexplain is how often an unchanged explanation is repeated while the pod
// waits, so that it stays among the pod's recent Events.
const reexplain = 30 * time.Minute

// explained is the last explanation given to one pod about one node.
type explained struct {
	key string
	at  time.Time
}

// gatherIdle reads the idle holders of every node for this round, when the
// source knows them; a failure only leaves the explanations without them.
func (c *Controller) gatherIdle(ctx context.Context, now time.Time) {
	c.idle = nil
	is, ok := c.source.(signals.IdleSource)
	if !ok {
		return
	}
	hs, err := is.IdleHolders(ctx, now)
	if err != nil {
		c.log.Warn("reading idle replica holders; waiting pods are explained without them", "err", err)
		return
	}
	c.idle = hs
}

// idleHolders are the node's holders idle for at least idleHolderAfter,
// longest first, one line per pod (a pod idle on several GPUs or with
// several containers is named once, at its longest).
func (c *Controller) idleHolders(node string) []signals.IdleHolder {
	var out []signals.IdleHolder
	seen := map[string]bool{}
	for _, h := range c.idle[node] {
		id := h.Namespace + "/" + h.Pod
		if h.Idle < c.cfg.IdleHolderAfter || seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, h)
	}
	return out
}

// explainWaiting puts a WaitingForReplica Event on each pod waiting for the
// node's resource when the decision does not raise: the count kept and why,
// and the pods that hold replicas there without using them. An explanation
// is repeated only when it changes (another reason, other idle pods) or
// after reexplain.
func (c *Controller) explainWaiting(w *work, waiting []*corev1.Pod, resource string, cur int, d policy.Decision, now time.Time) {
	if len(waiting) == 0 || d.Replicas > cur {
		return
	}
	idle := c.idleHolders(w.node.Name)
	names := make([]string, 0, len(idle))
	for _, h := range idle {
		names = append(names, h.Namespace+"/"+h.Pod)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "node %s: no %s replica free and the tuner does not raise its %d (%s)", w.node.Name, resource, cur, d.Reason)
	if d.Message != "" {
		fmt.Fprintf(&b, ": %s", d.Message)
	}
	switch len(idle) {
	case 0:
		b.WriteString("; no replica there is held by a pod idle for ")
		b.WriteString(c.cfg.IdleHolderAfter.String())
		b.WriteString(" or more")
	default:
		fmt.Fprintf(&b, "; %d pod(s) hold replicas there without using the GPU: ", len(idle))
		for i, h := range idle[:min(len(idle), maxNamedIdle)] {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s/%s (idle %s)", h.Namespace, h.Pod, h.Idle.Truncate(time.Minute))
		}
		if len(idle) > maxNamedIdle {
			fmt.Fprintf(&b, " and %d more", len(idle)-maxNamedIdle)
		}
	}
	msg := b.String()
	key := d.Reason + "|" + fmt.Sprint(cur) + "|" + strings.Join(names, ",")
	for _, p := range waiting {
		id := string(p.UID) + "|" + w.node.Name
		if e, ok := c.explained[id]; ok && e.key == key && now.Sub(e.at) < reexplain {
			continue
		}
		c.explained[id] = explained{key: key, at: now}
		m := msg
		if c.cfg.DryRun {
			m = "dry run: " + m
		}
		c.rec.Event(p, corev1.EventTypeNormal, ReasonWaitingForReplica, m)
	}
}

// forgetExplained drops the explanations older than any repeat would be.
func (c *Controller) forgetExplained(now time.Time) {
	for id, e := range c.explained {
		if now.Sub(e.at) > 2*reexplain {
			delete(c.explained, id)
		}
	}
}

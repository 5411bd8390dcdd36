package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
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

// maxExplainedNodes is the most nodes one pod's Event explains; the
// rest are counted.
const maxExplainedNodes = 3

// explained is the last explanation given to one pod.
type explained struct {
	key string
	at  time.Time
}

// toExplain is what one round found to tell one waiting pod: a part per
// node it could run on.
type toExplain struct {
	pod   *corev1.Pod
	parts []explainPart
}

type explainPart struct {
	node, key, msg string
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

// explainWaiting notes, for each pod waiting for the node's resource when
// the decision does not raise, the count kept and why, and the pods that
// hold replicas there without using them. The round's notes become one
// WaitingForReplica Event per pod (flushExplanations).
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
	part := explainPart{node: w.node.Name, msg: b.String(),
		key: w.node.Name + "|" + d.Reason + "|" + fmt.Sprint(cur) + "|" + strings.Join(names, ",")}
	if c.toExplain == nil {
		c.toExplain = map[string]*toExplain{}
	}
	for _, p := range waiting {
		e := c.toExplain[string(p.UID)]
		if e == nil {
			e = &toExplain{pod: p}
			c.toExplain[string(p.UID)] = e
		}
		e.parts = append(e.parts, part)
	}
}

// flushExplanations gives each pod noted this round one WaitingForReplica
// Event, naming every node it was explained on (up to maxExplainedNodes,
// the rest counted): a pod that may run on any GPU node got one Event from
// each, thirty at once on thirty nodes, which the API server's per-object
// spam filter then partly dropped. An explanation is repeated only when it
// changes (another node, reason or idle pods) or after reexplain.
func (c *Controller) flushExplanations(now time.Time) {
	uids := slices.Sorted(maps.Keys(c.toExplain))
	for _, uid := range uids {
		e := c.toExplain[uid]
		slices.SortFunc(e.parts, func(a, b explainPart) int { return strings.Compare(a.node, b.node) })
		keys := make([]string, len(e.parts))
		for i, p := range e.parts {
			keys[i] = p.key
		}
		key := strings.Join(keys, "\n")
		if x, ok := c.explained[uid]; ok && x.key == key && now.Sub(x.at) < reexplain {
			continue
		}
		c.explained[uid] = explained{key: key, at: now}
		var b strings.Builder
		if c.cfg.DryRun {
			b.WriteString("dry run: ")
		}
		if len(e.parts) > 1 {
			fmt.Fprintf(&b, "%d nodes: ", len(e.parts))
		}
		for i, p := range e.parts[:min(len(e.parts), maxExplainedNodes)] {
			if i > 0 {
				b.WriteString(" | ")
			}
			b.WriteString(p.msg)
		}
		if n := len(e.parts) - maxExplainedNodes; n > 0 {
			fmt.Fprintf(&b, " | and %d more node(s) alike", n)
		}
		c.rec.Event(e.pod, corev1.EventTypeNormal, ReasonWaitingForReplica, b.String())
	}
	clear(c.toExplain)
}

// forgetExplained drops the explanations older than any repeat would be.
func (c *Controller) forgetExplained(now time.Time) {
	for id, e := range c.explained {
		if now.Sub(e.at) > 2*reexplain {
			delete(c.explained, id)
		}
	}
}

package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
)

// perNodeRound is the walk the two per-node Appliers share once they have
// the ConfigMap with its named configs: for each node, its config, the
// policy's decision, the gate's verdict and, when it says so, the label
// move. readyAt is when the named configs are visible to the nodes'
// plugins.
func (c *Controller) perNodeRound(ctx context.Context, now time.Time, ws []*work, cm *corev1.ConfigMap, broken map[string]error, readyAt time.Time) {
	base, baseErr := c.baseFile(cm)
	for _, w := range ws {
		if w.recordErr != nil {
			c.refuseUnreadable(w)
			continue
		}
		cur, err := c.nodeConfig(w, cm, baseErr, broken)
		if err != nil {
			c.refuseInvalid(ctx, now, w, err)
			continue
		}
		if cur == nil {
			continue // not managed
		}
		c.perNode(ctx, now, w, cm, base.Config(), cur, broken, readyAt)
	}
}

// nodeConfig is the config the node's label names: nil (and an Event) when
// the label names a config the tuner does not manage.
func (c *Controller) nodeConfig(w *work, cm *corev1.ConfigMap, baseErr error, broken map[string]error) (*dpconfig.File, error) {
	label := w.node.Labels[ConfigLabel]
	switch n, named := c.namedReplicas(label); {
	case baseErr != nil:
		return nil, baseErr
	case label == "" || label == c.cfg.Apply.Key || (label == DefaultKey && c.keepsDefault(cm)):
		return c.baseFile(cm)
	case named && broken[label] != nil:
		return nil, broken[label]
	case named:
		data, ok := cm.Data[label]
		if !ok {
			// Outside [min, max] and deleted by someone: what it held is
			// the base with n replicas.
			f, _, err := c.derived(cm, n)
			return f, err
		}
		f, err := dpconfig.Parse([]byte(data))
		if err != nil {
			return nil, fmt.Errorf("%w: ConfigMap %s key %q: %w", ErrConfigInvalid, c.cfg.Apply.ConfigMap, label, err)
		}
		return f, nil
	}
	c.event(w, corev1.EventTypeWarning, ReasonConfigNotManaged, label,
		"label %s=%s names a config the tuner does not manage (it manages %q and %s<N>); leaving the node alone",
		ConfigLabel, label, c.cfg.Apply.Key, c.cfg.Apply.ConfigPrefix)
	c.log.Warn("node's config is not managed by the tuner; skipping it", "node", w.node.Name, "label", label)
	return nil, nil
}

// perNode decides and applies for one node.
func (c *Controller) perNode(ctx context.Context, now time.Time, w *work, cm *corev1.ConfigMap, base dpconfig.Config, cur *dpconfig.File,
	broken map[string]error, readyAt time.Time) {
	name, label := w.node.Name, w.node.Labels[ConfigLabel]
	c.m.configInvalid.WithLabelValues(name).Set(0)
	replicas := cur.SharedReplicas()
	w.mps = cur.MPS()
	lastChange, lastDirection := w.record.lastChange(), w.record.lastChangeDirection()
	c.adopt(w, now, replicas, cur.Config())
	c.checkVerify(w, now, replicas)
	w.gpus = c.sem.markExclusive(base, w.gpus)
	res := c.sem.resource(cur.Config())
	d, span := c.decide(ctx, w, replicas, lastChange, lastDirection, now, c.sem.floor(base), res)
	defer span.End()
	c.m.setReplicas(w.st, name, res, replicas, d.Replicas)
	if !lastChange.IsZero() {
		c.m.lastChange.WithLabelValues(name).Set(float64(lastChange.Unix()))
	}

	key := c.namedKey(d.Replicas)
	in := gateInput{now: now, current: replicas, decision: d, targetErr: broken[key], readyAt: readyAt}
	if p := w.st.pending; p != nil {
		in.pending = fmt.Sprintf("the node advertises %s (deadline %s)", p, p.deadline.UTC().Format(time.RFC3339))
	}
	if h := w.st.held; h != nil {
		in.held = h.why
	}
	var target *dpconfig.File
	if d.Replicas != replicas && in.targetErr == nil {
		target, _, in.targetErr = c.derived(cm, d.Replicas)
	}
	if in.targetErr != nil {
		c.m.configInvalid.WithLabelValues(name).Set(1)
	}
	v := gate(in)
	if !v.apply {
		c.record(ctx, now, w, replicas, d, v, lastChange)
		return
	}

	rec := Record{Time: now, Replicas: d.Replicas, Recommended: d.Replicas, Direction: d.Direction, Reason: d.Reason, Message: d.Message,
		LastChange: &now, LastChangeDirection: d.Direction}
	where := fmt.Sprintf("label %s=%s", ConfigLabel, key)
	if err := c.moveNode(ctx, name, label, key, rec); err != nil {
		c.applyFailed(ctx, w, span, d, replicas, where, err)
		return
	}
	c.changed(w, span, d, replicas, c.sem.resource(target.Config()), where, now)
	if !c.cfg.DryRun {
		c.expect(w, target.Config(), d.Replicas, now.Add(c.cfg.Apply.VerifyTimeout))
	}
}

// moveNode points the node's config label at key, with the decision's
// annotations in the same update. It gives up with ErrStale when the label
// is no longer the one the decision was made from, when the node's last
// decision no longer parses (it is not overwritten: refuseUnreadable), or
// when the node is gone: a node deleted during the round is no failure to
// alert on, and the next round no longer lists it.
func (c *Controller) moveNode(ctx context.Context, node, from, key string, rec Record) error {
	if c.cfg.DryRun {
		return nil
	}
	err := c.updateNode(ctx, node, func(n *corev1.Node) error {
		if got := n.Labels[ConfigLabel]; got != from {
			return fmt.Errorf("%w: node %s label %s is %q, the decision saw %q", ErrStale, node, ConfigLabel, got, from)
		}
		if _, err := ParseRecord(n.Annotations[AnnotationLastDecision]); err != nil {
			return fmt.Errorf("%w: node %s annotation %s no longer parses: %w", ErrStale, node, AnnotationLastDecision, err)
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[ConfigLabel] = key
		setRecord(&n.ObjectMeta, rec)
		return nil
	})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: node %s was deleted: %w", ErrStale, node, err)
	}
	return err
}

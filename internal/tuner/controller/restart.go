package controller

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// Restart mode: one key (apply.key) configures every node, so the cluster
// gets one count, the smallest of the nodes' decisions. A node that must
// lower lowers everyone; a raise needs every node to agree. The key and
// the ConfigMap's gpuslice.io/last-change annotation are written in one
// update; then the DaemonSet's pod template gets kubectl's restartedAt
// annotation with the same time. A restart that failed (or that a previous
// leader did not get to) is owed while restartedAt is older than
// last-change, and is retried every round.

func (c *Controller) roundRestart(ctx context.Context, now time.Time, ws []*work) error {
	ref := c.cfg.Apply.ConfigMap
	cm, err := c.client.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading ConfigMap %s: %w", ref, err)
	}
	f, err := c.baseFile(cm)
	if err != nil {
		for _, w := range ws {
			c.refuseInvalid(ctx, now, w, err)
		}
		return nil
	}
	cur, curCfg := f.Replicas(), f.Config()
	var lastChange time.Time
	if s := cm.Annotations[AnnotationLastChange]; s != "" {
		if lastChange, err = time.Parse(time.RFC3339, s); err != nil {
			c.log.Warn("unreadable annotation, cooldown starts from zero", "configmap", ref.String(), "annotation", AnnotationLastChange, "value", s)
		}
	}
	if !lastChange.IsZero() && !c.cfg.DryRun {
		if err := c.restartIfOwed(ctx, lastChange); err != nil {
			c.log.Error("restarting the device plugin DaemonSet failed; retrying next round", "daemonset", c.cfg.Apply.DaemonSet.String(), "err", err)
		}
	}

	type decided struct {
		w    *work
		d    policy.Decision
		span trace.Span
	}
	var ds []decided
	defer func() {
		for _, x := range ds {
			x.span.End()
		}
	}()
	var setter *decided
	for _, w := range ws {
		c.m.configInvalid.WithLabelValues(w.node.Name).Set(0)
		c.adopt(w, now, cur, curCfg)
		c.checkVerify(w, now, cur)
		d, span := c.decide(ctx, w, cur, lastChange, now)
		c.m.setReplicas(w.st, w.node.Name, resourceOf(curCfg), cur, d.Replicas)
		if !lastChange.IsZero() {
			c.m.lastChange.WithLabelValues(w.node.Name).Set(float64(lastChange.Unix()))
		}
		ds = append(ds, decided{w, d, span})
	}
	for i := range ds {
		if setter == nil || ds[i].d.Replicas < setter.d.Replicas {
			setter = &ds[i]
		}
	}
	if setter == nil || setter.d.Replicas == cur {
		for _, x := range ds {
			c.annotate(ctx, x.w, Record{Time: now, Replicas: cur, Recommended: x.d.Replicas, Reason: x.d.Reason, Message: x.d.Message}, lastChange)
		}
		return nil
	}
	target := setter.d.Replicas
	d := setter.d
	d.Message = "node " + setter.w.node.Name + ": " + d.Message + " (every node shares one config; the smallest decision wins)"
	for _, x := range ds {
		if p := x.w.st.pending; p != nil && d.Direction == policy.DirectionUp {
			for _, y := range ds {
				c.annotate(ctx, y.w, Record{Time: now, Replicas: cur, Recommended: y.d.Replicas, Reason: ReasonAwaitingVerify,
					Message: fmt.Sprintf("cluster-wide raise %d -> %d waits until node %s advertises %s", cur, target, x.w.node.Name, p)}, lastChange)
			}
			return nil
		}
		if h := x.w.st.held; h != nil {
			for _, y := range ds {
				c.refuse(ctx, now, y.w, cur, d, lastChange, ReasonChangeHeld,
					"cluster-wide %s %d -> %d (%s) held: node %s: %s", verb(d), cur, target, d.Reason, x.w.node.Name, h.why)
			}
			return nil
		}
	}

	stamp := now.UTC().Format(time.RFC3339)
	where := fmt.Sprintf("ConfigMap %s key %q, DaemonSet %s restarted", ref, c.cfg.Apply.Key, c.cfg.Apply.DaemonSet)
	newFile, err := c.writeKey(ctx, cur, target, stamp)
	if err == nil && !c.cfg.DryRun {
		if rerr := c.restart(ctx, stamp); rerr != nil {
			err = fmt.Errorf("the key is written, the restart failed (retried next round): %w", rerr)
		}
	}
	if err != nil {
		for _, x := range ds {
			c.applyFailed(x.w, x.span, d, cur, where, err)
		}
		if newFile == nil {
			return nil
		}
	}
	newCfg := newFile.Config()
	for _, x := range ds {
		c.changed(x.w, x.span, d, cur, resourceOf(newCfg), where, now)
		if c.cfg.DryRun {
			continue
		}
		c.expect(x.w, newCfg, target, now.Add(c.cfg.Apply.VerifyTimeout))
		c.annotate(ctx, x.w, Record{Time: now, Replicas: target, Recommended: x.d.Replicas, Direction: d.Direction, Reason: d.Reason, Message: d.Message}, now)
	}
	return nil
}

// writeKey sets the key's replicas from → to, with the last-change
// annotation, and returns the config written (in a dry run, the config that
// would be). It never writes over a config that does not parse, and gives
// up with ErrStale when the key no longer holds from replicas.
func (c *Controller) writeKey(ctx context.Context, from, to int, stamp string) (*dpconfig.File, error) {
	ref := c.cfg.Apply.ConfigMap
	var out *dpconfig.File
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cm, err := c.client.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		f, err := c.baseFile(cm)
		if err != nil {
			return err
		}
		if got := f.Replicas(); got != from {
			return fmt.Errorf("%w: ConfigMap %s key %q has %d replicas, the decision saw %d", ErrStale, ref, c.cfg.Apply.Key, got, from)
		}
		if _, err := f.SetReplicas(to); err != nil {
			return err
		}
		data, err := f.Marshal()
		if err != nil {
			return err
		}
		out = f
		if c.cfg.DryRun {
			return nil
		}
		cm = cm.DeepCopy()
		cm.Data[c.cfg.Apply.Key] = string(data)
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[AnnotationLastChange] = stamp
		_, err = c.client.CoreV1().ConfigMaps(ref.Namespace).Update(ctx, cm, metav1.UpdateOptions{FieldManager: FieldManager})
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// restart does what `kubectl rollout restart` does to the DaemonSet.
func (c *Controller) restart(ctx context.Context, stamp string) error {
	ref := c.cfg.Apply.DaemonSet
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		ds, err := c.client.AppsV1().DaemonSets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ds.Spec.Template.Annotations[AnnotationRestartedAt] == stamp {
			return nil
		}
		ds = ds.DeepCopy()
		if ds.Spec.Template.Annotations == nil {
			ds.Spec.Template.Annotations = map[string]string{}
		}
		ds.Spec.Template.Annotations[AnnotationRestartedAt] = stamp
		_, err = c.client.AppsV1().DaemonSets(ref.Namespace).Update(ctx, ds, metav1.UpdateOptions{FieldManager: FieldManager})
		if err == nil {
			c.log.Info("device plugin DaemonSet restarted", "daemonset", ref.String(), "restartedAt", stamp)
		}
		return err
	})
}

// restartIfOwed restarts the DaemonSet when its pods predate the last
// change of the key.
func (c *Controller) restartIfOwed(ctx context.Context, lastChange time.Time) error {
	ref := c.cfg.Apply.DaemonSet
	ds, err := c.client.AppsV1().DaemonSets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if at, err := time.Parse(time.RFC3339, ds.Spec.Template.Annotations[AnnotationRestartedAt]); err == nil && !at.Before(lastChange) {
		return nil
	}
	c.log.Warn("the device plugin has not been restarted since the key last changed; restarting it", "daemonset", ref.String(),
		"lastChange", lastChange.UTC().Format(time.RFC3339))
	return c.restart(ctx, lastChange.UTC().Format(time.RFC3339))
}

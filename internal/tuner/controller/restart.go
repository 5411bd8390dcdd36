package controller

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// AnnotationSharedConfig is, on the ConfigMap in restart mode, the key's
// text before the tuner made the GPUs exclusive (1 replica removes
// sharing.timeSlicing with its renameByDefault, failRequestsGreaterThanOne
// and devices); a raise from 1 starts from it, so the user's sharing
// settings come back.
const AnnotationSharedConfig = "gpuslice.io/shared-config"

// restartApplier is restart mode: one key (apply.key) configures every
// node, so the cluster gets one count, the smallest of the nodes'
// decisions. A node that must lower lowers everyone; a raise needs every
// node to agree, and waits while a selected GPU node shows no signals. The
// key and the ConfigMap's gpuslice.io/last-change and
// gpuslice.io/last-change-direction annotations are written in one update; then the DaemonSet's pod template gets kubectl's restartedAt
// annotation with the same time. A restart that failed (or that a previous
// leader did not get to) is owed while restartedAt is older than
// last-change, and is retried every round.
type restartApplier struct{ c *Controller }

// decided is one node's decision in a restart round.
type decided struct {
	w    *work
	d    policy.Decision
	span trace.Span
}

func (a restartApplier) apply(ctx context.Context, now time.Time, r roundInput) error {
	c := a.c
	ref := c.cfg.Apply.ConfigMap
	cm, err := c.client.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading ConfigMap %s: %w", ref, err)
	}
	// A node whose last decision cannot be read is left as it is
	// (refuseUnreadable). Its record may hold a hold, which holds every
	// node's change here (one key serves them all), so while it is
	// unreadable no change is made.
	var ws []*work
	unreadable := ""
	for _, w := range r.ws {
		if w.recordErr != nil {
			c.refuseUnreadable(w)
			if unreadable == "" {
				unreadable = fmt.Sprintf("node %s: its %s annotation cannot be read (%v); no change until it parses", w.node.Name, AnnotationLastDecision, w.recordErr)
			}
			continue
		}
		ws = append(ws, w)
	}
	r.ws = ws
	f, err := c.baseFile(cm)
	if err != nil {
		for _, w := range r.ws {
			c.refuseInvalid(ctx, now, w, err)
		}
		return nil
	}
	cur, curCfg := f.SharedReplicas(), f.Config()
	lastChange := annotationTime(cm.Annotations, AnnotationLastChange)
	lastDirection := cm.Annotations[AnnotationLastChangeDirection]
	if s := cm.Annotations[AnnotationLastChange]; s != "" && lastChange.IsZero() {
		c.log.Warn("unreadable annotation, cooldown starts from zero", "configmap", ref.String(), "annotation", AnnotationLastChange, "value", s)
	}
	if !lastChange.IsZero() && !c.cfg.DryRun {
		if err := a.restartIfOwed(ctx, lastChange); err != nil {
			c.log.Error("restarting the device plugin DaemonSet failed; retrying next round", "daemonset", c.cfg.Apply.DaemonSet.String(), "err", err)
		}
	}
	if lastChange.IsZero() {
		// The ConfigMap lost its annotations (recreated, or the cluster
		// came from another apply mode): the nodes' last decisions still
		// know the last change, for the cooldown and the settling. Without
		// it each node's record, newer than a decision with no last change,
		// was never written again.
		for _, w := range r.ws {
			if t := w.record.lastChange(); t.After(lastChange) {
				lastChange, lastDirection = t, w.record.lastChangeDirection()
			}
		}
	}
	floor := c.sem.floor(sharedConfig(cm, f).Config())

	var ds []decided
	defer func() {
		for _, x := range ds {
			x.span.End()
		}
	}()
	for _, w := range r.ws {
		c.m.configInvalid.WithLabelValues(w.node.Name).Set(0)
		w.mps = curCfg.MPS
		c.adopt(w, now, cur, curCfg)
		c.checkVerify(w, now, cur)
		d, span := c.decide(ctx, w, cur, lastChange, lastDirection, now, floor, c.sem.resource(curCfg))
		c.m.setReplicas(w.st, w.node.Name, c.sem.resource(curCfg), cur, d.Replicas)
		if !lastChange.IsZero() {
			c.m.lastChange.WithLabelValues(w.node.Name).Set(float64(lastChange.Unix()))
		}
		ds = append(ds, decided{w, d, span})
	}
	var setter *decided
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
	d := setter.d
	d.Message = "node " + setter.w.node.Name + ": " + d.Message + " (every node shares one config; the smallest decision wins)"
	in := gateInput{now: now, current: cur, decision: d, unsignalled: r.unsignalled, held: unreadable}
	for _, x := range ds {
		if p := x.w.st.pending; p != nil && in.pending == "" {
			in.pending = fmt.Sprintf("node %s advertises %s", x.w.node.Name, p)
		}
		if h := x.w.st.held; h != nil && in.held == "" {
			in.held = "node " + x.w.node.Name + ": " + h.why
		}
	}
	if v := gate(in); !v.apply {
		for _, x := range ds {
			c.record(ctx, now, x.w, cur, d, v, lastChange)
		}
		return nil
	}

	stamp := now.UTC().Format(time.RFC3339)
	where := fmt.Sprintf("ConfigMap %s key %q, DaemonSet %s restarted", ref, c.cfg.Apply.Key, c.cfg.Apply.DaemonSet)
	newFile, err := a.writeKey(ctx, cur, d.Replicas, stamp)
	if err == nil && !c.cfg.DryRun {
		if rerr := c.restartDaemonSet(ctx, stamp, time.Time{}); rerr != nil {
			err = fmt.Errorf("the key is written, the restart failed (retried next round): %w", rerr)
			// The change is in the key, and is told as such, but not as
			// a restart that did not happen.
			where = fmt.Sprintf("ConfigMap %s key %q; the restart of DaemonSet %s failed and is retried next round", ref, c.cfg.Apply.Key, c.cfg.Apply.DaemonSet)
		}
	}
	if err != nil {
		for _, x := range ds {
			c.applyFailed(ctx, x.w, x.span, d, cur, where, err)
		}
		if newFile == nil {
			return nil
		}
	}
	newCfg := newFile.Config()
	for _, x := range ds {
		c.changed(x.w, x.span, d, cur, c.sem.resource(newCfg), where, now)
		if c.cfg.DryRun {
			continue
		}
		c.expect(x.w, newCfg, d.Replicas, now.Add(c.cfg.Apply.VerifyTimeout))
		c.annotate(ctx, x.w, Record{Time: now, Replicas: d.Replicas, Recommended: x.d.Replicas, Direction: d.Direction, Reason: d.Reason, Message: d.Message,
			LastChangeDirection: d.Direction}, now)
	}
	return nil
}

// sharedConfig is the config sharing looks like on this cluster: the key
// itself, or, while it is at 1 replica, the text saved before the tuner
// made it so, when the key has not been edited since.
func sharedConfig(cm *corev1.ConfigMap, f *dpconfig.File) *dpconfig.File {
	saved := cm.Annotations[AnnotationSharedConfig]
	if f.Replicas() != 1 || saved == "" {
		return f
	}
	sf, err := dpconfig.Parse([]byte(saved))
	if err != nil {
		return f
	}
	probe, _ := dpconfig.Parse([]byte(saved))
	if _, err := probe.SetReplicas(1); err != nil {
		return f
	}
	one, _ := probe.Marshal()
	if cur, _ := f.Marshal(); string(one) != string(cur) {
		return f // edited since: the edit wins
	}
	return sf
}

// writeKey sets the key's replicas from → to, with the last-change
// annotations (time and direction), and returns the config written (in a dry run, the config that
// would be). It never writes over a config that does not parse, and gives
// up with ErrStale when the key no longer holds from replicas. Lowering to
// 1 saves the key's text; raising from 1 starts from it.
func (a restartApplier) writeKey(ctx context.Context, from, to int, stamp string) (*dpconfig.File, error) {
	c := a.c
	var out *dpconfig.File
	_, err := c.updateConfigMap(ctx, func(cm *corev1.ConfigMap) error {
		f, err := c.baseFile(cm)
		if err != nil {
			return err
		}
		if got := f.SharedReplicas(); got != from {
			return fmt.Errorf("%w: ConfigMap %s key %q has %d replicas, the decision saw %d", ErrStale, c.cfg.Apply.ConfigMap, c.cfg.Apply.Key, got, from)
		}
		src := sharedConfig(cm, f)
		if to == 1 {
			cm.Annotations[AnnotationSharedConfig] = cm.Data[c.cfg.Apply.Key]
		} else {
			delete(cm.Annotations, AnnotationSharedConfig)
		}
		if _, err := src.SetSharedReplicasInPlace(to); err != nil {
			return err
		}
		data, err := src.Marshal()
		if err != nil {
			return err
		}
		out = src
		cm.Data[c.cfg.Apply.Key] = string(data)
		cm.Annotations[AnnotationLastChange] = stamp
		cm.Annotations[AnnotationLastChangeDirection] = policy.DirectionUp
		if to < from {
			cm.Annotations[AnnotationLastChangeDirection] = policy.DirectionDown
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// restartIfOwed restarts the DaemonSet when its pods predate the last
// change of the key.
func (a restartApplier) restartIfOwed(ctx context.Context, lastChange time.Time) error {
	c := a.c
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
	return c.restartDaemonSet(ctx, lastChange.UTC().Format(time.RFC3339), time.Time{})
}

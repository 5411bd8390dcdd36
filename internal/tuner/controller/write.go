package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/util/retry"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// The write helpers every Applier uses: each reads the object fresh, lets
// change edit a deep copy (returning errUnchanged when there is nothing to
// write), and writes it with the read resourceVersion and FieldManager,
// redoing all of it from a fresh read on a conflict so that a concurrent
// edit survives.
//
// Nodes and the plugin's DaemonSet are patched, not updated: a PUT sends the
// whole object as this build's client-go knows it, so on a newer cluster it
// would drop the fields added since (a Node's or a pod template's). The
// patch carries only what change edited, plus the resourceVersion read, so
// it still fails with a conflict if the node changed in between. A
// ConfigMap's few fields are all known, and it keeps the plain update.

// errUnchanged, returned by a change function, means nothing to write.
var errUnchanged = errors.New("unchanged")

// updateNode applies change to a fresh copy of the node and writes it.
func (c *Controller) updateNode(ctx context.Context, name string, change func(*corev1.Node) error) error {
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edited := n.DeepCopy()
		if err := change(edited); err != nil {
			return err
		}
		patch, err := nodePatch(n, edited)
		if err != nil || patch == nil {
			return err
		}
		_, err = c.client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager})
		return err
	})
}

// nodePatch is the strategic merge patch from old to edited, holding old's
// resourceVersion as a precondition; nil when they do not differ.
func nodePatch(old, edited *corev1.Node) ([]byte, error) {
	before, err := json.Marshal(old)
	if err != nil {
		return nil, err
	}
	after, err := json.Marshal(edited)
	if err != nil {
		return nil, err
	}
	diff, err := strategicpatch.CreateTwoWayMergePatch(before, after, corev1.Node{})
	if err != nil {
		return nil, fmt.Errorf("node %s: building the patch: %w", old.Name, err)
	}
	var patch map[string]any
	if err := json.Unmarshal(diff, &patch); err != nil {
		return nil, err
	}
	if len(patch) == 0 {
		return nil, nil
	}
	meta, _ := patch["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		patch["metadata"] = meta
	}
	meta["resourceVersion"] = old.ResourceVersion
	return json.Marshal(patch)
}

// updateConfigMap applies change to a fresh copy of the ConfigMap and
// writes it, returning what was written (or read, when unchanged).
func (c *Controller) updateConfigMap(ctx context.Context, change func(*corev1.ConfigMap) error) (*corev1.ConfigMap, error) {
	ref := c.cfg.Apply.ConfigMap
	var out *corev1.ConfigMap
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cm, err := c.client.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		out = cm
		cm = cm.DeepCopy()
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		if err := change(cm); err != nil {
			return err
		}
		if c.cfg.DryRun {
			return nil
		}
		out, err = c.client.CoreV1().ConfigMaps(ref.Namespace).Update(ctx, cm, metav1.UpdateOptions{FieldManager: FieldManager})
		return err
	})
	if errors.Is(err, errUnchanged) {
		return out, nil
	}
	return out, err
}

// restartDaemonSet does what `kubectl rollout restart` does to the device
// plugin's DaemonSet, stamped with the given time: a patch of one pod
// template annotation, which leaves the rest of the DaemonSet as it is and
// needs no precondition (the same stamp twice is the same restart). A
// restart stamped at madeSince or later (an operator's `kubectl rollout
// restart`, say) is one made already, when madeSince is not zero: stamped
// back to an older time, every plugin pod would restart once more for
// nothing. Only a restart owed for configs rewritten long enough ago sets
// it (payRestart): right after a write, a stamp from another machine's
// clock running ahead must not pass for a restart that read the write.
func (c *Controller) restartDaemonSet(ctx context.Context, stamp string, madeSince time.Time) error {
	ref := c.cfg.Apply.DaemonSet
	dss := c.client.AppsV1().DaemonSets(ref.Namespace)
	ds, err := dss.Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	have := ds.Spec.Template.Annotations[AnnotationRestartedAt]
	if have == stamp {
		return nil
	}
	if at, err := time.Parse(time.RFC3339, have); err == nil && !madeSince.IsZero() && !at.Before(madeSince) {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{AnnotationRestartedAt: stamp}}}}})
	if err != nil {
		return err
	}
	if _, err := dss.Patch(ctx, ref.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
		return err
	}
	c.log.Info("device plugin DaemonSet restarted", "daemonset", ref.String(), "restartedAt", stamp)
	return nil
}

func setRecord(m *metav1.ObjectMeta, rec Record) {
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[AnnotationReplicas] = strconv.Itoa(rec.Replicas)
	m.Annotations[AnnotationLastDecision] = rec.String()
}

// annotate records a decision that changed nothing on the node, when its
// count, recommendation or reason differ from the recorded one (messages
// change with every sample; writing each would make every round a write).
//
// A hold after a failed verification is kept unless this leadership has
// taken it over (adopt) and lifted it: a record written before adopt ran
// (a config error seen by a new leader, refuseInvalid) keeps the hold it
// finds, or the next leader, or this one once the config is fixed, would
// change a held node.
func (c *Controller) annotate(ctx context.Context, w *work, rec Record, lastChange time.Time) {
	if c.cfg.DryRun || w.recordErr != nil {
		return // an unreadable record is never overwritten (refuseUnreadable)
	}
	if !lastChange.IsZero() {
		rec.LastChange = &lastChange
		if rec.LastChangeDirection == "" && w.record.lastChange().Equal(lastChange) {
			rec.LastChangeDirection = w.record.lastChangeDirection()
		}
	}
	if h := w.st.held; h != nil {
		rec.Hold = &RecordHold{Until: h.until, Replicas: h.replicas, Resource: h.resource, Allocatable: h.allocatable, Why: h.why}
	} else if !w.st.adopted {
		rec.Hold = w.record.hold()
	}
	if old := w.record; old != nil && old.Replicas == rec.Replicas && old.Recommended == rec.Recommended && old.Reason == rec.Reason &&
		(old.Hold == nil) == (rec.Hold == nil) && w.node.Annotations[AnnotationReplicas] == strconv.Itoa(rec.Replicas) {
		return
	}
	err := c.updateNode(ctx, w.node.Name, func(n *corev1.Node) error {
		cur, err := ParseRecord(n.Annotations[AnnotationLastDecision])
		switch {
		case err != nil:
			// Made unreadable since the round read it: left for the next
			// round to report, not overwritten.
			return errUnchanged
		case cur.lastChange().After(rec.lastChange()):
			// A change written since (by another leader) is newer than this.
			return errUnchanged
		}
		fresh := rec
		if fresh.Hold == nil && !w.st.adopted {
			fresh.Hold = cur.hold()
		}
		setRecord(&n.ObjectMeta, fresh)
		return nil
	})
	switch {
	case err == nil || errors.Is(err, errUnchanged) || apierrors.IsNotFound(err):
	case ctx.Err() != nil:
		c.log.Info("round ended before the node's decision was annotated", "node", w.node.Name, "err", err)
	default:
		c.log.Warn("annotating the node's decision failed", "node", w.node.Name, "err", err)
	}
}

// record reports a verdict that wrote nothing: the node's annotation and,
// for a refusal, a Warning Event and a log line.
func (c *Controller) record(ctx context.Context, now time.Time, w *work, cur int, d policy.Decision, v verdict, lastChange time.Time) {
	if v.eventType != "" {
		c.event(w, v.eventType, v.reason, strconv.Itoa(d.Replicas), "%s", v.message)
		c.log.Warn("change refused", "node", w.node.Name, "reason", v.reason, "msg", v.message)
	}
	c.annotate(ctx, w, Record{Time: now, Replicas: cur, Recommended: d.Replicas, Reason: v.reason, Message: v.message}, lastChange)
}

// refuseInvalid leaves a node whose config does not parse alone.
func (c *Controller) refuseInvalid(ctx context.Context, now time.Time, w *work, err error) {
	c.m.configInvalid.WithLabelValues(w.node.Name).Set(1)
	c.event(w, corev1.EventTypeWarning, ReasonConfigInvalid, err.Error(),
		"%v; the tuner leaves this node and that config as they are until it parses", err)
	c.log.Error("device-plugin config does not parse; node skipped, config left as it is", "node", w.node.Name, "err", err)
	rec := Record{Time: now, Reason: ReasonConfigInvalid, Message: err.Error()}
	if w.record != nil {
		rec.Replicas, rec.Recommended = w.record.Replicas, w.record.Replicas
	}
	c.annotate(ctx, w, rec, w.record.lastChange())
}

// changed records a change that was written (or, in a dry run, would be).
func (c *Controller) changed(w *work, span trace.Span, d policy.Decision, from int, resource, where string, now time.Time) {
	reason, past := ReasonReplicasLowered, "lowered"
	if d.Direction == policy.DirectionUp {
		reason, past = ReasonReplicasRaised, "raised"
	}
	if c.cfg.DryRun {
		past = "would be " + past
	}
	c.event(w, corev1.EventTypeNormal, reason, fmt.Sprintf("%d>%d", from, d.Replicas),
		"replicas per GPU %s %d -> %d (%s): %s: %s", past, from, d.Replicas, where, d.Reason, d.Message)
	c.log.Info("replicas "+past, "node", w.node.Name, "from", from, "to", d.Replicas, "reason", d.Reason, "where", where, "msg", d.Message)
	span.AddEvent("applied")
	if c.cfg.DryRun {
		return
	}
	c.m.changes.WithLabelValues(w.node.Name, resource, d.Direction).Inc()
	c.m.lastChange.WithLabelValues(w.node.Name).Set(float64(now.Unix()))
	c.m.setReplicas(w.st, w.node.Name, resource, d.Replicas, d.Replicas)
	c.mpsLimitsChanged(w, from, d.Replicas)
}

// applyFailed records a write that did not happen. Neither a write
// dropped because its object changed (ErrStale) nor one cut short because
// the round's context ended (leadership lost, or the round's deadline) is
// a refusal by the API server: each is logged, and the node decided again
// next round (by the next leader), without a Warning Event or a count of
// gpuslice_tuner_apply_failures_total, which alert as a write that keeps
// failing.
func (c *Controller) applyFailed(ctx context.Context, w *work, span trace.Span, d policy.Decision, from int, where string, err error) {
	span.RecordError(err)
	if errors.Is(err, ErrStale) {
		c.log.Info("change dropped, deciding again next round", "node", w.node.Name, "err", err)
		return
	}
	if ctx.Err() != nil {
		c.log.Info("round ended before the change was written, deciding again next round", "node", w.node.Name,
			"from", from, "to", d.Replicas, "where", where, "err", err, "cause", context.Cause(ctx))
		return
	}
	c.m.applyFailures.WithLabelValues(w.node.Name).Inc()
	c.event(w, corev1.EventTypeWarning, ReasonApplyFailed, fmt.Sprintf("%d>%d", from, d.Replicas),
		"writing %d -> %d (%s) failed: %v", from, d.Replicas, where, err)
	c.log.Error("writing a change failed", "node", w.node.Name, "from", from, "to", d.Replicas, "where", where, "err", err)
}

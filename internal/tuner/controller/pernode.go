package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// Per-node modes (config-manager and plugin) keep one config per replica
// count in the ConfigMap, <prefix><N> for N in [minReplicas, maxReplicas],
// each the base key (apply.key) with its replicas set to N, and move each
// node's nvidia.com/device-plugin.config label between them. Keeping every
// count there ahead of time means a config-manager sidecar (which reads the
// ConfigMap through a volume, up to a minute late) already has the key when
// the label moves.

// namedKey is the ConfigMap key of the config with n replicas.
func (c *Controller) namedKey(n int) string { return c.cfg.Apply.ConfigPrefix + strconv.Itoa(n) }

// namedReplicas parses a key written by namedKey.
func (c *Controller) namedReplicas(key string) (int, bool) {
	s, ok := strings.CutPrefix(key, c.cfg.Apply.ConfigPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || strconv.Itoa(n) != s {
		return 0, false
	}
	return n, true
}

// baseFile parses the base config afresh (a dpconfig.File is changed in
// place by SetReplicas).
func (c *Controller) baseFile(cm *corev1.ConfigMap) (*dpconfig.File, error) {
	key := c.cfg.Apply.Key
	data, ok := cm.Data[key]
	if !ok {
		return nil, fmt.Errorf("%w: ConfigMap %s has no key %q", ErrConfigInvalid, c.cfg.Apply.ConfigMap, key)
	}
	f, err := dpconfig.Parse([]byte(data))
	if err != nil {
		return nil, fmt.Errorf("%w: ConfigMap %s key %q: %w", ErrConfigInvalid, c.cfg.Apply.ConfigMap, key, err)
	}
	return f, nil
}

// derived returns the base config with n replicas.
func (c *Controller) derived(cm *corev1.ConfigMap, n int) (*dpconfig.File, []byte, error) {
	f, err := c.baseFile(cm)
	if err != nil {
		return nil, nil, err
	}
	if _, err := f.SetReplicas(n); err != nil {
		return nil, nil, err
	}
	out, err := f.Marshal()
	return f, out, err
}

// namedConfigs returns the named keys that differ from what the base says
// they should hold, and the named keys that exist but do not parse (never
// overwritten).
func (c *Controller) namedConfigs(cm *corev1.ConfigMap) (want map[string]string, broken map[string]error, err error) {
	want, broken = map[string]string{}, map[string]error{}
	for k, v := range cm.Data {
		if _, ok := c.namedReplicas(k); ok {
			if _, err := dpconfig.Parse([]byte(v)); err != nil {
				broken[k] = fmt.Errorf("%w: ConfigMap %s key %q: %w", ErrConfigInvalid, c.cfg.Apply.ConfigMap, k, err)
			}
		}
	}
	for n := c.cfg.Policy.MinReplicas; n <= c.cfg.Policy.MaxReplicas; n++ {
		k := c.namedKey(n)
		if broken[k] != nil {
			continue
		}
		_, out, err := c.derived(cm, n)
		if err != nil {
			return nil, nil, err
		}
		if cur, ok := cm.Data[k]; !ok || cur != string(out) {
			want[k] = string(out)
		}
	}
	return want, broken, nil
}

// ensureNamed writes the named configs that are missing or stale and
// returns the ConfigMap as written (or as read, when nothing changed).
func (c *Controller) ensureNamed(ctx context.Context, cm *corev1.ConfigMap) (*corev1.ConfigMap, map[string]error, error) {
	ref := c.cfg.Apply.ConfigMap
	var broken map[string]error
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if cm == nil {
			fresh, err := c.client.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cm = fresh
		}
		want, b, err := c.namedConfigs(cm)
		if err != nil {
			return err
		}
		broken = b
		if len(want) == 0 || c.cfg.DryRun {
			return nil
		}
		upd := cm.DeepCopy()
		if upd.Data == nil {
			upd.Data = map[string]string{}
		}
		maps.Copy(upd.Data, want)
		written, err := c.client.CoreV1().ConfigMaps(ref.Namespace).Update(ctx, upd, metav1.UpdateOptions{FieldManager: FieldManager})
		if err != nil {
			cm = nil // read again before retrying
			return err
		}
		c.log.Info("named device-plugin configs written", "configmap", ref.String(), "keys", len(want))
		cm = written
		return nil
	})
	return cm, broken, err
}

func (c *Controller) roundPerNode(ctx context.Context, now time.Time, ws []*work) error {
	ref := c.cfg.Apply.ConfigMap
	cm, err := c.client.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading ConfigMap %s: %w", ref, err)
	}
	_, baseErr := c.baseFile(cm)
	var broken map[string]error
	if baseErr == nil {
		if cm, broken, err = c.ensureNamed(ctx, cm); err != nil {
			return fmt.Errorf("writing the named configs into ConfigMap %s: %w", ref, err)
		}
	}
	for _, w := range ws {
		c.perNode(ctx, now, w, cm, baseErr, broken)
	}
	return nil
}

// perNode decides and applies for one node.
func (c *Controller) perNode(ctx context.Context, now time.Time, w *work, cm *corev1.ConfigMap, baseErr error, broken map[string]error) {
	name := w.node.Name
	label := w.node.Labels[ConfigLabel]
	var cur *dpconfig.File
	var invalid error
	switch n, named := c.namedReplicas(label); {
	case baseErr != nil:
		invalid = baseErr
	case label == "" || label == c.cfg.Apply.Key:
		cur, invalid = c.baseFile(cm)
	case named && broken[label] != nil:
		invalid = broken[label]
	case named:
		if data, ok := cm.Data[label]; ok {
			cur, invalid = dpconfig.Parse([]byte(data))
			if invalid != nil {
				invalid = fmt.Errorf("%w: ConfigMap %s key %q: %w", ErrConfigInvalid, c.cfg.Apply.ConfigMap, label, invalid)
			}
		} else {
			// Outside [min, max] and deleted by someone: what it held is
			// the base with n replicas.
			cur, _, invalid = c.derived(cm, n)
		}
	default:
		c.event(w, corev1.EventTypeWarning, ReasonConfigNotManaged, label,
			"label %s=%s names a config the tuner does not manage (it manages %q and %s<N>); leaving the node alone",
			ConfigLabel, label, c.cfg.Apply.Key, c.cfg.Apply.ConfigPrefix)
		c.log.Warn("node's config is not managed by the tuner; skipping it", "node", name, "label", label)
		return
	}
	if invalid != nil {
		c.refuseInvalid(ctx, now, w, invalid)
		return
	}
	c.m.configInvalid.WithLabelValues(name).Set(0)

	replicas := cur.Replicas()
	lastChange := w.record.lastChange()
	c.adopt(w, now, replicas, cur.Config())
	c.checkVerify(w, now, replicas)
	d, span := c.decide(ctx, w, replicas, lastChange, now)
	defer span.End()
	c.m.setReplicas(w.st, name, resourceOf(cur.Config()), replicas, d.Replicas)
	if !lastChange.IsZero() {
		c.m.lastChange.WithLabelValues(name).Set(float64(lastChange.Unix()))
	}
	if d.Replicas == replicas {
		c.annotate(ctx, w, Record{Time: now, Replicas: replicas, Recommended: d.Replicas, Reason: d.Reason, Message: d.Message}, lastChange)
		return
	}
	if p := w.st.pending; p != nil && d.Direction == policy.DirectionUp {
		c.annotate(ctx, w, Record{Time: now, Replicas: replicas, Recommended: d.Replicas, Reason: ReasonAwaitingVerify,
			Message: fmt.Sprintf("raise %d -> %d waits until the node advertises %s (deadline %s)", replicas, d.Replicas, p, p.deadline.UTC().Format(time.RFC3339))}, lastChange)
		return
	}
	if h := w.st.held; h != nil {
		c.refuse(ctx, now, w, replicas, d, lastChange, ReasonChangeHeld, "%s %d -> %d (%s) held: %s", verb(d), replicas, d.Replicas, d.Reason, h.why)
		return
	}
	key := c.namedKey(d.Replicas)
	if err := broken[key]; err != nil {
		c.m.configInvalid.WithLabelValues(name).Set(1)
		c.refuse(ctx, now, w, replicas, d, lastChange, ReasonConfigInvalid, "%s %d -> %d refused: %v; the tuner never overwrites it", verb(d), replicas, d.Replicas, err)
		return
	}
	target, _, err := c.derived(cm, d.Replicas)
	if err != nil {
		c.refuse(ctx, now, w, replicas, d, lastChange, ReasonConfigInvalid, "%s %d -> %d refused: %v", verb(d), replicas, d.Replicas, err)
		return
	}

	rec := Record{Time: now, Replicas: d.Replicas, Recommended: d.Replicas, Direction: d.Direction, Reason: d.Reason, Message: d.Message, LastChange: &now}
	where := fmt.Sprintf("label %s=%s", ConfigLabel, key)
	if err := c.moveNode(ctx, name, label, key, rec); err != nil {
		c.applyFailed(w, span, d, replicas, where, err)
		return
	}
	c.changed(w, span, d, replicas, resourceOf(target.Config()), where, now)
	if !c.cfg.DryRun {
		c.expect(w, target.Config(), d.Replicas, now.Add(c.cfg.Apply.VerifyTimeout))
	}
}

// moveNode points the node's config label at key, with the decision's
// annotations in the same update. It gives up with ErrStale when the label
// is no longer the one the decision was made from.
func (c *Controller) moveNode(ctx context.Context, node, from, key string, rec Record) error {
	if c.cfg.DryRun {
		return nil
	}
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := c.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := n.Labels[ConfigLabel]; got != from {
			return fmt.Errorf("%w: node %s label %s is %q, the decision saw %q", ErrStale, node, ConfigLabel, got, from)
		}
		n = n.DeepCopy()
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[ConfigLabel] = key
		setRecord(&n.ObjectMeta, rec)
		_, err = c.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{FieldManager: FieldManager})
		return err
	})
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
func (c *Controller) annotate(ctx context.Context, w *work, rec Record, lastChange time.Time) {
	if c.cfg.DryRun {
		return
	}
	if !lastChange.IsZero() {
		rec.LastChange = &lastChange
	}
	if old := w.record; old != nil && old.Replicas == rec.Replicas && old.Recommended == rec.Recommended && old.Reason == rec.Reason &&
		w.node.Annotations[AnnotationReplicas] == strconv.Itoa(rec.Replicas) {
		return
	}
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := c.client.CoreV1().Nodes().Get(ctx, w.node.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		// A change written since (by another leader) is newer than this.
		if cur := readRecord(n.Annotations[AnnotationLastDecision]); cur.lastChange().After(rec.lastChange()) {
			return nil
		}
		n = n.DeepCopy()
		setRecord(&n.ObjectMeta, rec)
		_, err = c.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{FieldManager: FieldManager})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		c.log.Warn("annotating the node's decision failed", "node", w.node.Name, "err", err)
	}
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

// refuse records a change the policy asked for and the controller did not
// make.
func (c *Controller) refuse(ctx context.Context, now time.Time, w *work, cur int, d policy.Decision, lastChange time.Time, reason, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.event(w, corev1.EventTypeWarning, reason, strconv.Itoa(d.Replicas), "%s", msg)
	c.log.Warn("change refused", "node", w.node.Name, "reason", reason, "msg", msg)
	c.annotate(ctx, w, Record{Time: now, Replicas: cur, Recommended: d.Replicas, Reason: reason, Message: msg}, lastChange)
}

func verb(d policy.Decision) string {
	if d.Direction == policy.DirectionUp {
		return "raise"
	}
	return "lower"
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
}

// applyFailed records a write that did not happen.
func (c *Controller) applyFailed(w *work, span trace.Span, d policy.Decision, from int, where string, err error) {
	span.RecordError(err)
	if errors.Is(err, ErrStale) {
		c.log.Info("change dropped, deciding again next round", "node", w.node.Name, "err", err)
		return
	}
	c.m.applyFailures.WithLabelValues(w.node.Name).Inc()
	c.event(w, corev1.EventTypeWarning, ReasonApplyFailed, fmt.Sprintf("%d>%d", from, d.Replicas),
		"writing %d -> %d (%s) failed: %v", from, d.Replicas, where, err)
	c.log.Error("writing a change failed", "node", w.node.Name, "from", from, "to", d.Replicas, "where", where, "err", err)
}

package controller

import (
	"context"
	"errors"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpuslice/gpuslice/internal/tuner/config"
)

// configManagerApplier is config-manager mode: NVIDIA's plugin with its
// config-manager sidecar, which (v0.19.0, cmd/config-manager) watches only
// the node's nvidia.com/device-plugin.config label, links the key it names
// from the ConfigMap volume and signals the plugin. Measured against that
// code:
//   - a label naming a key the volume does not have yet makes it exit
//     ("specified config … does not exist"); the kubelet refreshes the
//     volume up to about a minute after the API write, so a label moves to
//     a key only apply.propagationDelay after the tuner last wrote its keys;
//   - rewriting a key a node already uses is never applied (no label
//     change): the tuner owes those nodes a plugin restart, and pays it
//     through apply.daemonSet once the new content has propagated;
//   - a node without a label gets DEFAULT_CONFIG, else a key named
//     `default`, else the ConfigMap's only key: the tuner's named keys end
//     the last, so it keeps a `default` copy of apply.key (see DefaultKey).
type configManagerApplier struct{ c *Controller }

func (a configManagerApplier) apply(ctx context.Context, now time.Time, r roundInput) error {
	return a.c.perNodeApply(ctx, now, r, func(cm *corev1.ConfigMap) time.Time {
		if !a.c.cfg.DryRun {
			a.payRestart(ctx, now, cm)
		}
		t := annotationTime(cm.Annotations, AnnotationConfigsWritten)
		if t.IsZero() {
			return t
		}
		return t.Add(a.c.cfg.Apply.PropagationDelay)
	})
}

// payRestart restarts NVIDIA's DaemonSet once rewritten keys that nodes use
// have reached the volume, or says on each such node that it keeps the old
// config when the tuner has no DaemonSet to restart.
func (a configManagerApplier) payRestart(ctx context.Context, now time.Time, cm *corev1.ConfigMap) {
	c := a.c
	v := cm.Annotations[AnnotationRestartOwed]
	at, keys := parseRestartOwed(v)
	if at.IsZero() || now.Before(at.Add(c.cfg.Apply.PropagationDelay)) {
		return
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return
	}
	var using []*corev1.Node
	var used []string // the key each of using reads
	copied := c.keepsDefault(cm)
	for _, n := range nodes {
		key := n.Labels[ConfigLabel]
		if key == "" && copied && hasGPUs(n) {
			// A GPU node the tuner never labelled reads the `default`
			// copy under NVIDIA's "named" fallback (DefaultKey). Where
			// the chart sets a default config instead, the restart may
			// be one it did not need, but never one it misses.
			key = DefaultKey
		}
		if slices.Contains(keys, key) {
			using, used = append(using, n), append(used, key)
		}
	}
	switch {
	case len(using) == 0:
	case c.cfg.Apply.DaemonSet == (config.ObjectRef{}):
		for i, n := range using {
			c.rec.Eventf(nodeRef(n.Name), corev1.EventTypeWarning, ReasonConfigRewritten,
				"config %s was rewritten; NVIDIA's config-manager applies a config only when the label changes, so this node's plugin keeps the old one until it restarts (set apply.daemonSet to let the tuner restart it)",
				used[i])
		}
	default:
		// A restart made once the rewritten configs could reach every
		// node's volume (apply.propagationDelay after the write) read
		// them; one made before may not have.
		if err := c.restartDaemonSet(ctx, at.UTC().Format(time.RFC3339), at.Add(c.cfg.Apply.PropagationDelay)); err != nil {
			c.log.Error("restarting the device plugin for rewritten configs failed; retrying next round", "err", err, "keys", keys)
			return
		}
	}
	_, err = c.updateConfigMap(ctx, func(cm *corev1.ConfigMap) error {
		if cm.Annotations[AnnotationRestartOwed] != v {
			return errUnchanged // owed again since: paid later
		}
		delete(cm.Annotations, AnnotationRestartOwed)
		return nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		c.log.Warn("clearing the owed restart failed", "err", err)
	}
}

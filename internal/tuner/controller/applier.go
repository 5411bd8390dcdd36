package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/tuner/config"
)

// applier writes one round's decisions the way the cluster's device plugin
// reads its config: one per apply mode.
type applier interface {
	apply(ctx context.Context, now time.Time, r roundInput) error
}

// roundInput is what gathering found: the nodes with signals, and the
// selected GPU nodes without any.
type roundInput struct {
	ws          []*work
	unsignalled []string
}

func newApplier(c *Controller) applier {
	switch c.cfg.Apply.Mode {
	case config.ModeRestart:
		return restartApplier{c}
	case config.ModeConfigManager:
		return configManagerApplier{c}
	}
	return pluginApplier{c}
}

// pluginApplier is plugin mode: gpuslice-plugin reads the node's key
// through the API and re-advertises at once, so a named config is usable
// the moment it is written.
type pluginApplier struct{ c *Controller }

func (a pluginApplier) apply(ctx context.Context, now time.Time, r roundInput) error {
	return a.c.perNodeApply(ctx, now, r, func(*corev1.ConfigMap) time.Time { return time.Time{} })
}

// perNodeApply is the round of both per-node modes: read the ConfigMap,
// write the named configs it lacks when its base parses, let the mode
// prepare (prepare returns when the named configs are visible to the
// nodes' plugins), and walk the nodes.
func (c *Controller) perNodeApply(ctx context.Context, now time.Time, r roundInput, prepare func(*corev1.ConfigMap) time.Time) error {
	ref := c.cfg.Apply.ConfigMap
	cm, err := c.client.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading ConfigMap %s: %w", ref, err)
	}
	var broken map[string]error
	if _, err := c.baseFile(cm); err == nil { // else every node is refused with that error
		if cm, broken, err = c.ensureNamed(ctx); err != nil {
			return fmt.Errorf("writing the named configs into ConfigMap %s: %w", ref, err)
		}
	}
	c.perNodeRound(ctx, now, r.ws, cm, broken, prepare(cm))
	return nil
}

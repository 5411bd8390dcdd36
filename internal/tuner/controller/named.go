package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
)

// Per-node modes (config-manager and plugin) keep one config per replica
// count in the ConfigMap, <prefix><N> for N in [minReplicas, maxReplicas],
// each the base key (apply.key) with its replicas set to N, and move each
// node's nvidia.com/device-plugin.config label between them. Keeping every
// count there ahead of time means a config-manager sidecar (which reads the
// ConfigMap through a volume, up to a minute late) already has the key when
// the label moves.

// Annotations on the ConfigMap in the per-node modes.
const (
	// AnnotationConfigsWritten is when the tuner last wrote a named config
	// (RFC 3339): config-manager sees it apply.propagationDelay later.
	AnnotationConfigsWritten = "gpuslice.io/configs-written"
	// AnnotationRestartOwed is when the tuner rewrote keys that existed
	// before, and which ("<RFC 3339> key,key"): nodes using them get the new
	// content at their plugin's next restart, which the tuner owes them
	// (config-manager mode).
	AnnotationRestartOwed = "gpuslice.io/restart-owed"
	// AnnotationDefaultCopy marks a `default` key the tuner keeps as a copy
	// of apply.key (config-manager mode; see DefaultKey).
	AnnotationDefaultCopy = "gpuslice.io/default-copy"
)

// DefaultKey is the key NVIDIA's config-manager falls back to for a node
// without a label when no default is configured (its "named" fallback; the
// chart's fallbackStrategies are ["named", "single"]). The "single"
// fallback, which picks a ConfigMap's only key, stops working once the
// tuner adds its named keys, so in config-manager mode the tuner keeps a
// `default` key equal to apply.key, unless the ConfigMap already has one of
// its own.
const DefaultKey = "default"

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
	if _, err := f.SetSharedReplicas(n); err != nil {
		return nil, nil, err
	}
	out, err := f.Marshal()
	return f, out, err
}

// keepsDefault says whether the tuner keeps the `default` key of cm.
func (c *Controller) keepsDefault(cm *corev1.ConfigMap) bool {
	if c.cfg.Apply.Mode != config.ModeConfigManager || c.cfg.Apply.Key == DefaultKey {
		return false
	}
	_, exists := cm.Data[DefaultKey]
	return !exists || cm.Annotations[AnnotationDefaultCopy] == "true"
}

// namedConfigs returns the keys the tuner keeps that differ from what the
// base says they should hold, and the named keys that exist but do not
// parse (never overwritten).
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
		if broken[k] != nil || n < c.namedFloor(cm) {
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
	if base := cm.Data[c.cfg.Apply.Key]; c.keepsDefault(cm) && cm.Data[DefaultKey] != base {
		want[DefaultKey] = base
	}
	return want, broken, nil
}

// ensureNamed writes the keys that are missing or stale, with the time
// they were written and, when a key that existed changed, the restart
// that nodes using it are owed. It returns the ConfigMap as written (or as
// read, when nothing changed).
func (c *Controller) ensureNamed(ctx context.Context) (*corev1.ConfigMap, map[string]error, error) {
	var broken map[string]error
	out, err := c.updateConfigMap(ctx, func(fresh *corev1.ConfigMap) error {
		want, b, err := c.namedConfigs(fresh)
		if err != nil {
			return err
		}
		broken = b
		if len(want) == 0 {
			return errUnchanged
		}
		// When the write is made, not when the round began: gathering the
		// signals may take half a minute, which would shorten the wait
		// for the nodes' ConfigMap volumes (apply.propagationDelay).
		stamp := c.now().UTC().Format(time.RFC3339)
		var rewritten []string
		for k := range want {
			if _, existed := fresh.Data[k]; existed {
				rewritten = append(rewritten, k)
			}
		}
		if len(rewritten) > 0 {
			_, owed := parseRestartOwed(fresh.Annotations[AnnotationRestartOwed])
			rewritten = append(rewritten, owed...)
			slices.Sort(rewritten)
			fresh.Annotations[AnnotationRestartOwed] = stamp + " " + strings.Join(slices.Compact(rewritten), ",")
		}
		if _, ok := want[DefaultKey]; ok {
			fresh.Annotations[AnnotationDefaultCopy] = "true"
		}
		maps.Copy(fresh.Data, want)
		fresh.Annotations[AnnotationConfigsWritten] = stamp
		if c.cfg.DryRun {
			// Nothing is written, so every round finds the keys missing
			// again: say it once per round at debug level only.
			c.log.Debug("named device-plugin configs would be written (dry run)", "configmap", c.cfg.Apply.ConfigMap.String(), "keys", len(want))
		} else {
			c.log.Info("named device-plugin configs written", "configmap", c.cfg.Apply.ConfigMap.String(), "keys", len(want))
		}
		return nil
	})
	return out, broken, err
}

// parseRestartOwed reads an AnnotationRestartOwed value.
func parseRestartOwed(v string) (time.Time, []string) {
	stamp, keys, _ := strings.Cut(v, " ")
	t, err := time.Parse(time.RFC3339, stamp)
	if err != nil || keys == "" {
		return time.Time{}, nil
	}
	return t, strings.Split(keys, ",")
}

// annotationTime reads an RFC 3339 annotation, zero when absent or bad.
func annotationTime(m map[string]string, key string) time.Time {
	t, _ := time.Parse(time.RFC3339, m[key])
	return t
}

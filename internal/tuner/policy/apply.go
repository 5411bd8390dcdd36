package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Apply modes, as tuner.yaml's apply.mode names them, plus ModeInstant for
// replays that want a change to take effect at once (the replay of earlier
// releases).
const (
	ModePlugin        = "plugin"
	ModeRestart       = "restart"
	ModeConfigManager = "config-manager"
	ModeInstant       = "instant"
)

// ApplyCost is what one change of the count costs in an apply mode, as
// measured on the real test node (kubelet v1.37.1, containerd; README,
// "On the real node", and docs/tuner.md):
//
//   - plugin: gpuslice-plugin re-advertises at once, and the scheduler sees
//     the new count at the kubelet's next node-status update: 5.6–10.2 s
//     measured, 10 s by default (nodeStatusUpdateFrequency). Nothing
//     restarts, so admissions never stop.
//   - restart: NVIDIA's DaemonSet is rolled: 10.2–10.3 s from the write to
//     the new count in Node.status; while the plugin is down its devices
//     are unhealthy and the kubelet admits nothing.
//   - config-manager: the node's label moves to a config written up front
//     (its apply.propagationDelay is paid once, when the configs are
//     written, not per change); NVIDIA's config-manager restarts the plugin:
//     3.8–5.7 s from the label flip to the new count in Node.status, with the
//     plugin down meanwhile.
type ApplyCost struct {
	Mode string
	// Latency is from the decision to the new count in effect.
	Latency time.Duration
	// Blackout is how long before the new count takes effect the node
	// admits no pod at all (the device plugin restarting).
	Blackout time.Duration
}

// applyCosts are the measured costs of each mode (ApplyCost's doc).
var applyCosts = []ApplyCost{
	{Mode: ModePlugin, Latency: 10 * time.Second},
	{Mode: ModeRestart, Latency: 11 * time.Second, Blackout: 11 * time.Second},
	{Mode: ModeConfigManager, Latency: 6 * time.Second, Blackout: 6 * time.Second},
	{Mode: ModeInstant},
}

// ApplyCostOf returns the cost of a change in mode.
func ApplyCostOf(mode string) (ApplyCost, error) {
	for _, c := range applyCosts {
		if c.Mode == mode {
			return c, nil
		}
	}
	names := make([]string, 0, len(applyCosts))
	for _, c := range applyCosts {
		names = append(names, c.Mode)
	}
	slices.Sort(names)
	return ApplyCost{}, fmt.Errorf("%w: unknown apply mode %q (known: %s)", ErrInvalidConfig, mode, strings.Join(names, ", "))
}

// Settle is how long a change in this mode stands before the count may
// move the other way: its latency, then Config.Settle. A change undone
// sooner, with no GPU OOM between, is a reversal: it paid twice for
// nothing an OOM proved.
func (c ApplyCost) Settle(cfg Config) time.Duration { return c.Latency + cfg.Settle }

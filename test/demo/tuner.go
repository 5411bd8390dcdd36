package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
	"github.com/gpuslice/gpuslice/internal/tuner/signals"
	"github.com/gpuslice/gpuslice/test/simnode"
)

// demoPolicy is the tuner's policy with its windows shrunk from minutes to
// seconds, so the demo shows a raise and a lowering in under a minute. The
// rules are the shipped ones (docs/tuner-policy.md).
func demoPolicy() policy.Config {
	c := policy.DefaultConfig()
	c.SampleInterval = time.Second
	c.Window = 6 * time.Second
	c.Cooldown = 6 * time.Second
	c.PressureWindow = 3 * time.Second
	c.Settle = 6 * time.Second
	return c
}

// tunerLoop runs the tuner's own signal gathering (the `exporters` source,
// scraping the exporter like gpuslice-tuner does) and its policy every
// second, and applies each decision to the simulated node the way
// gpuslice-plugin would: the kubelet advertises the new replica count. The
// real controller also writes a ConfigMap and a node label through the API
// server; that part runs on the real node (test/realnode, TestClosedLoop).
type tunerLoop struct {
	node       *simnode.Node
	src        *signals.Exporters
	cfg        policy.Config
	out        io.Writer
	lastChange time.Time
	// lastDirection and mem are carried between rounds as the controller
	// carries them.
	lastDirection string
	mem           policy.Memory
}

func newTunerLoop(node *simnode.Node, url string, out io.Writer) (*tunerLoop, error) {
	cfg := demoPolicy()
	ex := config.Default().Signals.Exporters
	ex.Targets = []config.Target{{Node: node.Name, URL: url}}
	src, err := signals.NewExporters(signals.ExportersOptions{Config: ex, Interval: cfg.SampleInterval, Keep: 2 * cfg.Window})
	if err != nil {
		return nil, err
	}
	return &tunerLoop{node: node, src: src, cfg: cfg, out: out}, nil
}

// step decides once and applies a change; it returns the decision.
func (l *tunerLoop) step(ctx context.Context) (policy.Decision, error) {
	now := time.Now()
	obs, err := l.src.Observe(ctx, now, l.cfg.Window)
	if err != nil {
		return policy.Decision{}, err
	}
	g := l.node.GPUs[0]
	// Round, as the controller calls it: the workload memory carried from
	// round to round is what tells a service that ran before the tuner came
	// from a job that came since.
	d, mem := policy.Round(l.cfg, policy.Observation{
		Node: l.node.Name, Now: now, CurrentReplicas: g.Replicas, LastChange: l.lastChange, LastDirection: l.lastDirection,
		GPUs: obs[l.node.Name], Memory: l.mem,
	})
	l.mem = mem
	if d.Replicas != g.Replicas {
		fmt.Fprintf(l.out, "tuner: %s %d → %d (%s): %s\n", map[string]string{"up": "raise", "down": "lower"}[d.Direction], g.Replicas, d.Replicas, d.Reason, d.Message)
		g.Replicas = d.Replicas
		l.lastChange, l.lastDirection = now, d.Direction
		if err := l.node.Sync(); err != nil {
			return d, err
		}
	}
	return d, nil
}

// until runs step every second until done says so or the time is up.
func (l *tunerLoop) until(ctx context.Context, limit time.Duration, done func(policy.Decision) bool) (policy.Decision, error) {
	deadline := time.Now().Add(limit)
	var last policy.Decision
	for time.Now().Before(deadline) {
		d, err := l.step(ctx)
		if err != nil {
			return d, err
		}
		last = d
		if done(d) {
			return d, nil
		}
		select {
		case <-ctx.Done():
			return d, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return last, fmt.Errorf("tuner: no such decision within %s (last: %s: %s)", limit, last.Reason, last.Message)
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
	"github.com/gpuslice/gpuslice/internal/tuner/sim"
)

// simulateCommand replays --trace under --policy and prints the sim.Result as
// one JSON object on stdout. Of --config only the policy section and
// apply.mode are used; the controller's other sections need not be complete
// (no ConfigMap named, say), so one tuner.yaml serves both commands, but the
// file is read as `run` reads it, so a key `run` would refuse is refused
// here too (readSimulateConfig).
//
// --apply-mode replays what a change costs in that mode (policy.ApplyCost: a
// new count takes effect only after its latency, and the node admits nothing
// during its blackout); without it the config's apply.mode is replayed, so
// a replay of a cluster's own tuner.yaml charges that cluster's costs, and
// without either, plugin, the mode the chart installs.
func simulateCommand(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tracePath := fs.String("trace", "", "trace file to replay (required)")
	policyName := fs.String("policy", "tuner", "tuner, or static:N for a fixed replica count")
	configPath := fs.String("config", "", "tuner.yaml whose policy section configures the tuner policy (default: built-in defaults)")
	applyMode := fs.String("apply-mode", "", "plugin, restart, config-manager or instant: whose change latency to replay (default: the --config's apply.mode, else plugin)")
	var evict optionalBool
	fs.Var(&evict, "evict-crash-loops", "evict a pod that OOMs again and again (overrides the --config's policy.evictCrashLoops)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: simulate: %w", errUsage, err)
	}
	if *tracePath == "" {
		return fmt.Errorf("%w: simulate: --trace is required", errUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: simulate: unexpected argument %q", errUsage, fs.Arg(0))
	}

	cfg := policy.DefaultConfig()
	mode := policy.ModePlugin
	if *configPath != "" {
		data, err := os.ReadFile(*configPath)
		if err != nil {
			return fmt.Errorf("simulate: --config: %w", err)
		}
		var m string
		if cfg, m, err = readSimulateConfig(data); err != nil {
			return fmt.Errorf("simulate: --config %s: %w", *configPath, err)
		}
		if m != "" {
			mode = m
		}
	}
	if *applyMode != "" {
		mode = *applyMode
	}
	cost, err := policy.ApplyCostOf(mode)
	if err != nil {
		if *applyMode != "" {
			return fmt.Errorf("%w: simulate: --apply-mode: %w", errUsage, err)
		}
		return fmt.Errorf("simulate: --config %s: apply.mode: %w", *configPath, err)
	}
	if evict.set {
		cfg.EvictCrashLoops = evict.value
	}
	pol, err := sim.ParsePolicy(*policyName, cfg)
	if errors.Is(err, sim.ErrBadPolicy) {
		return fmt.Errorf("%w: simulate: --policy: %w", errUsage, err)
	} else if err != nil {
		return fmt.Errorf("simulate: --policy: %w", err)
	}
	tr, err := sim.ReadTrace(*tracePath)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	// A static policy never changes the count, so the mode costs it
	// nothing; it is passed anyway so that the output names the mode.
	res, err := sim.RunWith(tr, pol, sim.Options{Apply: cost})
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// readSimulateConfig reads a tuner.yaml for a replay: its policy section
// over the defaults, validated, and its apply.mode ("" when it sets none).
// It decodes the whole file into config.Config as `run`'s loader does, so an
// unknown key anywhere is an error naming it and its line (`polcy:` left
// silently on the defaults would replay another policy than the cluster
// runs), but it validates only the policy: a file whose controller sections
// are incomplete for `run` still configures a replay.
func readSimulateConfig(data []byte) (policy.Config, string, error) {
	c, err := config.Decode(data)
	if err != nil {
		return policy.Config{}, "", err
	}
	if err := c.Policy.Validate(); err != nil {
		return policy.Config{}, "", err
	}
	return c.Policy, c.Apply.Mode, nil
}

// optionalBool is a boolean flag that knows whether it was given, so that
// --evict-crash-loops overrides the config only when it is on the command
// line (either way: --evict-crash-loops=false turns off what the config
// turned on).
type optionalBool struct{ set, value bool }

func (b *optionalBool) String() string {
	if b == nil {
		return "false"
	}
	return strconv.FormatBool(b.value)
}

func (b *optionalBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	b.set, b.value = true, v
	return nil
}

// IsBoolFlag lets the flag be given without a value.
func (*optionalBool) IsBoolFlag() bool { return true }

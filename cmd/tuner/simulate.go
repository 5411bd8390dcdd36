package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
	"github.com/gpuslice/gpuslice/internal/tuner/sim"
)

// simulateCommand replays --trace under --policy and prints the sim.Result as
// one JSON object on stdout. Of --config only the policy section is read; the
// controller's sections are ignored so one tuner.yaml serves both commands.
func simulateCommand(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tracePath := fs.String("trace", "", "trace file to replay (required)")
	policyName := fs.String("policy", "tuner", "tuner, or static:N for a fixed replica count")
	configPath := fs.String("config", "", "tuner.yaml whose policy section configures the tuner policy (default: built-in defaults)")
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
	if *configPath != "" {
		data, err := os.ReadFile(*configPath)
		if err != nil {
			return fmt.Errorf("simulate: --config: %w", err)
		}
		if cfg, err = policy.ConfigFromYAML(data); err != nil {
			return fmt.Errorf("simulate: --config %s: %w", *configPath, err)
		}
	}
	pol, err := sim.ParsePolicy(*policyName, cfg)
	if err != nil {
		return fmt.Errorf("simulate: --policy: %w", err)
	}
	tr, err := sim.ReadTrace(*tracePath)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	res, err := sim.Run(tr, pol)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// Command gpuslice-tuner decides how many pods may share each GPU of a node
// from measured VRAM headroom and GPU OOM events. `run` is the controller;
// `simulate` replays a trace offline through the same policy code; `status`
// prints who shares which GPU, from the API server and the exporters.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

const usage = `usage:
  gpuslice-tuner run --config tuner.yaml
  gpuslice-tuner simulate --trace trace.yaml [--policy tuner|static:N] [--config tuner.yaml]
                          [--apply-mode plugin|restart|config-manager|instant] [--evict-crash-loops]
  ` + statusSynopsis

// errUsage marks a command line that could not be understood.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal starts a graceful shutdown; a second one, given
	// the default handling back, ends the program at once.
	context.AfterFunc(ctx, stop)
	err := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuslice-tuner:", err)
		if errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// dispatch runs the subcommand named by args[0].
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: no subcommand", errUsage)
	}
	switch args[0] {
	case "run":
		return runCommand(ctx, args[1:])
	case "simulate":
		return simulateCommand(ctx, args[1:], stdout, stderr)
	case "status":
		return statusCommand(ctx, args[1:], stdout, stderr, time.Now)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
}

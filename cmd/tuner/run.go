package main

import (
	"context"
	"errors"
)

// runCommand is a TEMPORARY STUB: the controller (`gpuslice-tuner run`) is
// written separately and replaces this whole file.
func runCommand(ctx context.Context, args []string) error {
	return errors.New("run: not implemented yet")
}

package exporter

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/gpuslice/gpuslice/internal/attribution"
	"github.com/gpuslice/gpuslice/internal/cgroup"
	"github.com/gpuslice/gpuslice/internal/gpu"
)

// procReader resolves GPU process PIDs to pods through /proc.
type procReader struct {
	root string
	log  *slog.Logger
	// warned remembers PIDs whose cgroup file was malformed, so a garbage
	// file is logged once, not at every scrape.
	warned map[int]bool
}

func newProcReader(root string, log *slog.Logger) *procReader {
	return &procReader{root: root, log: log, warned: map[int]bool{}}
}

// read returns the pod of every PID in devs, and the PIDs that vanished.
// The error is set when /proc itself cannot be read, or a cgroup file could
// not be read for a reason other than the process exiting.
func (p *procReader) read(devs []gpu.Device) (map[int]attribution.ProcessRef, map[int]bool, error) {
	refs := map[int]attribution.ProcessRef{}
	gone := map[int]bool{}
	if _, err := os.Stat(p.root); err != nil {
		return refs, gone, fmt.Errorf("procfs %s: %w", p.root, err)
	}
	var firstErr error
	seen := map[int]bool{}
	for _, d := range devs {
		for _, proc := range d.Processes {
			if seen[proc.PID] {
				continue
			}
			seen[proc.PID] = true
			ref, err := cgroup.ReadPID(p.root, proc.PID)
			switch {
			case err == nil:
				refs[proc.PID] = attribution.ProcessRef{PodUID: ref.PodUID, ContainerID: ref.ContainerID}
				delete(p.warned, proc.PID)
			case errors.Is(err, cgroup.ErrProcessGone):
				gone[proc.PID] = true
			case errors.Is(err, cgroup.ErrNotInPod):
				// A host process: unattributed.
			case errors.Is(err, cgroup.ErrMalformed):
				if !p.warned[proc.PID] {
					p.warned[proc.PID] = true
					p.log.Warn("unreadable cgroup file; process counted as unattributed", "pid", proc.PID, "err", err)
				}
			default:
				if firstErr == nil {
					firstErr = err
				}
			}
		}
	}
	for pid := range p.warned {
		if !seen[pid] {
			delete(p.warned, pid)
		}
	}
	return refs, gone, firstErr
}

package exporter

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
)

// TestInvalidPIDIsUnattributed: a GPU process listed with PID 0 (none in
// this PID namespace) counts as unattributed; the procfs collector, which
// read every other process, does not fail for it.
func TestInvalidPIDIsUnattributed(t *testing.T) {
	fake := gputest.NewFake(gputest.GPU(gputest.UUID(0), 1<<30, gputest.Proc(0, 1<<20, 0.1)))
	e := New(Config{GPU: fake, Procfs: t.TempDir()})
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)
	if got := success(t, reg, "procfs"); got != "1" {
		t.Errorf("procfs success %s with a PID 0 listed, want 1", got)
	}
	if l := lines(t, reg, "gpuslice_unattributed_gpu_memory_used_bytes"); len(l) != 1 || l[0][len(l[0])-len(" 1.048576e+06"):] != " 1.048576e+06" {
		t.Errorf("unattributed memory: %v, want the PID 0 process's 1 MiB", l)
	}
}

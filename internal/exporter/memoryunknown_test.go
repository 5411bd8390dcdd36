package exporter

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/test/simnode"
)

// naBackend is a backend whose driver gives one PID's memory as not
// available, as NVML's NVML_VALUE_NOT_AVAILABLE.
type naBackend struct {
	gpu.Backend
	pid int
	on  bool
}

func (b *naBackend) Snapshot(ctx context.Context) (gpu.Snapshot, error) {
	s, err := b.Backend.Snapshot(ctx)
	if err != nil || !b.on {
		return s, err
	}
	// The backend may share its devices: copy what is changed.
	devs := make([]gpu.Device, len(s.Devices))
	for i, d := range s.Devices {
		d.Processes = append([]gpu.Process(nil), d.Processes...)
		for j := range d.Processes {
			if d.Processes[j].PID == b.pid {
				d.Processes[j].UsedMemoryBytes, d.Processes[j].MemoryUnknown = 0, true
			}
		}
		devs[i] = d
	}
	s.Devices = devs
	return s, nil
}

// TestMemoryNotAvailable: a container one of whose processes the driver
// gives no memory figure for has no memory series (a 0 would undercount
// it to the tuner and the dashboards) but keeps its other series; the
// GPU's unattributed memory likewise when such a process is no pod's.
// The log says when it starts and when it ends.
func TestMemoryNotAvailable(t *testing.T) {
	d := newDemo(t)
	var logs bytes.Buffer
	d.exp.log = slog.New(slog.NewTextHandler(&logs, nil))
	before := lines(t, d.reg, "gpuslice_container_gpu_memory_used_bytes")
	if len(before) != 4 {
		t.Fatalf("demo: %d container memory series, want 4: %v", len(before), before)
	}
	// One process of one container of the demo node.
	var pid int
	var pod string
	for _, p := range d.node.Pods {
		for _, c := range p.Containers {
			if len(c.Processes) > 0 && pid == 0 {
				pid, pod = c.Processes[0].PID, p.Name
			}
		}
	}
	if pid == 0 {
		t.Fatal("demo node: no pod process")
	}
	na := &naBackend{Backend: d.exp.cfg.GPU, pid: pid, on: true}
	d.exp.cfg.GPU = na

	got := lines(t, d.reg, "gpuslice_container_gpu_memory_used_bytes")
	if len(got) != 3 || strings.Contains(strings.Join(got, "\n"), `pod="`+pod+`"`) {
		t.Errorf("memory not available for pod %s: container memory series %v, want the other 3", pod, got)
	}
	if l := lines(t, d.reg, "gpuslice_container_gpu_processes", `pod="`+pod+`"`); len(l) != 1 {
		t.Errorf("pod %s lost its process series: %v", pod, l)
	}
	if !strings.Contains(logs.String(), "not available") {
		t.Errorf("no log line says why the series is gone:\n%s", logs.String())
	}

	na.on = false
	if got := lines(t, d.reg, "gpuslice_container_gpu_memory_used_bytes"); len(got) != 4 {
		t.Errorf("memory available again: %d series, want 4", len(got))
	}
	if !strings.Contains(logs.String(), "again") {
		t.Errorf("no log line says the figures came back:\n%s", logs.String())
	}

	// With /proc unreadable every process is unattributed: the GPU's
	// unattributed figure would be a lower bound.
	d.exp.proc = newProcReader(d.node.Procfs()+"-missing", d.exp.log)
	na.on = true
	if l := lines(t, d.reg, "gpuslice_unattributed_gpu_memory_used_bytes"); len(l) != 0 {
		t.Errorf("unattributed memory with a process's memory not available: %v", l)
	}
}

// TestMPSServerMemoryNotAvailable: an MPS server whose memory the driver
// does not give has no server-memory series rather than a 0.
func TestMPSServerMemoryNotAvailable(t *testing.T) {
	n, err := simnode.New("mps-na", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	g0 := simnode.GPUUUID("mps-na", 0)
	n.GPUs = []*simnode.GPU{{UUID: g0, MemoryBytes: 48 << 30, Replicas: 4,
		HostProcesses: []simnode.Process{{PID: 900, GPU: g0, MemoryBytes: 66 << 20, MPSServer: true}}}}
	e, reg := exporterWithOOM(t, n)
	if l := lines(t, reg, "gpuslice_gpu_mps_server_memory_used_bytes"); len(l) != 1 {
		t.Fatalf("MPS server memory series %v, want 1", l)
	}
	e.cfg.GPU = &naBackend{Backend: e.cfg.GPU, pid: 900, on: true}
	if l := lines(t, reg, "gpuslice_gpu_mps_server_memory_used_bytes"); len(l) != 0 {
		t.Errorf("MPS server memory not available: series %v, want none", l)
	}
}

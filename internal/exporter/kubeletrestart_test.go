package exporter

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
	"github.com/gpuslice/gpuslice/internal/podresources"
)

// restartingKubelet answers PodResources from a list the test sets, on a
// socket file the test swaps for a new one as a restarted kubelet does.
type restartingKubelet struct {
	mu          sync.Mutex
	list        []podresources.Allocation
	allocatable []podresources.Allocatable
	socket      *podresources.Client // only its Instance is used
}

func (k *restartingKubelet) List(context.Context) ([]podresources.Allocation, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.list, nil
}

func (k *restartingKubelet) Allocatable(context.Context) ([]podresources.Allocatable, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.allocatable, nil
}

func (k *restartingKubelet) Instance() podresources.Instance {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.socket.Instance()
}

func (k *restartingKubelet) set(socket *podresources.Client, list []podresources.Allocation) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.socket, k.list = socket, list
}

// TestKubeletRestart: a restarted kubelet's empty PodResources list is not
// taken for every pod gone while the kubelet may not have read its pods
// back: the scrape shows no allocation or idle series rather than series
// that reset, and a holder's idle clock keeps running through it. Once the
// grace has passed, an empty list is believed.
func TestKubeletRestart(t *testing.T) {
	uuid := gputest.UUID(0)
	// Socket files of three kubelet runs, told apart by their Instance.
	dir := t.TempDir()
	socket := map[string]*podresources.Client{}
	for _, name := range []string{"first", "second", "third"} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := podresources.NewClient(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		socket[name] = c
	}
	notebook := []podresources.Allocation{{Namespace: "ml", Pod: "notebook", Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{uuid + "::0"}}}
	kubelet := &restartingKubelet{
		allocatable: []podresources.Allocatable{{Resource: "nvidia.com/gpu", DeviceIDs: []string{uuid + "::0", uuid + "::1"}}},
	}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	var now time.Time
	e := New(Config{
		GPU:     gputest.NewFake(gputest.GPU(uuid, gputest.A6000MemoryBytes)),
		Kubelet: kubelet, Procfs: t.TempDir(),
		Now: func() time.Time { return now },
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)

	const (
		idle      = "gpuslice_container_gpu_idle_seconds"
		alloc     = "gpuslice_container_gpu_allocation"
		allocated = "gpuslice_gpu_replicas_allocated"
		success   = "gpuslice_exporter_collect_success"
	)
	steps := []struct {
		name   string
		at     time.Duration
		socket string
		list   []podresources.Allocation
		want   map[string]float64 // absent: no series
	}{
		{name: "first sight", socket: "first", list: notebook,
			want: map[string]float64{idle: 0, alloc: 1, allocated: 1, success: 1}},
		{name: "idle for an hour", at: time.Hour, socket: "first", list: notebook,
			want: map[string]float64{idle: 3600, alloc: 1, allocated: 1, success: 1}},
		{name: "kubelet restarted, empty list: not ready", at: time.Hour + time.Minute, socket: "second",
			want: map[string]float64{success: 0}},
		{name: "the pods read back: the clock kept running", at: time.Hour + 90*time.Second, socket: "second", list: notebook,
			want: map[string]float64{idle: 3690, alloc: 1, allocated: 1, success: 1}},
		{name: "an empty list from the same kubelet is believed", at: 2 * time.Hour, socket: "second",
			want: map[string]float64{allocated: 0, success: 1}},
		{name: "the holder again: a new clock", at: 3 * time.Hour, socket: "second", list: notebook,
			want: map[string]float64{idle: 0, alloc: 1, allocated: 1, success: 1}},
		{name: "restarted again, empty list", at: 4 * time.Hour, socket: "third",
			want: map[string]float64{success: 0}},
		{name: "still empty within the grace", at: 4*time.Hour + 119*time.Second, socket: "third",
			want: map[string]float64{success: 0}},
		{name: "still empty after the grace: believed", at: 4*time.Hour + 2*time.Minute, socket: "third",
			want: map[string]float64{allocated: 0, success: 1}},
	}
	for _, s := range steps {
		now = t0.Add(s.at)
		kubelet.set(socket[s.socket], s.list)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				switch name := mf.GetName(); {
				case name == success && labels["collector"] == CollectorPodResources:
					got[name] = m.GetGauge().GetValue()
				case name == idle || name == alloc || name == allocated:
					got[name] = m.GetGauge().GetValue()
				}
			}
		}
		if !near(got, s.want) {
			t.Errorf("%s: got %v, want %v", s.name, got, s.want)
		}
	}
}

package exporter

import (
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/pods"
	"github.com/gpuslice/gpuslice/test/simnode"
)

// swapSource is a pods.Source whose pods and error a test changes.
type swapSource struct {
	mu  sync.Mutex
	src *pods.Static
	err error
}

func (s *swapSource) set(list []corev1.Pod, err error) {
	ptrs := make([]*corev1.Pod, len(list))
	for i := range list {
		ptrs[i] = &list[i]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.src, s.err = pods.NewStatic(ptrs), err
}

func (s *swapSource) Get(uid string) (*corev1.Pod, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.src.Get(uid)
}

func (s *swapSource) List() []*corev1.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.src.List()
}

func (s *swapSource) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// lines returns the exposition lines of one metric that contain every part.
func lines(t *testing.T, reg *prometheus.Registry, metric string, parts ...string) []string {
	t.Helper()
	out, err := testutil.CollectAndFormat(reg, expfmt.TypeTextPlain, metric)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "#") || l == "" {
			continue
		}
		keep := true
		for _, p := range parts {
			keep = keep && strings.Contains(l, p)
		}
		if keep {
			got = append(got, l)
		}
	}
	return got
}

func success(t *testing.T, reg *prometheus.Registry, collector string) string {
	t.Helper()
	l := lines(t, reg, "gpuslice_exporter_collect_success", `collector="`+collector+`"`)
	if len(l) != 1 {
		t.Fatalf("collect_success{collector=%q}: %v", collector, l)
	}
	return l[0][strings.LastIndex(l[0], " ")+1:]
}

// TestFailingSourcesArePartial: each source failing drops only its own
// series and sets only its own collect_success to 0.
func TestFailingSourcesArePartial(t *testing.T) {
	t.Run("whole GPU reading fails: allocation and OOM series keep their gpu label", func(t *testing.T) {
		d := newDemo(t)
		d.scrape(t)
		p, _ := d.node.Pod("media", "esrgan-upscale-0")
		if err := d.node.AppendLog(p, p.Containers[0], simnode.PyTorchOOM); err != nil {
			t.Fatal(err)
		}
		d.scrape(t)
		if err := os.WriteFile(d.node.SimFile(), []byte("gpus: [{uuid: \n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := success(t, d.reg, "gpu"); got != "0" {
			t.Fatalf("gpu collector success = %s with a broken sim file", got)
		}
		if l := lines(t, d.reg, "gpuslice_gpu_memory_used_bytes"); len(l) != 0 {
			t.Errorf("device series without a GPU reading: %v", l)
		}
		if l := lines(t, d.reg, "gpuslice_gpu_oom_events_total", `gpu=""`); len(l) != 0 {
			t.Errorf("OOM series relabelled gpu=\"\": %v", l)
		}
		if l := lines(t, d.reg, "gpuslice_gpu_oom_events_total", `pod="esrgan-upscale-0"`, `source="log"`, `kind="device"`, `gpu="0"`); len(l) != 1 || !strings.HasSuffix(l[0], " 1") {
			t.Errorf("OOM counter lost its series or value: %v", l)
		}
		if l := lines(t, d.reg, "gpuslice_container_gpu_allocation", `gpu="0"`); len(l) != 4 {
			t.Errorf("allocation series: %v", l)
		}
	})
	t.Run("kubelet errors: no allocation series, usage stays", func(t *testing.T) {
		d := newDemo(t)
		d.node.PodResources().SetError(errors.New("kubelet is restarting"))
		if got := success(t, d.reg, "podresources"); got != "0" {
			t.Fatalf("podresources success = %s", got)
		}
		if l := lines(t, d.reg, "gpuslice_container_gpu_allocation"); len(l) != 0 {
			t.Errorf("allocation series without the kubelet: %v", l)
		}
		if l := lines(t, d.reg, "gpuslice_container_gpu_memory_used_bytes"); len(l) != 4 {
			t.Errorf("usage series: %v", l)
		}
		if got := success(t, d.reg, "gpu"); got != "1" {
			t.Errorf("gpu success = %s", got)
		}
	})
	t.Run("procfs missing: memory unattributed, not lost", func(t *testing.T) {
		d := newDemo(t)
		d.exp.proc = newProcReader(d.node.Procfs()+"-missing", d.exp.log)
		if got := success(t, d.reg, "procfs"); got != "0" {
			t.Fatalf("procfs success = %s", got)
		}
		if l := lines(t, d.reg, "gpuslice_container_gpu_memory_used_bytes"); len(l) != 0 {
			t.Errorf("containers attributed without /proc: %v", l)
		}
		if l := lines(t, d.reg, "gpuslice_unattributed_gpu_memory_used_bytes"); len(l) != 1 || !strings.HasSuffix(l[0], " 1.9327352832e+10") {
			t.Errorf("unattributed: %v", l)
		}
	})
	t.Run("pod source not synced", func(t *testing.T) {
		d := newDemo(t)
		src := &swapSource{}
		src.set(d.node.PodObjects(), errors.New("informer has not synced yet"))
		d.exp.cfg.Pods = src
		if got := success(t, d.reg, "pods"); got != "0" {
			t.Fatalf("pods success = %s", got)
		}
	})
}

// TestRecreatedPodIsWatchedAgain: a pod deleted and created again under the
// same name (a StatefulSet's) has a new UID and log directory; OOMs there
// count.
func TestRecreatedPodIsWatchedAgain(t *testing.T) {
	d := newDemo(t)
	src := &swapSource{}
	src.set(d.node.PodObjects(), nil)
	d.exp.cfg.Pods = src
	d.scrape(t)

	p, _ := d.node.Pod("media", "esrgan-upscale-0")
	p.UID = "0e6a3c1e-7d3b-4c55-9a8e-2b7f7c1d9e01"
	if err := d.node.Sync(); err != nil {
		t.Fatal(err)
	}
	src.set(d.node.PodObjects(), nil)
	d.scrape(t) // the new pod's log is first seen here, empty
	if err := d.node.AppendLog(p, p.Containers[0], simnode.PyTorchOOM); err != nil {
		t.Fatal(err)
	}
	l := lines(t, d.reg, "gpuslice_gpu_oom_events_total", `pod="esrgan-upscale-0"`, `source="log"`, `kind="device"`)
	if len(l) != 1 || !strings.HasSuffix(l[0], " 1") {
		t.Fatalf("OOM in the recreated pod's log: %v", l)
	}
}

package exporter

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	nvmlbackend "github.com/gpuslice/gpuslice/internal/gpu/nvml"
	"github.com/gpuslice/gpuslice/internal/gpu/nvml/nvmltest"
	"github.com/gpuslice/gpuslice/test/simnode"
)

// TestSharedGPUUtilizationNVML is issue 22's two busy PyTorch pods on one
// time-sliced GPU, through the nvml backend, the attribution and the
// exposition: NVML gives each process's own share per read (53 and 32)
// and the GPU's samples 86; the containers read 0.53 and 0.32 at every
// scrape (they read 0.0135 and 0.0145 on the H200), within the GPU's 0.86.
func TestSharedGPUUtilizationNVML(t *testing.T) {
	n, err := simnode.New("shared", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	uuid := simnode.GPUUUID("shared", 0)
	n.GPUs = []*simnode.GPU{{UUID: uuid, MemoryBytes: 150 << 30, Replicas: 4}}
	g := &nvmltest.GPU{UUID: uuid, Name: "NVIDIA H200", MemTotal: 150 << 30, MemUsed: 20 << 30, Util: 86,
		SM: map[uint32]uint32{3001: 53, 3002: 32}, Period: 6_000_000}
	for i, pid := range []int{3001, 3002} {
		n.Pods = append(n.Pods, &simnode.Pod{Namespace: "ml", Name: []string{"trainer-a", "trainer-b"}[i], Containers: []*simnode.Container{{
			Name: "main", Replicas: map[string][]int{uuid: {i}},
			Processes: []simnode.Process{{PID: pid, GPU: uuid, MemoryBytes: 8 << 30, SM: 0.5}},
		}}})
		g.Processes = append(g.Processes, nvml.ProcessInfo{Pid: uint32(pid), UsedGpuMemory: 8 << 30, GpuInstanceId: ^uint32(0), ComputeInstanceId: ^uint32(0)})
	}
	backend, err := nvmlbackend.New(nvmltest.New(g), nvmlbackend.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := nodeExporter(t, n, backend).Handler(prometheus.NewRegistry(), nil)
	for scrape := range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
		got := utilizations(t, w.Body)
		want := map[string]float64{"gpu": 0.86, "trainer-a": 0.53, "trainer-b": 0.32}
		for k, v := range want {
			if d := got[k] - v; d > 1e-9 || d < -1e-9 {
				t.Errorf("scrape %d: %s utilization %v, want %v", scrape, k, got[k], v)
			}
		}
		if s := got["trainer-a"] + got["trainer-b"]; s > got["gpu"] {
			t.Errorf("scrape %d: containers add up to %v, over the GPU's %v", scrape, s, got["gpu"])
		}
	}
}

// utilizations reads the GPU's and each pod's utilization ratio.
func utilizations(t *testing.T, r io.Reader) map[string]float64 {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range families["gpuslice_gpu_utilization_ratio"].GetMetric() {
		out["gpu"] = m.GetGauge().GetValue()
	}
	for _, m := range families["gpuslice_container_gpu_utilization_ratio"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "pod" && strings.HasPrefix(l.GetValue(), "trainer-") {
				out[l.GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

package exporter

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/dashboards/metricnames"
	"github.com/gpuslice/gpuslice/internal/gpu/sim"
	"github.com/gpuslice/gpuslice/internal/oom"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/pods"
	"github.com/gpuslice/gpuslice/test/simnode"
)

var update = flag.Bool("update", false, "rewrite golden files")

// goldenMetrics are compared; durations vary and are left out.
var goldenMetrics = []string{
	"gpuslice_gpu_info", "gpuslice_gpu_memory_total_bytes", "gpuslice_gpu_memory_used_bytes",
	"gpuslice_gpu_utilization_ratio", "gpuslice_gpu_temperature_celsius", "gpuslice_gpu_power_watts",
	"gpuslice_gpu_xid_errors_total", "gpuslice_gpu_replicas", "gpuslice_gpu_replicas_allocated",
	"gpuslice_container_gpu_allocation", "gpuslice_container_gpu_memory_used_bytes",
	"gpuslice_container_gpu_utilization_ratio", "gpuslice_container_gpu_processes",
	"gpuslice_container_gpu_idle_seconds",
	"gpuslice_unattributed_gpu_memory_used_bytes", "gpuslice_gpu_oom_events_total",
	"gpuslice_exporter_collect_success",
}

type demo struct {
	node *simnode.Node
	exp  *Exporter
	reg  *prometheus.Registry
}

func newDemo(t *testing.T) *demo {
	t.Helper()
	n, err := simnode.Demo("gpu-node-1", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n.GPUs[0].Xids = []uint64{79}
	d := &demo{node: n}
	d.exp, d.reg = exporterWithOOM(t, n)
	return d
}

// exporterWithOOM starts n (startNode) and returns an exporter of it that
// reads its pods' logs for OOM events, registered on a pedantic registry.
func exporterWithOOM(t *testing.T, n *simnode.Node) (*Exporter, *prometheus.Registry) {
	t.Helper()
	cfg := startNode(t, n)
	det, err := oom.NewDetector(oom.Config{PodLogsDir: n.PodLogs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { det.Close() })
	cfg.OOM = det
	e, reg := New(cfg), prometheus.NewPedanticRegistry()
	reg.MustRegister(e)
	return e, reg
}

// startNode starts a simulated node until the test ends and returns an
// exporter config reading it: its GPUs, PodResources, pods and /proc.
func startNode(t *testing.T, n *simnode.Node) Config {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	client, err := podresources.NewClient(n.PodResourcesSocket())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	podList := n.PodObjects()
	ptrs := make([]*corev1.Pod, len(podList))
	for i := range podList {
		ptrs[i] = &podList[i]
	}
	return Config{GPU: sim.New(n.SimFile()), Kubelet: client, Pods: pods.NewStatic(ptrs), Procfs: n.Procfs()}
}

func (d *demo) scrape(t *testing.T) string {
	t.Helper()
	var buf bytes.Buffer
	mfs, err := d.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		keep := false
		for _, n := range goldenMetrics {
			keep = keep || mf.GetName() == n
		}
		if keep {
			if err := writeText(&buf, mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	return buf.String()
}

// TestGoldenScrape compares a whole scrape of the demo node, including an
// OOM logged after the first scrape, with testdata/demo.prom, and checks the
// exposition with promtool.
func TestGoldenScrape(t *testing.T) {
	d := newDemo(t)
	d.scrape(t) // first scrape: the detector positions itself at the logs' ends
	p, _ := d.node.Pod("media", "esrgan-upscale-0")
	if err := d.node.AppendLog(p, p.Containers[0], "Traceback (most recent call last):", simnode.PyTorchOOM); err != nil {
		t.Fatal(err)
	}
	got := d.scrape(t)
	golden := filepath.Join("testdata", "demo.prom")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("scrape differs from %s (go test ./internal/exporter -run Golden -update to accept):\n%s", golden, diffLines(string(want), got))
	}
	promtool := "promtool"
	if _, err := exec.LookPath(promtool); err != nil {
		t.Fatalf("promtool not found (apt-get install prometheus): %v", err)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(got)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
	if err := testutil.GatherAndCompare(d.reg, strings.NewReader(string(want)), "gpuslice_gpu_oom_events_total"); err != nil {
		t.Fatal(err)
	}
}

func diffLines(want, got string) string {
	w := map[string]bool{}
	for _, l := range strings.Split(want, "\n") {
		w[l] = true
	}
	g := map[string]bool{}
	var b strings.Builder
	for _, l := range strings.Split(got, "\n") {
		g[l] = true
		if !w[l] {
			b.WriteString("+ " + l + "\n")
		}
	}
	for _, l := range strings.Split(want, "\n") {
		if !g[l] {
			b.WriteString("- " + l + "\n")
		}
	}
	return b.String()
}

// TestMetricNamesMatchContract: the exporter exports exactly the metric
// names the dashboards and alerts are checked against.
func TestMetricNamesMatchContract(t *testing.T) {
	d := newDemo(t)
	d.scrape(t)
	p, _ := d.node.Pod("media", "esrgan-upscale-0")
	if err := d.node.AppendLog(p, p.Containers[0], simnode.PyTorchOOM); err != nil {
		t.Fatal(err)
	}
	mfs, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	want := map[string]bool{}
	for _, n := range metricnames.Exporter {
		want[n] = true
	}
	for n := range got {
		if !want[n] {
			t.Errorf("exporter exports %s, which dashboards/metricnames.Exporter does not list", n)
		}
	}
	for n := range want {
		if !got[n] {
			t.Errorf("dashboards/metricnames.Exporter lists %s, which the demo node's scrape lacks", n)
		}
	}
}

package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/testproc"
)

// TestStatusRecentOOMsFromPrometheus: with --prometheus, the OOM column is
// the last hour's events from a real Prometheus scraping the exporter: a
// container whose counters of two kinds went 0 → 1 while Prometheus
// watched shows 2, one that OOMed once and is gone from the exporter since
// is still listed with its 1, one whose encoder-session counter the
// exporter created at its first OOM (no 0 before it for increase() to see)
// shows 1, as does one whose counter was created so and is gone since, and
// a container that never OOMed shows 0.
func TestStatusRecentOOMsFromPrometheus(t *testing.T) {
	prometheus, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not found (make test installs Debian's package): %v", err)
	}
	env := testenv.Start(t)
	ctx := t.Context()
	node, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Allocatable = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("4")}
	if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// phase 0: yolo at 0, gone at 0; 1: gone OOMs once; 2: yolo OOMs
	// twice and gone has ended (its series is no longer exported).
	var phase atomic.Int32
	exporter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		p := phase.Load()
		var b strings.Builder
		b.WriteString("# TYPE gpuslice_gpu_memory_total_bytes gauge\ngpuslice_gpu_memory_total_bytes{gpu=\"0\",uuid=\"GPU-1\"} 5.1e+10\n")
		b.WriteString("# TYPE gpuslice_container_gpu_allocation gauge\n")
		b.WriteString("gpuslice_container_gpu_allocation{container=\"main\",gpu=\"0\",namespace=\"ml\",pod=\"yolo\",resource=\"nvidia.com/gpu\",uuid=\"GPU-1\"} 1\n")
		b.WriteString("gpuslice_container_gpu_allocation{container=\"main\",gpu=\"0\",namespace=\"ml\",pod=\"quiet\",resource=\"nvidia.com/gpu\",uuid=\"GPU-1\"} 1\n")
		b.WriteString("gpuslice_container_gpu_allocation{container=\"main\",gpu=\"0\",namespace=\"ml\",pod=\"first\",resource=\"nvidia.com/gpu\",uuid=\"GPU-1\"} 1\n")
		b.WriteString("# TYPE gpuslice_gpu_oom_events_total counter\n")
		// yolo's two OOMs are of two kinds: the column sums them.
		for _, kind := range []string{"device", "process-cap"} {
			fmt.Fprintf(&b, "gpuslice_gpu_oom_events_total{container=\"main\",gpu=\"0\",kind=%q,namespace=\"ml\",pod=\"yolo\",source=\"log\",uuid=\"GPU-1\"} %d\n", kind, map[int32]int{0: 0, 1: 0, 2: 1}[p])
			fmt.Fprintf(&b, "gpuslice_gpu_oom_events_total{container=\"main\",gpu=\"0\",kind=%q,namespace=\"ml\",pod=\"quiet\",source=\"log\",uuid=\"GPU-1\"} 0\n", kind)
		}
		if p < 2 {
			fmt.Fprintf(&b, "gpuslice_gpu_oom_events_total{container=\"main\",gpu=\"0\",kind=\"device\",namespace=\"ml\",pod=\"gone\",source=\"log\",uuid=\"GPU-1\"} %d\n", p)
		}
		if p == 1 { // created by its OOM, then gone with its pod
			b.WriteString("gpuslice_gpu_oom_events_total{container=\"main\",gpu=\"0\",kind=\"unknown\",namespace=\"ml\",pod=\"brief\",source=\"log\",uuid=\"GPU-1\"} 1\n")
		}
		if p == 2 {
			b.WriteString("gpuslice_gpu_oom_events_total{container=\"main\",gpu=\"0\",kind=\"encoder-session\",namespace=\"ml\",pod=\"first\",source=\"log\",uuid=\"GPU-1\"} 1\n")
		}
		_, _ = w.Write([]byte(b.String()))
	}))
	defer exporter.Close()

	dir := t.TempDir()
	cfg := fmt.Sprintf("global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: gpuslice-exporter\n    static_configs:\n      - {targets: [%q], labels: {node: gpu-node-1}}\n",
		strings.TrimPrefix(exporter.URL, "http://"))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := testproc.FreeAddr(t)
	testproc.Start(t, "prometheus", nil, prometheus, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	promURL := "http://" + addr
	query := func() (map[string]string, error) {
		out := map[string]string{}
		counts, err := recentOOMs(ctx, promURL, "node", 5*time.Second, time.Now())
		for k, v := range counts {
			out[k.Pod] = fmt.Sprint(v)
		}
		return out, err
	}
	// Each phase lasts a few scrapes.
	for p := range int32(3) {
		phase.Store(p)
		seen := 0
		testproc.Eventually(t, 30*time.Second, 500*time.Millisecond, func() string {
			got, err := query()
			if err != nil {
				return err.Error()
			}
			if _, ok := got["yolo"]; !ok {
				return fmt.Sprintf("phase %d: Prometheus has no yolo series yet: %v", p, got)
			}
			if seen++; seen < 5 {
				return "waiting for scrapes"
			}
			return ""
		})
	}

	var out, errOut bytes.Buffer
	args := []string{"status", "--kubeconfig", env.Kubeconfig(t, t.TempDir()), "--prometheus", promURL,
		"--exporter", "gpu-node-1=" + exporter.URL + "/metrics"}
	if err := runStatus(t, args, &out, &errOut, time.Now()); err != nil {
		t.Fatalf("status: %v\n%s", err, errOut.String())
	}
	text := out.String()
	for _, want := range []string{
		`(?m)^\s+GPU\s+POD\s+CONTAINER\s+MEMORY\s+SM\s+OOMS\(1H\)\s+IDLE$`,
		`(?m)^\s+0\s+ml/yolo\s+main\s+\S+\s+\S+\s+2\s+\S+$`,
		`(?m)^\s+0\s+ml/quiet\s+main\s+\S+\s+\S+\s+0\s+\S+$`,
		`(?m)^\s+0\s+ml/first\s+main\s+\S+\s+\S+\s+1\s+\S+$`,
		`(?m)^\s+0\s+ml/brief\s+main\s+\S+\s+\S+\s+1\s+\S+$`,
		`(?m)^\s+0\s+ml/gone\s+main\s+\S+\s+\S+\s+1\s+\S+$`,
	} {
		if !regexp.MustCompile(want).MatchString(text) {
			t.Errorf("status output lacks %s:\n%s", want, text)
		}
	}

	if err := runStatus(t, []string{"status", "--kubeconfig", env.Kubeconfig(t, t.TempDir()), "--prometheus", "http://127.0.0.1:1"},
		&out, &errOut, time.Now()); err == nil || !strings.Contains(err.Error(), "http://127.0.0.1:1") {
		t.Errorf("an unreachable Prometheus: %v, want an error naming it", err)
	}
}

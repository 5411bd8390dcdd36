package main

import (
	"bytes"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/controller"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestStatusGolden runs `gpuslice-tuner status` against a real API server
// holding four nodes: one whose exporter answers (testdata/exporter.prom,
// a scrape of the exporter's demo node with one container idle for 4h12m)
// and which has a last-decision annotation, one whose exporter fails, one
// with no exporter given, and one without GPUs, left out. Both output formats are compared with
// testdata/status.{txt,json}.
func TestStatusGolden(t *testing.T) {
	env := testenv.Start(t)
	ctx := t.Context()
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	decided := now.Add(-42 * time.Minute)
	rec := controller.Record{Time: decided, Replicas: 4, Recommended: 4, Reason: "Steady",
		Message: "peak 13.5GiB of 48GiB over 1h; 4 replicas fit"}
	for _, n := range []struct {
		name        string
		allocatable corev1.ResourceList
		annotations map[string]string
	}{
		{"gpu-node-1", corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("4"), corev1.ResourceCPU: resource.MustParse("16")},
			map[string]string{controller.AnnotationLastDecision: rec.String()}},
		{"gpu-node-2", corev1.ResourceList{"nvidia.com/gpu.shared": resource.MustParse("2")}, nil},
		{"gpu-node-3", corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}, nil},
		{"cpu-node", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")}, nil},
	} {
		node, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Annotations: n.annotations}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.Allocatable = n.allocatable
		if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	prom, err := os.ReadFile(filepath.Join("testdata", "exporter.prom"))
	if err != nil {
		t.Fatal(err)
	}
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(prom) }))
	defer good.Close()
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "oops", http.StatusInternalServerError) }))
	defer bad.Close()
	kubeconfig := env.Kubeconfig(t, t.TempDir())

	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := []string{"status", "--kubeconfig", kubeconfig, "-o", format,
				"--exporter", "gpu-node-1=" + good.URL + "/metrics", "--exporter", "gpu-node-2=" + bad.URL + "/metrics"}
			if err := runStatus(t, args, &out, &errOut, now); err != nil {
				t.Fatalf("status: %v\n%s", err, errOut.String())
			}
			got := strings.ReplaceAll(out.String(), bad.URL, "http://EXPORTER-2")
			golden := filepath.Join("testdata", map[string]string{"text": "status.txt", "json": "status.json"}[format])
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
				t.Errorf("output differs from %s (go test ./cmd/tuner -run StatusGolden -update to accept):\n%s", golden, got)
			}
		})
	}
}

func runStatus(t *testing.T, args []string, stdout, stderr *bytes.Buffer, now time.Time) error {
	t.Helper()
	return statusCommand(t.Context(), args[1:], stdout, stderr, func() time.Time { return now })
}

func TestStatusBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "yaml"}, `-o "yaml": want text or json`},
		{[]string{"--exporter", "gpu-node-1"}, `"gpu-node-1": want NODE=URL`},
		{[]string{"--exporter", "n=localhost:9846"}, `"localhost:9846" is not an http(s) URL`},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--prometheus", "http://localhost:9090", "--prometheus.node-label", "k8s.node"}, `--prometheus.node-label "k8s.node" is not a label name`},
	} {
		var out, errOut bytes.Buffer
		err := statusCommand(t.Context(), tc.args, &out, &errOut, time.Now)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("status %q = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

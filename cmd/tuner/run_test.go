package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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
)

// exposition is an exporter's page for one GPU whose four replicas are all
// taken with plenty of memory left: the policy raises it once.
const exposition = `# TYPE gpuslice_gpu_memory_total_bytes gauge
gpuslice_gpu_memory_total_bytes{gpu="0",uuid="GPU-e2e"} 5.152702464e+10
# TYPE gpuslice_gpu_memory_used_bytes gauge
gpuslice_gpu_memory_used_bytes{gpu="0",uuid="GPU-e2e"} 1.2e+10
# TYPE gpuslice_container_gpu_memory_used_bytes gauge
gpuslice_container_gpu_memory_used_bytes{container="main",gpu="0",namespace="ml",pod="yolo",uuid="GPU-e2e"} 6e+09
# TYPE gpuslice_gpu_replicas gauge
gpuslice_gpu_replicas{gpu="0",resource="nvidia.com/gpu",uuid="GPU-e2e"} 4
# TYPE gpuslice_gpu_replicas_allocated gauge
gpuslice_gpu_replicas_allocated{gpu="0",resource="nvidia.com/gpu",uuid="GPU-e2e"} 4
`

const baseConfig = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n"

// TestRunCommand runs `gpuslice-tuner run` in process against a real API
// server, scraping a static exporter target: it raises the node once, serves
// its metrics, and gives the Lease back when stopped.
func TestRunCommand(t *testing.T) {
	env := testenv.Start(t)
	ctx := t.Context()
	const ns, node = "tuner-e2e", "e2e-node"
	env.CreateNamespace(t, ns)
	if _, err := env.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "plugin-configs", Namespace: ns}, Data: map[string]string{"default": baseConfig}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Allocatable = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("4")}
	if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	exporter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, exposition) }))
	defer exporter.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "tuner.yaml")
	cfg := fmt.Sprintf(`interval: 200ms
leaderElection: {namespace: %s, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 100ms}
signals:
  exporters:
    targets: [{node: %s, url: "%s/metrics"}]
apply:
  mode: config-manager
  configMap: {namespace: %s, name: plugin-configs}
  key: default
  propagationDelay: 1s # no ConfigMap volume here; the default waits 90 s for the kubelet's
policy: {window: 2s, sampleInterval: 200ms, pressureWindow: 1s, cooldown: 1h}
`, ns, node, exporter.URL, ns)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	// While it runs, the test talks to it over HTTP only: run sets
	// client-go's global klog logger, which this goroutine's client would
	// read concurrently.
	kubeconfig := env.Kubeconfig(t, dir)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- dispatch(runCtx, []string{"run", "--config", cfgPath, "--kubeconfig", kubeconfig,
			"--web.listen-address", addr, "--leader-election.identity", "e2e", "--log.level", "warn"}, io.Discard, io.Discard)
	}()
	stopped := false
	defer func() {
		if !stopped {
			stop()
			<-done
		}
	}()

	metric := func(text, line string) bool {
		for _, l := range strings.Split(text, "\n") {
			if l == line {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var msg string
		body := ""
		if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
		}
		switch {
		case !metric(body, "gpuslice_tuner_leader 1"):
			msg = "not leader yet"
		case !metric(body, `gpuslice_tuner_changes_total{direction="up",node="e2e-node",resource="nvidia.com/gpu"} 1`):
			msg = "no change counted:\n" + body
		}
		if msg == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(100 * time.Millisecond)
	}

	stop()
	stopped = true
	if err := <-done; err != nil {
		t.Errorf("run returned %v after its context ended", err)
	}
	got, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l := got.Labels["nvidia.com/device-plugin.config"]; l != "gpuslice-5" {
		t.Errorf("node label %q, want gpuslice-5", l)
	}
	lease, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, "gpuslice-tuner", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("lease still held by %q after shutdown (ReleaseOnCancel)", *h)
	}
}

func TestRunFlags(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "tuner.yaml")
	if err := os.WriteFile(bad, []byte("apply: {mode: sideways}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"no config", nil, true, "--config is required"},
		{"unknown flag", []string{"--config", bad, "--speed", "2"}, true, "speed"},
		{"extra argument", []string{"--config", bad, "extra"}, true, `unexpected argument "extra"`},
		{"missing config file", []string{"--config", filepath.Join(dir, "nope.yaml")}, false, "nope.yaml"},
		{"bad config names the file", []string{"--config", bad}, false, bad + `: invalid tuner config: apply.mode must be`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := dispatch(context.Background(), append([]string{"run"}, tc.args...), io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, errUsage) != tc.usage {
				t.Errorf("err = %v, want one containing %q (usage error: %v)", err, tc.want, tc.usage)
			}
		})
	}
}

func TestTracingOnlyWithAnEndpoint(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	tr, shutdown, err := tracing(t.Context())
	if err != nil || tr != nil {
		t.Fatalf("without an endpoint: tracer %v, err %v; want none", tr, err)
	}
	shutdown()

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "200") // ms: nobody listens there
	tr, shutdown, err = tracing(t.Context())
	if err != nil || tr == nil {
		t.Fatalf("with an endpoint: tracer %v, err %v", tr, err)
	}
	_, span := tr.Start(t.Context(), "test")
	if !span.IsRecording() {
		t.Error("the OTLP tracer does not record")
	}
	span.End()
	shutdown()
}

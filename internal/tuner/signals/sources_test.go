package signals

import (
	"github.com/gpuslice/gpuslice/internal/testproc"

	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
	"github.com/gpuslice/gpuslice/test/simnode"
)

const gib = simnode.GiB

// prometheusBinary is Debian's prometheus package; $PROMETHEUS overrides it.
func prometheusBinary(t *testing.T) string {
	if p := os.Getenv("PROMETHEUS"); p != "" {
		return p
	}
	p, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not found (apt-get install prometheus, or set $PROMETHEUS): %v", err)
	}
	return p
}

// exporterBinary builds the real gpuslice-exporter once per test run.
func exporterBinary(t *testing.T) string { return testproc.Build(t, "cmd/exporter") }

// startProcess runs a program until the test ends; its output, kept in a
// file, is logged if the test fails.
func startProcess(t *testing.T, bin string, args ...string) {
	t.Helper()
	out, err := os.Create(filepath.Join(t.TempDir(), "output"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		out.Close()
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("%s output:\n%s", filepath.Base(bin), b)
		}
	})
}

func freePort(t *testing.T) int { return testproc.FreePort(t) }

// poll calls cond until it returns "" or the deadline passes.
func poll(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	testproc.Eventually(t, timeout, 100*time.Millisecond, cond)
}

// simulated is a simulated node with a real exporter on it.
type simulated struct {
	node *simnode.Node
	port int
}

func startSimulated(t *testing.T, ctx context.Context, n *simnode.Node) simulated {
	t.Helper()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	startProcess(t, exporterBinary(t),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(port),
		"--gpu.backend=sim", "--sim.file="+n.SimFile(),
		"--path.procfs="+n.Procfs(), "--path.pod-logs="+n.PodLogs(),
		"--kubelet.pod-resources-socket="+n.PodResourcesSocket(),
		"--pods.source=kubelet", "--kubelet.url="+n.KubeletURL(), "--kubelet.token-file=", "--kubelet.pods-interval=200ms",
		"--node-name="+n.Name, "--log.level=warn",
	)
	return simulated{node: n, port: port}
}

// latest returns the newest sample of each GPU of a node.
func latest(obs map[string][]policy.GPUObservation, node string) map[string]policy.Sample {
	out := map[string]policy.Sample{}
	for _, g := range obs[node] {
		out[g.UUID] = g.Samples[len(g.Samples)-1]
	}
	return out
}

// oomsIn counts a GPU's OOM events in the window, and its samples after
// since.
func oomsIn(obs map[string][]policy.GPUObservation, node, uuid string, since time.Time) (events, after int, last time.Time) {
	for _, g := range obs[node] {
		if g.UUID != uuid {
			continue
		}
		for _, s := range g.Samples {
			events += s.OOMEvents
			if s.Time.After(since) {
				after++
			}
			last = s.Time
		}
	}
	return events, after, last
}

// TestSourcesOnSimulatedNodes reads two simulated nodes through real
// gpuslice-exporter processes: directly, with the exporter pods discovered
// in a real API server, and through a real Prometheus scraping the same
// exporters. Both sources must see the same memory, containers, replicas and
// exactly one OOM event for one OOM.
func TestSourcesOnSimulatedNodes(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	a0 := simnode.GPUUUID("gpu-a", 0)
	b0, b1 := simnode.GPUUUID("gpu-b", 0), simnode.GPUUUID("gpu-b", 1)
	na, err := simnode.New("gpu-a", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	yolo := &simnode.Container{Name: "main", Replicas: map[string][]int{a0: {0}},
		Processes: []simnode.Process{{PID: 101, GPU: a0, MemoryBytes: 6 * gib, SM: 0.3}}}
	na.GPUs = []*simnode.GPU{{UUID: a0, MemoryBytes: simnode.A6000Bytes, Replicas: 4}}
	na.Pods = []*simnode.Pod{
		{Namespace: "ml", Name: "yolo", Containers: []*simnode.Container{yolo}},
		{Namespace: "media", Name: "ffmpeg", Containers: []*simnode.Container{{Name: "enc", Replicas: map[string][]int{a0: {1}},
			Processes: []simnode.Process{{PID: 102, GPU: a0, MemoryBytes: gib / 2, SM: 0.1}}}}},
		// A notebook holding a replica with no process: an idle holder.
		{Namespace: "lab", Name: "notebook", Containers: []*simnode.Container{{Name: "jupyter", Replicas: map[string][]int{a0: {2}}}}},
	}
	nb, err := simnode.New("gpu-b", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// b0 is shared through MPS: its server, and a client started with a
	// pinned limit of 12 GiB (the exporter's limit series).
	nb.GPUs = []*simnode.GPU{{UUID: b0, MemoryBytes: 24 * gib, Replicas: 2,
		HostProcesses: []simnode.Process{{PID: 299, GPU: b0, MemoryBytes: 66 << 20, MPSServer: true}}},
		{UUID: b1, MemoryBytes: 24 * gib, Replicas: 2}}
	nb.Pods = []*simnode.Pod{{Namespace: "ml", Name: "rife", Containers: []*simnode.Container{{Name: "main",
		Replicas: map[string][]int{b1: {0, 1}}, Processes: []simnode.Process{{PID: 201, GPU: b1, MemoryBytes: 8 * gib}}}}},
		{Namespace: "ml", Name: "mpsc", Containers: []*simnode.Container{{Name: "main", Replicas: map[string][]int{b0: {0}},
			Processes: []simnode.Process{{PID: 202, GPU: b0, MemoryBytes: 3 * gib, Environ: []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=12288M"}}}}}}}
	sa, sb := startSimulated(t, ctx, na), startSimulated(t, ctx, nb)

	// Exporter pods as the DaemonSet would make them, one not running yet.
	cfg := config.Default().Signals.Exporters
	env.CreateNamespace(t, cfg.Namespace)
	for _, p := range []struct {
		name, node string
		port       int
		phase      corev1.PodPhase
	}{{"exporter-a", "gpu-a", sa.port, corev1.PodRunning}, {"exporter-b", "gpu-b", sb.port, corev1.PodRunning}, {"exporter-c", "gpu-c", 1, corev1.PodPending},
		// A surge: a second exporter on gpu-a (here pointing at gpu-b's,
		// so that scraping it would show). One per node is scraped, the
		// oldest, or both would count each OOM.
		{"exporter-a2", "gpu-a", sb.port, corev1.PodRunning}} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: cfg.Namespace, Labels: map[string]string{"app.kubernetes.io/name": "gpuslice-exporter"}},
			Spec: corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "exporter", Image: "gpuslice-exporter",
				Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: int32(p.port)}}}}},
		}
		created, err := env.Client.CoreV1().Pods(cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status = corev1.PodStatus{Phase: p.phase, PodIP: "127.0.0.1"}
		if _, err := env.Client.CoreV1().Pods(cfg.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	exp, err := NewExporters(ExportersOptions{Config: cfg, Client: env.Client, Interval: 200 * time.Millisecond, Keep: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := exp.Run(ctx); err != nil {
			t.Errorf("exporters source: %v", err)
		}
	}()

	promPort := freePort(t)
	dir := t.TempDir()
	promCfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: gpuslice-exporter
    static_configs:
      - {targets: ["127.0.0.1:%d"], labels: {node: gpu-a}}
      - {targets: ["127.0.0.1:%d"], labels: {node: gpu-b}}
`, sa.port, sb.port)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(promCfg), 0o644); err != nil {
		t.Fatal(err)
	}
	startProcess(t, prometheusBinary(t), "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:"+strconv.Itoa(promPort), "--log.level=warn")
	pc := config.Default().Signals.Prometheus
	pc.URL = "http://127.0.0.1:" + strconv.Itoa(promPort)
	pc.Selector = `job="gpuslice-exporter"`
	prom, err := NewPrometheus(PrometheusOptions{Config: pc, Step: time.Second})
	if err != nil {
		t.Fatal(err)
	}

	sources := []struct {
		name   string
		src    Source
		window time.Duration
	}{{"exporters", exp, 30 * time.Second}, {"prometheus", prom, 30 * time.Second}}

	t.Run("discovery", func(t *testing.T) {
		want := map[string]string{
			"gpu-a": fmt.Sprintf("http://127.0.0.1:%d/metrics", sa.port),
			"gpu-b": fmt.Sprintf("http://127.0.0.1:%d/metrics", sb.port),
		}
		poll(t, 10*time.Second, func() string {
			targets, err := exp.Targets()
			if err != nil {
				return err.Error()
			}
			got := map[string]string{}
			for _, tg := range targets {
				got[tg.Node] = tg.URL
			}
			if len(got) != 2 || got["gpu-a"] != want["gpu-a"] || got["gpu-b"] != want["gpu-b"] {
				return fmt.Sprintf("targets %v, want %v (the pending pod left out)", got, want)
			}
			if len(targets) != 2 {
				return fmt.Sprintf("%d targets %v, want one per node", len(targets), targets)
			}
			return ""
		})
	})

	for _, s := range sources {
		t.Run(s.name+"/readings", func(t *testing.T) {
			poll(t, 30*time.Second, func() string {
				obs, err := s.src.Observe(ctx, time.Now(), s.window)
				if err != nil {
					return err.Error()
				}
				a, b := latest(obs, "gpu-a"), latest(obs, "gpu-b")
				ga := a[a0]
				switch {
				case len(a) != 1 || len(b) != 2:
					return fmt.Sprintf("GPUs per node: gpu-a %d, gpu-b %d (%v)", len(a), len(b), obs)
				case ga.MemoryTotalBytes != simnode.A6000Bytes || ga.MemoryUsedBytes != 6*gib+gib/2:
					return fmt.Sprintf("gpu-a memory %d/%d", ga.MemoryUsedBytes, ga.MemoryTotalBytes)
				// The index, which a plugin config's devices list names.
				case ga.GPU != "0" || b[b0].GPU != "0" || b[b1].GPU != "1":
					return fmt.Sprintf("GPU indices: gpu-a %q, gpu-b %q and %q", ga.GPU, b[b0].GPU, b[b1].GPU)
				case ga.ContainerPeaks["ml/yolo/main"] != 6*gib || ga.ContainerPeaks["media/ffmpeg/enc"] != gib/2:
					return fmt.Sprintf("gpu-a containers %v", ga.ContainerPeaks)
				case ga.ReplicasAdvertised != 4 || ga.ReplicasAllocated != 3:
					return fmt.Sprintf("gpu-a replicas %d advertised, %d allocated", ga.ReplicasAdvertised, ga.ReplicasAllocated)
				case b[b1].ContainerPeaks["ml/rife/main"] != 8*gib || b[b1].ReplicasAllocated != 2 || b[b0].ReplicasAllocated != 1 || b[b0].ReplicasAdvertised != 2:
					return fmt.Sprintf("gpu-b %+v", b)
				case b[b0].ContainerLimits["ml/mpsc/main"] != 12*gib || len(b[b0].ContainerLimits) != 1 || b[b1].ContainerLimits != nil || ga.ContainerLimits != nil:
					return fmt.Sprintf("MPS limits: gpu-b %v and %v, gpu-a %v; want ml/mpsc/main's 12 GiB on %s alone", b[b0].ContainerLimits, b[b1].ContainerLimits, ga.ContainerLimits, b0)
				}
				return ""
			})
		})
	}

	for _, s := range sources {
		t.Run(s.name+"/idle holders", func(t *testing.T) {
			is, ok := s.src.(IdleSource)
			if !ok {
				t.Fatalf("%T is not an IdleSource", s.src)
			}
			poll(t, 30*time.Second, func() string {
				hs, err := is.IdleHolders(ctx, time.Now())
				if err != nil {
					return err.Error()
				}
				a := hs["gpu-a"]
				if len(a) != 3 {
					return fmt.Sprintf("gpu-a holders %+v, want 3", a)
				}
				// Longest idle first: the notebook, then the two busy ones.
				if h := a[0]; h.Namespace != "lab" || h.Pod != "notebook" || h.Container != "jupyter" || h.UUID != a0 || h.GPU != "0" || h.Idle < time.Second {
					return fmt.Sprintf("first holder %+v, want lab/notebook/jupyter idle for a second or more", h)
				}
				for _, h := range a[1:] {
					if h.Idle != 0 {
						return fmt.Sprintf("busy holder %+v idle", h)
					}
				}
				if b := hs["gpu-b"]; len(b) != 2 || b[0].Pod != "rife" || b[0].UUID != b1 || b[1].Pod != "mpsc" || b[1].UUID != b0 {
					return fmt.Sprintf("gpu-b holders %+v, want ml/rife on %s, then ml/mpsc on %s", b, b1, b0)
				}
				return ""
			})
		})
	}

	// Both sources have seen gpu-a: an OOM from now on is an event.
	if err := na.AppendLog(na.Pods[0], yolo, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."); err != nil {
		t.Fatal(err)
	}
	for _, s := range sources {
		t.Run(s.name+"/one OOM", func(t *testing.T) {
			var seenAt time.Time
			poll(t, 30*time.Second, func() string {
				obs, err := s.src.Observe(ctx, time.Now(), s.window)
				if err != nil {
					return err.Error()
				}
				n, samples, last := oomsIn(obs, "gpu-a", a0, time.Time{})
				if n != 1 {
					return fmt.Sprintf("%d OOM events in %d samples, want 1", n, samples)
				}
				if e, _, _ := oomsIn(obs, "gpu-b", b1, time.Time{}); e != 0 {
					return fmt.Sprintf("%d OOM events on gpu-b", e)
				}
				seenAt = last
				return ""
			})
			// Later samples do not count it again.
			poll(t, 30*time.Second, func() string {
				obs, err := s.src.Observe(ctx, time.Now(), s.window)
				if err != nil {
					return err.Error()
				}
				n, after, _ := oomsIn(obs, "gpu-a", a0, seenAt)
				if n != 1 {
					t.Fatalf("%d OOM events %d samples later, want still 1", n, after)
				}
				if after < 3 {
					return fmt.Sprintf("%d samples since, waiting for 3", after)
				}
				return ""
			})
		})
	}
}

// TestPrometheusExporterRollout: a restarted exporter counts no history:
// its counters begin again. A container whose encoder-session counter the
// old process had at 1 fails again after the restart, and the new process
// creates that counter at 1: one event, read through a real Prometheus.
// Two ways: a rollout to a new pod (a new instance), and a restart in place
// (the same instance; its process start time changes).
func TestPrometheusExporterRollout(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		name := map[bool]string{false: "new instance", true: "same instance"}[inPlace]
		t.Run(name, func(t *testing.T) { testExporterRestart(t, inPlace) })
	}
}

func testExporterRestart(t *testing.T, inPlace bool) {
	// 0: the old process answers; 1: nobody (a restart in place); 2: the
	// new process.
	var phase atomic.Int32
	serve := func(live func(int32) bool, start int) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			p := phase.Load()
			if !live(p) {
				http.Error(w, "gone", http.StatusServiceUnavailable)
				return
			}
			if inPlace && p == 2 {
				start = 2000
			}
			fmt.Fprintf(w, "process_start_time_seconds %d\n"+
				"gpuslice_gpu_memory_total_bytes{gpu=\"0\",uuid=\"GPU-a\"} 2.5e+10\n"+
				"gpuslice_gpu_oom_events_total{container=\"enc\",gpu=\"0\",kind=\"encoder-session\",namespace=\"media\",pod=\"ffmpeg\",source=\"log\",uuid=\"GPU-a\"} 1\n", start)
		}))
	}
	var targets []string
	if inPlace {
		one := serve(func(p int32) bool { return p != 1 }, 1000)
		defer one.Close()
		targets = []string{one.URL}
	} else {
		old, cur := serve(func(p int32) bool { return p == 0 }, 1000), serve(func(p int32) bool { return p == 2 }, 2000)
		defer old.Close()
		defer cur.Close()
		targets = []string{old.URL, cur.URL}
	}
	var quoted []string
	for _, u := range targets {
		quoted = append(quoted, strconv.Quote(strings.TrimPrefix(u, "http://")))
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf("global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: gpuslice-exporter\n    static_configs:\n      - {targets: [%s], labels: {node: n1}}\n",
		strings.Join(quoted, ", "))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	startProcess(t, prometheusBinary(t), "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:"+strconv.Itoa(port), "--log.level=warn")
	src, err := NewPrometheus(PrometheusOptions{Config: config.Prometheus{URL: "http://127.0.0.1:" + strconv.Itoa(port), NodeLabel: "node", Timeout: 5 * time.Second}, Step: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	events := func() (int, int, error) {
		obs, err := src.Observe(t.Context(), time.Now(), time.Minute)
		if err != nil {
			return 0, 0, err
		}
		n, samples, _ := oomsIn(obs, "n1", "GPU-a", time.Time{})
		return n, samples, nil
	}
	// The old process, watched for a while: its 1 is the baseline.
	poll(t, 30*time.Second, func() string {
		n, samples, err := events()
		switch {
		case err != nil:
			return err.Error()
		case samples < 5:
			return fmt.Sprintf("%d samples", samples)
		case n != 0:
			t.Fatalf("%d OOM events before the restart, want 0", n)
		}
		return ""
	})
	if inPlace {
		phase.Store(1)
		time.Sleep(3 * time.Second) // a few failed scrapes
	}
	phase.Store(2)
	poll(t, 30*time.Second, func() string {
		n, _, err := events()
		switch {
		case err != nil:
			return err.Error()
		case n != 1:
			return fmt.Sprintf("%d OOM events after the restart, want 1", n)
		}
		return ""
	})
}

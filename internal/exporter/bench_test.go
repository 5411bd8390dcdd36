package exporter

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/gpu/sim"
	"github.com/gpuslice/gpuslice/internal/oom"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/pods"
	"github.com/gpuslice/gpuslice/test/simnode"
)

// bigExporter is an Exporter on the big simulated node multiplied by s,
// with every source on.
func bigExporter(b testing.TB, s simnode.Scale) *Exporter {
	b.Helper()
	n, err := simnode.BigScaled(b.TempDir(), s)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	if err := n.Start(ctx); err != nil {
		b.Fatal(err)
	}
	client, err := podresources.NewClient(n.PodResourcesSocket())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Close() })
	if err := n.Age(time.Hour); err != nil {
		b.Fatal(err)
	}
	det, err := oom.NewDetector(oom.Config{PodLogsDir: n.PodLogs()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { det.Close() })
	list := n.PodObjects()
	ptrs := make([]*corev1.Pod, len(list))
	for i := range list {
		ptrs[i] = &list[i]
	}
	e := New(Config{GPU: sim.New(n.SimFile()), Kubelet: client, Pods: pods.NewStatic(ptrs), Procfs: n.Procfs(), OOM: det})
	b.Cleanup(func() { e.Close() })
	return e
}

// BenchmarkCollect is the exporter as a prometheus.Collector, the path
// of registries (tests) and of protobuf scrapes, which builds each
// series' label pairs afresh; BenchmarkScrape is the path of text scrapes.
func BenchmarkCollect(b *testing.B) {
	e := bigExporter(b, simnode.Scale{})
	ch := make(chan prometheus.Metric, 4096)
	collect := func() int {
		go func() { e.Collect(ch); close(ch) }()
		containers := 0
		for m := range ch {
			if m.Desc() == containerMem.desc {
				containers++
			}
		}
		ch = make(chan prometheus.Metric, 4096)
		return containers
	}
	// Every pod must be attributed, or the benchmark measures a failure.
	if got := collect(); got < 110 {
		b.Fatalf("only %d container memory series from the big node", got)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		collect()
	}
}

// BenchmarkScrape is a whole scrape as the exporter serves it (collect,
// text encoding) on the big node multiplied by processes (with
// their pods) and by replicas per GPU. The cost should grow with the
// processes and stay flat with the replicas; ns/process shows the first.
func BenchmarkScrape(b *testing.B) {
	for _, s := range []simnode.Scale{{Processes: 1, Replicas: 1}, {Processes: 2, Replicas: 1}, {Processes: 4, Replicas: 1}, {Processes: 1, Replicas: 2}, {Processes: 1, Replicas: 4}} {
		b.Run(fmt.Sprintf("procs=%dx/replicas=%dx", s.Processes, s.Replicas), func(b *testing.B) {
			h := bigExporter(b, s).Handler(prometheus.NewRegistry(), nil)
			scrape := func() *httptest.ResponseRecorder {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
				return w
			}
			w := scrape()
			if w.Code != 200 || !bytes.Contains(w.Body.Bytes(), []byte("gpuslice_container_gpu_memory_used_bytes{")) {
				b.Fatalf("scrape: %d\n%.2000s", w.Code, w.Body.String())
			}
			lines := bytes.Count(w.Body.Bytes(), []byte("\n"))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				scrape()
			}
			b.StopTimer()
			b.ReportMetric(float64(lines), "lines")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(512*s.Processes), "ns/process")
		})
	}
}

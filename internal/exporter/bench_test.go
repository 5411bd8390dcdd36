package exporter

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/gpu/sim"
	"github.com/gpuslice/gpuslice/internal/oom"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/pods"
	"github.com/gpuslice/gpuslice/test/simnode"
)

func BenchmarkCollect(b *testing.B) {
	n, err := simnode.Big(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := n.Start(ctx); err != nil {
		b.Fatal(err)
	}
	client, err := podresources.NewClient(n.PodResourcesSocket())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	det, err := oom.NewDetector(oom.Config{PodLogsDir: n.PodLogs()})
	if err != nil {
		b.Fatal(err)
	}
	list := n.PodObjects()
	ptrs := make([]*corev1.Pod, len(list))
	for i := range list {
		ptrs[i] = &list[i]
	}
	e := New(Config{GPU: sim.New(n.SimFile()), Kubelet: client, Pods: pods.NewStatic(ptrs), Procfs: n.Procfs(), OOM: det})
	ch := make(chan prometheus.Metric, 4096)
	collect := func() int {
		go func() { e.Collect(ch); close(ch) }()
		containers := 0
		for m := range ch {
			if m.Desc() == containerMem {
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

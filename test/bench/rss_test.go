package bench

import (
	"github.com/gpuslice/gpuslice/internal/testproc"

	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/test/simnode"
)

// BenchmarkExporterRSS runs gpuslice-exporter on the big simulated node
// (8 GPUs × 64 processes, 500 /proc entries, 110 pods), scrapes it 1,000
// times and reports its resident memory afterwards (rss-MiB), to catch
// memory that grows with scrapes.
func BenchmarkExporterRSS(b *testing.B) {
	dir := b.TempDir()
	bin := testproc.Build(b, "cmd/exporter")
	n, err := simnode.Big(filepath.Join(dir, "node"))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := n.Start(ctx); err != nil {
		b.Fatal(err)
	}
	addr := testproc.FreeAddr(b)
	cmd := exec.CommandContext(ctx, bin, "--web.listen-address="+addr, "--gpu.backend=sim", "--sim.file="+n.SimFile(),
		"--path.procfs="+n.Procfs(), "--path.pod-logs="+n.PodLogs(), "--kubelet.pod-resources-socket="+n.PodResourcesSocket(),
		"--pods.source=kubelet", "--kubelet.url="+n.KubeletURL(), "--kubelet.token-file=", "--log.level=error")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	url := "http://" + addr + "/metrics"
	scrape := func() error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err == nil && !strings.Contains(string(body), "gpuslice_container_gpu_memory_used_bytes{") {
			b.Fatal("scrape has no container series")
		}
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for scrape() != nil {
		if time.Now().After(deadline) {
			b.Fatal("exporter did not answer")
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < 1000; j++ {
			if err := scrape(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(rssMiB(b, cmd.Process.Pid), "rss-MiB")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000)/1e6, "ms/scrape")
}

func rssMiB(b *testing.B, pid int) float64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

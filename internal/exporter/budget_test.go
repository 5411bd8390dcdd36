package exporter

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/podresources/podresourcestest"
)

// slowGPU reads its GPUs in d, whatever the context says: NVML's calls
// block and do not see it.
type slowGPU struct {
	*gputest.Fake
	d time.Duration
}

func (s slowGPU) Snapshot(ctx context.Context) (gpu.Snapshot, error) {
	time.Sleep(s.d)
	return s.Fake.Snapshot(context.Background())
}

// budgetCase scrapes, after a GPU reading of 300 ms, a kubelet that
// answers at once under the timeouts given, and checks each collector's
// success.
func budgetCase(t *testing.T, timeout, scrapeTimeout time.Duration, wantPodResources string) {
	t.Helper()
	sock := podresourcestest.SocketPath(t)
	if _, err := podresourcestest.Start(t, sock); err != nil {
		t.Fatal(err)
	}
	c, err := podresources.NewClient(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fake := gputest.NewFake(gputest.GPU(gputest.UUID(0), 1<<30))
	e := New(Config{GPU: slowGPU{fake, 300 * time.Millisecond}, Kubelet: c, Procfs: t.TempDir(),
		Timeout: timeout, ScrapeTimeout: scrapeTimeout})
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)
	if got := success(t, reg, "podresources"); got != wantPodResources {
		t.Errorf("podresources success %s after a slow GPU reading, want %s", got, wantPodResources)
	}
	if got := success(t, reg, "gpu"); got != "1" {
		t.Errorf("gpu success %s, want 1", got)
	}
}

// TestSlowGPUDoesNotFailTheKubelet: a GPU reading that takes longer than
// the sources' timeout leaves the kubelet's calls their own: a kubelet
// that answers at once is not reported failed.
func TestSlowGPUDoesNotFailTheKubelet(t *testing.T) {
	budgetCase(t, 250*time.Millisecond, 0, "1")
}

// TestScrapeDeadlineBoundsTheSources: the sources' own deadlines lie
// within the scrape's: once a GPU reading has taken it all, the kubelet is
// not asked for another Timeout, and the scrape answers with what it has.
func TestScrapeDeadlineBoundsTheSources(t *testing.T) {
	budgetCase(t, time.Minute, 250*time.Millisecond, "0")
}

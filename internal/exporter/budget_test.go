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

// TestSlowGPUDoesNotFailTheKubelet: a GPU reading that takes longer than
// the scrape's timeout leaves the kubelet's calls their own: a kubelet
// that answers at once is not reported failed.
func TestSlowGPUDoesNotFailTheKubelet(t *testing.T) {
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
	e := New(Config{GPU: slowGPU{fake, 300 * time.Millisecond}, Kubelet: c, Procfs: t.TempDir(), Timeout: 250 * time.Millisecond})
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)
	if got := success(t, reg, "podresources"); got != "1" {
		t.Errorf("podresources success %s after a slow GPU reading, want 1", got)
	}
	if got := success(t, reg, "gpu"); got != "1" {
		t.Errorf("gpu success %s, want 1", got)
	}
}

// TestScrapeDeadlineBoundsTheSources: the sources' own deadlines lie
// within the scrape's: once a GPU reading has taken it all, the kubelet is
// not asked for another Timeout, and the scrape answers with what it has.
func TestScrapeDeadlineBoundsTheSources(t *testing.T) {
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
		Timeout: time.Minute, ScrapeTimeout: 250 * time.Millisecond})
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)
	if got := success(t, reg, "podresources"); got != "0" {
		t.Errorf("podresources success %s after the scrape's deadline passed, want 0", got)
	}
	if got := success(t, reg, "gpu"); got != "1" {
		t.Errorf("gpu success %s, want 1", got)
	}
}

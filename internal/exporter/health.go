package exporter

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/gpuslice/gpuslice/internal/gpu"
)

// health counts the collections in a row that read no GPU, for /healthz.
//
// Only an exporter that has read a GPU before can turn unhealthy: a restart
// is what brings back an NVML broken under a running container (a driver
// upgrade, a systemd daemon-reload dropping its device access), but it
// cannot give a container NVML it never had; that exporter keeps running
// and says in its log what to fix (see nvmlbackend.initHint), where a crash
// loop would bury the message under restarts.
type health struct {
	max int // 0: never unhealthy

	mu          sync.Mutex
	everRead    bool
	unreadable  int    // collections in a row with no readable GPU
	collections uint64 // collections so far, to see whether scrapes happen
	probed      uint64 // collections at the last /healthz
	last        error  // why the last collection read no GPU
	// read are the UUIDs of the GPUs the last reading read, which a
	// probe may check without a Snapshot (probeGPUs).
	read []string
}

// record notes one collection: whether it read a GPU, and if not, why.
func (h *health) record(read bool, why error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.collections++
	if read {
		h.everRead, h.unreadable, h.last = true, 0, nil
		return
	}
	h.unreadable++
	h.last = why
}

// check returns nil while healthy. stale reports whether no collection ran
// since the previous check (nobody scrapes), so the caller reads the GPUs
// itself before judging.
func (h *health) check() (stale bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	stale = h.collections == h.probed
	h.probed = h.collections
	if h.max > 0 && h.everRead && h.unreadable >= h.max {
		err = fmt.Errorf("no GPU readable in the last %d collections: %w", h.unreadable, h.last)
	}
	return stale, err
}

// errNoGPU is why a collection whose reading returned no error read no GPU.
var errNoGPU = errors.New("the GPU backend returned no GPU")

// recordSnapshot records one GPU reading.
func (h *health) recordSnapshot(s gpu.Snapshot, err error) {
	read := make([]string, len(s.Devices))
	for i, d := range s.Devices {
		read[i] = d.UUID
	}
	h.mu.Lock()
	h.read = read
	h.mu.Unlock()
	switch {
	case len(s.Devices) > 0:
		h.record(true, nil)
	case err != nil:
		h.record(false, err)
	case len(s.Failed) > 0:
		f := s.Failed[0]
		h.record(false, &f)
	default:
		h.record(false, errNoGPU)
	}
}

// Healthz serves /healthz: 200 while the exporter reads GPUs, 503 after
// Config.MaxGPUFailures collections in a row read none (after it had read
// one). When nothing scraped since the previous probe, the probe reads the
// GPUs itself, so a broken NVML is noticed without a Prometheus.
func (e *Exporter) Healthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stale, err := e.health.check()
		if stale {
			e.probeGPUs(r.Context())
			_, err = e.health.check()
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "unhealthy:", err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}

// readGPUs returns the UUIDs of the GPUs the last reading read.
func (h *health) readGPUs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.read
}

// probeGPUs reads the GPUs outside a scrape, only to judge health.
//
// A Snapshot moves the window that the GPUs' and processes' utilization
// covers (gpu.Device.Utilization), so a probe that took one would leave
// the next scrape's ratios covering only the time since the probe: with a
// 60 s scrape and a 20 s probe, the last 20 s at most. Where the backend
// lists a GPU's processes on their own (gpu.ProcessLister), which moves no
// window, one GPU of the last reading that answers is a GPU read. When
// none answers, or the last reading read none, a Snapshot judges: the GPUs
// are failing, so there is no window to keep, and it is the Snapshot that
// brings a broken NVML back up (nvmlbackend.Backend.Snapshot).
func (e *Exporter) probeGPUs(ctx context.Context) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if l, ok := e.cfg.GPU.(gpu.ProcessLister); ok {
		for _, uuid := range e.health.readGPUs() {
			if _, err := l.ComputeProcesses(ctx, uuid); err == nil {
				e.health.record(true, nil)
				return
			}
		}
	}
	snap, err := e.cfg.GPU.Snapshot(ctx)
	e.health.recordSnapshot(snap, err)
}

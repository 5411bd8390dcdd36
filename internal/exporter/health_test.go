package exporter

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
	nvmlbackend "github.com/gpuslice/gpuslice/internal/gpu/nvml"
	"github.com/gpuslice/gpuslice/internal/gpu/nvml/nvmltest"
)

func probe(t *testing.T, e *Exporter) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	e.Healthz().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	return rec.Code, rec.Body.String()
}

// TestHealthz: /healthz fails after MaxGPUFailures collections in a row
// read no GPU, counting scrapes and, when nobody scrapes, its own readings;
// it recovers with the GPUs, and never fails an exporter that has not read
// a GPU yet (a restart cannot give it NVML).
func TestHealthz(t *testing.T) {
	broken := fmt.Errorf("%w: nvml device count: ERROR_UNKNOWN", gpu.ErrUnavailable)
	fake := gputest.NewFake(gputest.GPU(gputest.UUID(0), gputest.A6000MemoryBytes))
	e := New(Config{GPU: fake, Procfs: t.TempDir(), MaxGPUFailures: 3})
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)
	scrape := func() {
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
	}

	if code, body := probe(t, e); code != http.StatusOK {
		t.Fatalf("healthy node: %d %s", code, body)
	}
	fake.SetError(broken)
	scrape()
	scrape()
	if code, body := probe(t, e); code != http.StatusOK {
		t.Fatalf("after 2 failed scrapes (of 3 allowed): %d %s", code, body)
	}
	scrape()
	code, body := probe(t, e)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "3 collections") || !strings.Contains(body, "ERROR_UNKNOWN") {
		t.Fatalf("after 3 failed scrapes: %d %q, want 503 naming the count and the error", code, body)
	}

	// Nobody scrapes: each probe reads the GPUs itself.
	fake.SetError(nil)
	before := fake.Snapshots()
	if code, body := probe(t, e); code != http.StatusOK {
		t.Fatalf("GPUs back, no scrape: %d %s", code, body)
	}
	if fake.Snapshots() != before+1 {
		t.Errorf("the probe read the GPUs %d times, want once", fake.Snapshots()-before)
	}
	fake.SetError(broken)
	for i := range 3 {
		code, _ := probe(t, e)
		if want := map[bool]int{true: http.StatusServiceUnavailable, false: http.StatusOK}[i == 2]; code != want {
			t.Errorf("unscraped probe %d with NVML broken: %d, want %d", i+1, code, want)
		}
	}
	// A scrape since the last probe: the probe does not read again.
	fake.SetError(nil)
	scrape()
	before = fake.Snapshots()
	if code, _ := probe(t, e); code != http.StatusOK || fake.Snapshots() != before {
		t.Errorf("probe after a scrape: %d, %d readings of its own; want 200 and none", code, fake.Snapshots()-before)
	}

	t.Run("never read a GPU: stays healthy", func(t *testing.T) {
		fake := gputest.NewFake()
		fake.SetError(fmt.Errorf("%w: nvml init: ERROR_LIBRARY_NOT_FOUND", gpu.ErrUnavailable))
		e := New(Config{GPU: fake, Procfs: t.TempDir(), MaxGPUFailures: 1})
		for range 5 {
			if code, body := probe(t, e); code != http.StatusOK {
				t.Fatalf("%d %s", code, body)
			}
		}
	})
	t.Run("0 never fails", func(t *testing.T) {
		fake := gputest.NewFake(gputest.GPU(gputest.UUID(0), gputest.A6000MemoryBytes))
		e := New(Config{GPU: fake, Procfs: t.TempDir()})
		probe(t, e)
		fake.SetError(broken)
		for range 5 {
			if code, body := probe(t, e); code != http.StatusOK {
				t.Fatalf("%d %s", code, body)
			}
		}
	})
}

// listingFake is a Fake that also lists a GPU's processes on their own
// (gpu.ProcessLister), counting those readings; err makes them fail.
type listingFake struct {
	*gputest.Fake
	mu     sync.Mutex
	listed int
	err    error
}

func (f *listingFake) ComputeProcesses(_ context.Context, uuid string) ([]gpu.Process, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listed++
	if f.err != nil {
		return nil, f.err
	}
	return []gpu.Process{{PID: 4242}}, nil
}

func (f *listingFake) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *listingFake) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.listed
}

// TestHealthzKeepsSampleWindow: a probe that nobody's scrape preceded
// reads the GPUs without a Snapshot where the backend can list processes
// on their own, since a Snapshot moves the window the next scrape's
// utilization covers. While the GPUs fail it does take Snapshots, which
// judge and bring NVML back, and it still turns unhealthy.
func TestHealthzKeepsSampleWindow(t *testing.T) {
	broken := fmt.Errorf("%w: nvml device count: ERROR_UNKNOWN", gpu.ErrUnavailable)
	fake := &listingFake{Fake: gputest.NewFake(gputest.GPU(gputest.UUID(0), gputest.A6000MemoryBytes))}
	e := New(Config{GPU: fake, Procfs: t.TempDir(), MaxGPUFailures: 2})
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	probe(t, e) // a scrape came before it: no reading of its own

	for i := range 3 {
		snaps, listed := fake.Snapshots(), fake.count()
		if code, body := probe(t, e); code != http.StatusOK {
			t.Fatalf("unscraped probe %d: %d %s", i+1, code, body)
		}
		if fake.Snapshots() != snaps || fake.count() != listed+1 {
			t.Fatalf("unscraped probe %d: %d snapshots, %d process lists; want 0 and 1", i+1, fake.Snapshots()-snaps, fake.count()-listed)
		}
	}

	fake.set(broken)
	fake.SetError(broken)
	for i, want := range []int{http.StatusOK, http.StatusServiceUnavailable} {
		snaps := fake.Snapshots()
		if code, _ := probe(t, e); code != want {
			t.Errorf("probe %d with NVML broken: %d, want %d", i+1, code, want)
		}
		if fake.Snapshots() != snaps+1 {
			t.Errorf("probe %d with NVML broken: %d snapshots, want 1", i+1, fake.Snapshots()-snaps)
		}
	}

	// Back: the first probe reads a Snapshot (the last reading read no
	// GPU), the next lists processes again.
	fake.set(nil)
	fake.SetError(nil)
	for i, wantSnaps := range []int{1, 0} {
		snaps := fake.Snapshots()
		if code, body := probe(t, e); code != http.StatusOK {
			t.Fatalf("probe %d after recovery: %d %s", i+1, code, body)
		}
		if got := fake.Snapshots() - snaps; got != wantSnaps {
			t.Errorf("probe %d after recovery: %d snapshots, want %d", i+1, got, wantSnaps)
		}
	}
}

// samplesLib is an nvmltest library whose GPUs record the windows their
// utilization samples are asked for.
type samplesLib struct {
	*nvmltest.Lib
	mu    sync.Mutex
	since []uint64 // lastSeenTimeStamp of each GetSamples call
	upTo  []uint64 // the newest sample each call gave
}

type samplesGPU struct {
	*nvmltest.GPU
	lib *samplesLib
}

func (l *samplesLib) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	if _, ret := l.Lib.DeviceGetHandleByIndex(i); ret != nvml.SUCCESS {
		return nil, ret
	}
	return samplesGPU{l.GPUs[i], l}, nvml.SUCCESS
}

func (g samplesGPU) GetSamples(typ nvml.SamplingType, since uint64) (nvml.ValueType, []nvml.Sample, nvml.Return) {
	vt, samples, ret := g.GPU.GetSamples(typ, since)
	g.lib.mu.Lock()
	defer g.lib.mu.Unlock()
	g.lib.since = append(g.lib.since, since)
	var newest uint64
	for _, s := range samples {
		newest = max(newest, s.TimeStamp)
	}
	g.lib.upTo = append(g.lib.upTo, newest)
	return vt, samples, ret
}

// TestHealthzKeepsNVMLWindow: with the NVML backend, a scrape after
// probes that no scrape preceded asks for the samples since the previous
// scrape, not since a probe.
func TestHealthzKeepsNVMLWindow(t *testing.T) {
	lib := &samplesLib{Lib: nvmltest.New(&nvmltest.GPU{UUID: gputest.UUID(0), Name: "NVIDIA H200", MemTotal: 150 << 30, Util: 40})}
	backend, err := nvmlbackend.New(lib, nvmlbackend.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	e := New(Config{GPU: backend, Procfs: t.TempDir(), MaxGPUFailures: 3})
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)
	scrape := func() {
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
	}
	scrape()
	for range 3 {
		if code, body := probe(t, e); code != http.StatusOK {
			t.Fatalf("probe: %d %s", code, body)
		}
	}
	scrape()
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if len(lib.since) != 2 || lib.since[1] != lib.upTo[0] {
		t.Errorf("utilization samples asked since %v, each call giving up to %v; want two calls, the second since the first's newest sample", lib.since, lib.upTo)
	}
}

package exporter

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
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

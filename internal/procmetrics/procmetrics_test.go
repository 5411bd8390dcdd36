package procmetrics

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpuslice/gpuslice/dashboards/metricnames"
)

func gather(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

func value(mf *dto.MetricFamily) float64 {
	m := mf.GetMetric()[0]
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// The same families, types and help as client_golang's collector, and the
// same values for what does not move between two readings.
func TestSameAsClientGolang(t *testing.T) {
	ours, theirs := gather(t, New()), gather(t, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if len(theirs) == 0 {
		t.Skip("client_golang's collector reads nothing here")
	}
	for name, mf := range theirs {
		o := ours[name]
		if o == nil {
			t.Errorf("%s missing", name)
			continue
		}
		if o.GetType() != mf.GetType() || o.GetHelp() != mf.GetHelp() {
			t.Errorf("%s: type %v help %q, want %v %q", name, o.GetType(), o.GetHelp(), mf.GetType(), mf.GetHelp())
		}
	}
	if len(ours) != len(theirs) {
		t.Errorf("%d families, client_golang's %d", len(ours), len(theirs))
	}
	for _, name := range []string{"process_start_time_seconds", "process_max_fds", "process_virtual_memory_max_bytes"} {
		if a, b := value(ours[name]), value(theirs[name]); math.Abs(a-b) > 0.01 {
			t.Errorf("%s = %v, client_golang's %v", name, a, b)
		}
	}
	before := value(ours["process_cpu_seconds_total"])
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
	}
	if after := value(gather(t, New())["process_cpu_seconds_total"]); after <= before {
		t.Errorf("process_cpu_seconds_total %v after 100 ms of work, was %v", after, before)
	}
}

// The process metrics the alerts read are served.
func TestServesTheProcessMetricsRulesRead(t *testing.T) {
	got := gather(t, New())
	for _, name := range metricnames.Process {
		if got[name] == nil {
			t.Errorf("%s is not served; the alerts read it", name)
		}
	}
}

func BenchmarkCollect(b *testing.B) {
	for _, c := range []struct {
		name string
		c    prometheus.Collector
	}{{"procmetrics", New()}, {"client_golang", collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})}} {
		b.Run(c.name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			reg.MustRegister(c.c)
			for b.Loop() {
				if _, err := reg.Gather(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package exporter

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// metricsOf sends the set's series and returns them as written.
func metricsOf(t *testing.T, s *seriesSet) []*dto.Metric {
	t.Helper()
	ch := make(chan prometheus.Metric, 1000)
	s.send(ch)
	close(ch)
	var out []*dto.Metric
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		out = append(out, &pb)
	}
	return out
}

// TestSeriesSet: a series sent from the set writes exactly what a fresh
// const metric writes, with the new value; a series a scrape did not set
// is forgotten.
func TestSeriesSet(t *testing.T) {
	s := newSeriesSet()
	write := func(m prometheus.Metric) *dto.Metric {
		t.Helper()
		var out dto.Metric
		if err := m.Write(&out); err != nil {
			t.Fatal(err)
		}
		return &out
	}
	labels := []string{"ns", "pod", "main", "0", "GPU-x", "log", "device"}
	for i, v := range []float64{1, 2, 2, 5} {
		s.begin()
		s.set(gpuMemUsed, prometheus.GaugeValue, v, "0", "GPU-x")
		s.set(oomEvents, prometheus.CounterValue, v, labels...)
		s.finish()
		got := metricsOf(t, s)
		want := []*dto.Metric{
			write(prometheus.MustNewConstMetric(oomEvents.desc, prometheus.CounterValue, v, labels...)),
			write(prometheus.MustNewConstMetric(gpuMemUsed.desc, prometheus.GaugeValue, v, "0", "GPU-x")),
		}
		if oomEvents.name < gpuMemUsed.name {
			t.Fatal("the test assumes gpu_memory sorts first")
		}
		want[0], want[1] = want[1], want[0]
		if len(got) != 2 || !proto.Equal(got[0], want[0]) || !proto.Equal(got[1], want[1]) {
			t.Fatalf("scrape %d: sent %v, want %v", i, got, want)
		}
	}
	if n := len(s.byFamily[gpuMemUsed.index].byKey) + len(s.byFamily[oomEvents.index].byKey); n != 2 {
		t.Fatalf("%d series kept, want 2", n)
	}
	s.begin()
	s.set(gpuMemUsed, prometheus.GaugeValue, 1, "0", "GPU-x")
	s.finish()
	if len(s.byFamily[oomEvents.index].byKey) != 0 || len(s.byFamily[oomEvents.index].list) != 0 {
		t.Fatal("a series not set stays")
	}
}

// TestSeriesSetOrder: a family's series come in the registry's order
// whatever order they were set in, also when series are added later.
func TestSeriesSetOrder(t *testing.T) {
	s := newSeriesSet()
	values := func() []string {
		var out []string
		for _, sr := range s.byFamily[gpuMemUsed.index].list {
			out = append(out, sr.values[0]+"/"+sr.values[1])
		}
		return out
	}
	for _, round := range []struct {
		set  [][2]string
		want string
	}{
		{[][2]string{{"3", "GPU-d"}, {"1", "GPU-b"}, {"10", "GPU-c"}}, "1/GPU-b 10/GPU-c 3/GPU-d"},
		{[][2]string{{"3", "GPU-d"}, {"0", "GPU-a"}, {"10", "GPU-c"}}, "0/GPU-a 10/GPU-c 3/GPU-d"},
	} {
		s.begin()
		for _, l := range round.set {
			s.set(gpuMemUsed, prometheus.GaugeValue, 1, l[0], l[1])
		}
		s.finish()
		if got := strings.Join(values(), " "); got != round.want {
			t.Fatalf("order %s, want %s", got, round.want)
		}
	}
}

// TestSeriesSetErrors: a series set twice in a scrape, or with a label
// value that is not UTF-8, fails the registry's Gather, as a duplicate or
// invalid const metric did, and the rest is still gathered.
func TestSeriesSetErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(s *seriesSet)
		want string
	}{
		{"duplicate", func(s *seriesSet) {
			s.set(gpuMemUsed, prometheus.GaugeValue, 1, "0", "GPU-a")
			s.set(gpuMemUsed, prometheus.GaugeValue, 2, "0", "GPU-a")
		}, "set twice"},
		{"not UTF-8", func(s *seriesSet) {
			s.set(gpuInfo, prometheus.GaugeValue, 1, "0", "GPU-a", "\xff", "580")
		}, "UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSeriesSet()
			s.begin()
			tc.set(s)
			s.set(gpuMemTotal, prometheus.GaugeValue, 1, "0", "GPU-a")
			s.finish()
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(collectorFunc(s.send))
			mfs, err := reg.Gather()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Gather error %v, want one saying %q", err, tc.want)
			}
			if len(mfs) == 0 {
				t.Fatal("nothing gathered besides the error")
			}
		})
	}
}

// collectorFunc is an unchecked collector.
type collectorFunc func(chan<- prometheus.Metric)

func (f collectorFunc) Describe(chan<- *prometheus.Desc)    {}
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) { f(ch) }

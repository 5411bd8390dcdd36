package exporter

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"

	"github.com/gpuslice/gpuslice/test/simnode"
)

// expfmtText encodes families as promhttp does, in the text format or in
// OpenMetrics (with its closing line).
func expfmtText(t testing.TB, mfs []*dto.MetricFamily, om bool) string {
	t.Helper()
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	if om {
		format = expfmt.NewFormat(expfmt.TypeOpenMetrics)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, format)
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	if c, ok := enc.(expfmt.Closer); ok {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return buf.String()
}

// ours renders the set as the handler does.
func ours(s *seriesSet, om bool) string {
	var b []byte
	for _, f := range families {
		b = s.appendFamily(b, f, om)
	}
	if om {
		b = append(b, "# EOF\n"...)
	}
	return string(b)
}

// TestAppendValue: numbers are written as expfmt writes them.
func TestAppendValue(t *testing.T) {
	for _, v := range []float64{0, math.Copysign(0, -1), 1, -1, 2, 0.5, 1e-9, 123456789, 51527024640, 1.5e21, 1e21, 0.1 + 0.2,
		math.MaxFloat64, math.SmallestNonzeroFloat64, math.Inf(1), math.Inf(-1), math.NaN(), -3.25, 4294967296} {
		for _, om := range []bool{false, true} {
			mf := &dto.MetricFamily{Name: proto.String("x"), Help: proto.String("h"), Type: dto.MetricType_GAUGE.Enum(),
				Metric: []*dto.Metric{{Gauge: &dto.Gauge{Value: proto.Float64(v)}}}}
			want := expfmtText(t, []*dto.MetricFamily{mf}, om)
			want = strings.TrimSuffix(strings.Split(want, "\nx ")[1], "\n# EOF\n")
			if got := string(appendValue(nil, v, om)); got != strings.TrimSuffix(want, "\n") {
				t.Errorf("%v (OpenMetrics %v): %q, expfmt writes %q", v, om, got, want)
			}
		}
	}
}

// TestFamilyHeaders: HELP and TYPE lines as expfmt writes them, escapes
// included; OpenMetrics names a counter family without _total.
func TestFamilyHeaders(t *testing.T) {
	for _, typ := range []prometheus.ValueType{prometheus.GaugeValue, prometheus.CounterValue} {
		f := &family{name: "gpuslice_x_total", help: "a \\ back\\slash, a \"quote\"\nand a newline ×", typ: typ}
		text, om := familyHeaders(f)
		mf := &dto.MetricFamily{Name: &f.name, Help: &f.help, Type: dto.MetricType_GAUGE.Enum(),
			Metric: []*dto.Metric{{Gauge: &dto.Gauge{Value: proto.Float64(1)}}}}
		if typ == prometheus.CounterValue {
			mf.Type = dto.MetricType_COUNTER.Enum()
			mf.Metric[0] = &dto.Metric{Counter: &dto.Counter{Value: proto.Float64(1)}}
		}
		for _, tc := range []struct {
			om   bool
			got  []byte
			name string
		}{{false, text, "text"}, {true, om, "OpenMetrics"}} {
			want := expfmtText(t, []*dto.MetricFamily{mf}, tc.om)
			if !strings.HasPrefix(want, string(tc.got)) || strings.Count(string(tc.got), "\n") != 2 {
				t.Errorf("%v %s header %q, expfmt writes %q", typ, tc.name, tc.got, want)
			}
		}
	}
}

// TestExpositionMatchesRegistry: on the big node, and on the demo node
// with label values that need escaping, the exporter's own exposition is
// byte for byte what the registry gathers from the same scrape and expfmt
// encodes, in the text format and in OpenMetrics; and the families it
// gives promhttp for the other formats are the registry's.
func TestExpositionMatchesRegistry(t *testing.T) {
	odd := newDemo(t)
	odd.node.GPUs[0].Name = "NVIDIA \"RTX\" A6000 \\ with a\nnewline, 日本"
	if err := odd.node.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		e    *Exporter
	}{
		{"big node", bigExporter(t, simnode.Scale{})},
		{"demo node, odd GPU name", odd.exp},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.e
			for scrape := 0; scrape < 2; scrape++ {
				e.mu.Lock()
				e.collect()
				reg := prometheus.NewPedanticRegistry()
				reg.MustRegister(collectorFunc(e.series.send))
				want, err := reg.Gather()
				if err != nil {
					t.Fatal(err)
				}
				got := e.series.metricFamilies()
				if len(got) != len(want) {
					t.Fatalf("%d families, the registry gathers %d", len(got), len(want))
				}
				for i := range want {
					if !proto.Equal(got[i], want[i]) {
						t.Fatalf("family %s differs from the registry's:\n%v\n%v", want[i].GetName(), got[i], want[i])
					}
				}
				for _, om := range []bool{false, true} {
					if got, want := ours(e.series, om), expfmtText(t, want, om); got != want {
						t.Errorf("scrape %d, OpenMetrics %v: exposition differs from expfmt's:\n%s", scrape, om, diffLines(want, got))
					}
				}
				e.mu.Unlock()
			}
		})
	}
	if !strings.Contains(ours(odd.exp.series, false), `name="NVIDIA \"RTX\" A6000 \\ with a\nnewline, 日本"`) {
		t.Error("the odd GPU name is not in the exposition, escaped")
	}
}

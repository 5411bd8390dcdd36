package exporter

import (
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
)

// family is one gpuslice_* metric family: the prometheus.Desc that the
// Collector path sends, and what the text exposition needs that a Desc
// does not show (its name, help, type and label names), with its HELP and
// TYPE lines rendered once.
type family struct {
	desc   *prometheus.Desc
	name   string
	help   string
	typ    prometheus.ValueType
	labels []string
	// byName is the indexes of labels sorted by label name: the order of
	// a series' label pairs, in which the registry sorts series.
	byName []int
	// index is the family's place in families, which is sorted by name:
	// the order of the exposition, as the registry orders families.
	index int
	// header is the HELP and TYPE lines in the text format 0.0.4,
	// omHeader in OpenMetrics.
	header, omHeader []byte
}

// families are every family of the package, sorted by name in init.
var families []*family

func gauge(name, help string, labels []string) *family {
	return newFamily(name, help, prometheus.GaugeValue, labels)
}

func counter(name, help string, labels []string) *family {
	return newFamily(name, help, prometheus.CounterValue, labels)
}

func newFamily(name, help string, typ prometheus.ValueType, labels []string) *family {
	// The exposition writes names as they are, which every escaping scheme
	// a scraper may ask for leaves alone only for legacy names.
	for _, n := range append([]string{name}, labels...) {
		if !model.LegacyValidation.IsValidMetricName(n) {
			panic(fmt.Sprintf("exporter: %q is not a legacy Prometheus name", n))
		}
	}
	f := &family{desc: prometheus.NewDesc(name, help, labels, nil), name: name, help: help, typ: typ, labels: labels}
	for i := range labels {
		f.byName = append(f.byName, i)
	}
	slices.SortFunc(f.byName, func(a, b int) int { return strings.Compare(labels[a], labels[b]) })
	f.header, f.omHeader = familyHeaders(f)
	families = append(families, f)
	return f
}

func init() {
	slices.SortFunc(families, func(a, b *family) int { return strings.Compare(a.name, b.name) })
	for i, f := range families {
		f.index = i
	}
}

// series is one series of a family, kept from scrape to scrape.
type series struct {
	fam *family
	// key is the label values, each followed by keySep; values are
	// substrings of it.
	key    string
	values []string
	// prefix is its sample line up to the value: `name{label="value",…} `,
	// the same in the text format and in OpenMetrics.
	prefix []byte
	value  float64
	gen    uint64 // the last scrape that set it
}

// keySep ends each label value in a series key. It is not in any UTF-8
// text, so the key of valid label values is unambiguous, and a key of
// invalid ones (which a series is never created with) matches none of
// them: it holds more separators.
const keySep = 0xff

// familySeries are the series of one family.
type familySeries struct {
	byKey map[string]*series
	// list holds them sorted as the registry sorts them, once finish has
	// run.
	list  []*series
	grown bool // a series was added since the sort
}

// seriesSet holds the series of the last scrape in exposition order. A
// node's series are the same from one scrape to the next (the same
// containers on the same GPUs) while only their values move, so a series
// is built, validated and rendered once, when it first appears, sorted
// into its family only then, and dropped when a scrape no longer sets it.
// A scrape then costs a map look-up per series and, to expose, a copy of
// each prefix and a number; the registry's per-scrape validation, hashing
// and sorting of every series took most of a scrape's CPU time.
//
// What a series keeps is its rendered line: label pairs, which only the
// Collector and protobuf paths use, are built when they ask, since kept
// for every series they took more memory than the rest of the exporter's
// state. A series is never changed once built but for its value, so what
// the registry gathers after the next scrape began stays valid.
type seriesSet struct {
	gen      uint64
	byFamily []familySeries // by family.index
	key      []byte         // scratch for look-ups
	// errs are the series of this scrape that could not be set.
	errs []seriesError
}

type seriesError struct {
	fam *family
	err error
}

func newSeriesSet() *seriesSet {
	s := &seriesSet{byFamily: make([]familySeries, len(families))}
	for i := range s.byFamily {
		s.byFamily[i].byKey = map[string]*series{}
	}
	return s
}

// begin starts a scrape.
func (s *seriesSet) begin() {
	s.gen++
	clear(s.errs)
	s.errs = s.errs[:0]
}

// set gives a series its value in this scrape. A series set twice keeps
// the first value and reports the second as an error, as the registry
// does; so does a series whose label values are not valid.
func (s *seriesSet) set(f *family, t prometheus.ValueType, v float64, values ...string) {
	if t != f.typ {
		panic(fmt.Sprintf("exporter: %s set as type %v", f.name, t))
	}
	k := s.key[:0]
	for _, v := range values {
		k = append(k, v...)
		k = append(k, keySep)
	}
	s.key = k
	fs := &s.byFamily[f.index]
	sr := fs.byKey[string(k)]
	switch {
	case sr == nil:
		var err error
		if sr, err = newSeries(f, string(k)); err != nil {
			s.errs = append(s.errs, seriesError{f, err})
			return
		}
		fs.byKey[sr.key] = sr
		fs.list = append(fs.list, sr)
		fs.grown = true
	case sr.gen == s.gen:
		s.errs = append(s.errs, seriesError{f, fmt.Errorf("%s%q set twice in one scrape; the first value is kept", f.name, sr.values)})
		return
	}
	sr.value, sr.gen = v, s.gen
}

// newSeries validates a series as a const metric does and renders it.
func newSeries(f *family, key string) (*series, error) {
	if strings.Count(key, string([]byte{keySep})) != len(f.labels) {
		// A value held the separator, so it is not UTF-8.
		return nil, fmt.Errorf("%s: label values %q: not %d valid UTF-8 values", f.name, key, len(f.labels))
	}
	values := make([]string, 0, len(f.labels))
	for rest := key; rest != ""; {
		i := strings.IndexByte(rest, keySep)
		values = append(values, rest[:i])
		rest = rest[i+1:]
	}
	if _, err := prometheus.NewConstMetric(f.desc, f.typ, 0, values...); err != nil {
		return nil, err
	}
	sr := &series{fam: f, key: key, values: values}
	sr.prefix = samplePrefix(sr)
	return sr, nil
}

// finish ends a scrape: it drops the series the scrape did not set
// (deleted pods, vanished GPUs), so the set is as large as one scrape, and
// sorts the families that gained series.
func (s *seriesSet) finish() {
	for i := range s.byFamily {
		fs := &s.byFamily[i]
		live := fs.list[:0]
		for _, sr := range fs.list {
			if sr.gen == s.gen {
				live = append(live, sr)
			} else {
				delete(fs.byKey, sr.key)
			}
		}
		clear(fs.list[len(live):])
		fs.list = live
		if fs.grown {
			slices.SortFunc(live, compareSeries)
			fs.grown = false
		}
	}
}

// compareSeries orders the series of a family as the registry does: by
// their label values, taken in the order of the label names.
func compareSeries(a, b *series) int {
	for _, i := range a.fam.byName {
		if c := strings.Compare(a.values[i], b.values[i]); c != 0 {
			return c
		}
	}
	return 0
}

// labelPairs builds the series' label pairs, sorted by name as a const
// metric has them.
func (sr *series) labelPairs() []*dto.LabelPair {
	f := sr.fam
	pairs := make([]dto.LabelPair, len(f.byName))
	out := make([]*dto.LabelPair, len(f.byName))
	for j, i := range f.byName {
		pairs[j] = dto.LabelPair{Name: &f.labels[i], Value: &sr.values[i]}
		out[j] = &pairs[j]
	}
	return out
}

// send sends the scrape's series as metrics, family by family, and each
// error as an invalid metric, which fails the registry's Gather as a
// duplicate or invalid const metric did.
func (s *seriesSet) send(ch chan<- prometheus.Metric) {
	for _, f := range families {
		for _, sr := range s.byFamily[f.index].list {
			ch <- &cachedMetric{desc: f.desc, labels: sr.labelPairs(), typ: f.typ, value: sr.value}
		}
	}
	for _, e := range s.errs {
		ch <- prometheus.NewInvalidMetric(e.fam.desc, e.err)
	}
}

// metricFamilies returns the scrape's series as the registry would gather
// them: for the encodings the exporter does not write itself.
func (s *seriesSet) metricFamilies() []*dto.MetricFamily {
	var out []*dto.MetricFamily
	for _, f := range families {
		list := s.byFamily[f.index].list
		if len(list) == 0 {
			continue
		}
		typ := dto.MetricType_GAUGE
		if f.typ == prometheus.CounterValue {
			typ = dto.MetricType_COUNTER
		}
		mf := &dto.MetricFamily{Name: proto.String(f.name), Help: proto.String(f.help), Type: &typ, Metric: make([]*dto.Metric, len(list))}
		values := make([]float64, len(list))
		for i, sr := range list {
			values[i] = sr.value
			m := &dto.Metric{Label: sr.labelPairs()}
			if f.typ == prometheus.CounterValue {
				m.Counter = &dto.Counter{Value: &values[i]}
			} else {
				m.Gauge = &dto.Gauge{Value: &values[i]}
			}
			mf.Metric[i] = m
		}
		out = append(out, mf)
	}
	return out
}

// cachedMetric is a const metric whose label pairs were validated when
// its series was first set.
type cachedMetric struct {
	desc    *prometheus.Desc
	labels  []*dto.LabelPair
	typ     prometheus.ValueType
	value   float64
	gauge   dto.Gauge
	counter dto.Counter
}

func (m *cachedMetric) Desc() *prometheus.Desc { return m.desc }

func (m *cachedMetric) Write(out *dto.Metric) error {
	out.Label = m.labels
	switch m.typ {
	case prometheus.CounterValue:
		m.counter.Value = &m.value
		out.Counter = &m.counter
	case prometheus.GaugeValue:
		m.gauge.Value = &m.value
		out.Gauge = &m.gauge
	default: // not sent by the exporter
		out.Untyped = &dto.Untyped{Value: &m.value}
	}
	return nil
}

package exporter

import (
	"bytes"
	"math"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// The exporter writes its own series in the two text formats Prometheus
// scrapes, the text format 0.0.4 and OpenMetrics 1.0.0, as the formats'
// specifications define them and as prometheus/common's expfmt writes
// them, byte for byte (tests compare the two): the same HELP and TYPE
// lines, label values escaped the same way, numbers in the same shortest
// form. Writing them from series rendered once is what makes a scrape
// cheap; the other encodings go through expfmt (handler.go).

var (
	// Text format: HELP escapes backslash and newline; label values also
	// the double quote. OpenMetrics escapes all three in both.
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	valueEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

// familyHeaders renders the HELP and TYPE lines of f in the text format
// and in OpenMetrics. OpenMetrics names a counter family without its
// _total suffix, which only its samples carry.
func familyHeaders(f *family) (text, om []byte) {
	typ := "gauge"
	if f.typ == prometheus.CounterValue {
		typ = "counter"
	}
	text = []byte("# HELP " + f.name + " " + helpEscaper.Replace(f.help) + "\n# TYPE " + f.name + " " + typ + "\n")
	name := f.name
	if f.typ == prometheus.CounterValue {
		name = strings.TrimSuffix(name, "_total")
	}
	om = []byte("# HELP " + name + " " + valueEscaper.Replace(f.help) + "\n# TYPE " + name + " " + typ + "\n")
	return text, om
}

// samplePrefix renders a series' sample line up to its value, its labels
// sorted by name.
func samplePrefix(sr *series) []byte {
	f := sr.fam
	var b strings.Builder
	b.WriteString(f.name)
	for j, i := range f.byName {
		if j == 0 {
			b.WriteByte('{')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(f.labels[i])
		b.WriteString(`="`)
		_, _ = valueEscaper.WriteString(&b, sr.values[i]) // a strings.Builder takes every write
		b.WriteByte('"')
	}
	if len(f.byName) > 0 {
		b.WriteByte('}')
	}
	b.WriteByte(' ')
	return []byte(b.String())
}

// appendFamily appends the scrape's series of f, in OpenMetrics when om,
// else in the text format; nothing for a family without series.
func (s *seriesSet) appendFamily(b []byte, f *family, om bool) []byte {
	list := s.byFamily[f.index].list
	if len(list) == 0 {
		return b
	}
	if om {
		b = append(b, f.omHeader...)
	} else {
		b = append(b, f.header...)
	}
	for _, sr := range list {
		b = append(b, sr.prefix...)
		b = appendValue(b, sr.value, om)
		b = append(b, '\n')
	}
	return b
}

// appendValue appends a sample value: the shortest decimal that reads back
// as v, with Prometheus's spellings of infinities and NaN. OpenMetrics
// marks an integral value as a float with ".0".
func appendValue(b []byte, v float64, om bool) []byte {
	switch {
	case math.IsNaN(v):
		return append(b, "NaN"...)
	case math.IsInf(v, 1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	case v == 0:
		v = 0 // -0 is written as 0
	}
	start := len(b)
	b = strconv.AppendFloat(b, v, 'g', -1, 64)
	if om && !bytes.ContainsAny(b[start:], "e.") {
		b = append(b, '.', '0')
	}
	return b
}

package exporter

import (
	"compress/gzip"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Handler serves the exporter's metrics together with those others
// gathers (the Go runtime's and the process's), as promhttp.HandlerFor
// serves a registry holding all of them, with OpenMetrics offered and
// errors logged and passed over (promhttp.ContinueOnError).
//
// For the text format and OpenMetrics, uncompressed or gzipped, which is
// what Prometheus asks for, it writes the exporter's series itself from
// the series set (exposition.go) and only the others' through expfmt: on
// a node of 8 GPUs and 512 GPU processes, gathering and encoding the
// exporter's 2,900 series through the registry cost more than reading
// the node. Every other request (protobuf, a name[] filter, an
// Accept-Encoding it does not read the way promhttp does) goes to
// promhttp itself, with the same series.
func (e *Exporter) Handler(others prometheus.Gatherer, log *slog.Logger) http.Handler {
	if log == nil {
		log = e.log
	}
	return &handler{
		e:      e,
		others: others,
		log:    log,
		generic: promhttp.HandlerFor(prometheus.Gatherers{others, prometheus.GathererFunc(e.gather)}, promhttp.HandlerOpts{
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelError),
			ErrorHandling:     promhttp.ContinueOnError,
			EnableOpenMetrics: true,
		}),
		bodies: make(chan *body, 1),
	}
}

// gather is the exporter as a prometheus.Gatherer.
func (e *Exporter) gather() ([]*dto.MetricFamily, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.collect()
	return e.series.metricFamilies(), e.series.err()
}

// err joins the errors of the scrape's series.
func (s *seriesSet) err() error {
	var errs prometheus.MultiError
	for _, e := range s.errs {
		errs = append(errs, e.err)
	}
	return errs.MaybeUnwrap()
}

type handler struct {
	e       *Exporter
	others  prometheus.Gatherer
	log     *slog.Logger
	generic http.Handler
	// bodies keeps one response buffer, and gzip writer, between scrapes:
	// a scrape of the big node is 430 KiB, which would otherwise be grown
	// anew each time, and a gzip writer holds 900 KiB whatever its level,
	// which a sync.Pool (promhttp's) lets go at every garbage collection,
	// to be allocated again at the next scrape.
	bodies chan *body
}

// newGzip returns a writer at gzip's best speed, where promhttp takes the
// default level: on the big node's 430 KiB exposition the default level
// took 2.4 times the CPU (1.3 ms against 0.55 ms, one core, same run) for
// 18 KiB instead of 22.
func newGzip() *gzip.Writer {
	zw, err := gzip.NewWriterLevel(nil, gzip.BestSpeed)
	if err != nil {
		panic(err) // a valid level
	}
	return zw
}

// plan is how a request is answered.
type plan struct {
	fast   bool // written here; else by promhttp
	format expfmt.Format
	om     bool // OpenMetrics, else the text format
	gzip   bool
}

// negotiate chooses the format and encoding as promhttp does, and whether
// this handler writes the response itself.
func negotiate(r *http.Request) plan {
	p := plan{format: expfmt.NegotiateIncludingOpenMetrics(r.Header)}
	switch p.format.FormatType() {
	case expfmt.TypeTextPlain:
	case expfmt.TypeOpenMetrics:
		p.om = true
	default:
		return p
	}
	gz, ok := negotiateGzip(r.Header.Values("Accept-Encoding"))
	p.gzip = gz
	p.fast = ok && (r.URL.RawQuery == "" || !r.URL.Query().Has("name[]"))
	return p
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := negotiate(r)
	if !p.fast {
		h.generic.ServeHTTP(w, r)
		return
	}
	var b *body
	select {
	case b = <-h.bodies:
		b.b = b.b[:0]
	default:
		b = &body{}
	}
	h.render(b, p.format, p.om)
	w.Header().Set("Content-Type", string(p.format))
	if p.gzip {
		w.Header().Set("Content-Encoding", "gzip")
		if b.zw == nil {
			b.zw = newGzip()
		}
		b.zw.Reset(w)
		_, err := b.zw.Write(b.b)
		if cerr := b.zw.Close(); err == nil {
			err = cerr
		}
		b.zw.Reset(nil) // let go of the response
		h.writeFailed(err)
	} else {
		w.Header().Set("Content-Length", strconv.Itoa(len(b.b)))
		_, err := w.Write(b.b)
		h.writeFailed(err)
	}
	select {
	case h.bodies <- b:
	default:
	}
}

// writeFailed logs a failed write of a response, as promhttp does.
func (h *handler) writeFailed(err error) {
	if err != nil {
		h.log.Error("error encoding and sending metric family", "err", err)
	}
}

// render writes the exposition: every family in name order, as the
// registry sorts them, the exporter's from its series and the others'
// through expfmt.
func (h *handler) render(b *body, format expfmt.Format, om bool) {
	mfs, err := h.others.Gather()
	if err != nil {
		h.log.Error("error gathering metrics", "err", err)
	}
	enc := expfmt.NewEncoder(b, format)
	i := 0
	encodeUpTo := func(name string) {
		for ; i < len(mfs) && (name == "" || mfs[i].GetName() < name); i++ {
			if err := enc.Encode(mfs[i]); err != nil {
				h.log.Error("error encoding and sending metric family", "err", err)
			}
		}
	}
	e := h.e
	e.mu.Lock()
	e.collect()
	for _, f := range families {
		if len(e.series.byFamily[f.index].list) > 0 {
			encodeUpTo(f.name)
			b.b = e.series.appendFamily(b.b, f, om)
		}
	}
	if err := e.series.err(); err != nil {
		h.log.Error("error gathering metrics", "err", err)
	}
	e.mu.Unlock()
	encodeUpTo("")
	if om {
		b.b = append(b.b, "# EOF\n"...)
	}
}

// body is a response being rendered, written to by appends and by
// expfmt's encoders, for which it has the methods of a bufio.Writer that
// they use directly; and the gzip writer that compresses it, if one was
// needed.
type body struct {
	b  []byte
	zw *gzip.Writer
}

func (b *body) Write(p []byte) (int, error) {
	b.b = append(b.b, p...)
	return len(p), nil
}

func (b *body) WriteString(s string) (int, error) {
	b.b = append(b.b, s...)
	return len(s), nil
}

func (b *body) WriteByte(c byte) error {
	b.b = append(b.b, c)
	return nil
}

func (b *body) WriteRune(r rune) (int, error) {
	n := len(b.b)
	b.b = utf8.AppendRune(b.b, r)
	return len(b.b) - n, nil
}

// negotiateGzip chooses between identity and gzip, the encodings promhttp
// offers (in that order), as promhttp does: the offer with the highest
// quality value in Accept-Encoding, the first on a tie, "*" standing for
// either, identity when the header is absent. ok is false for a header
// this does not read the way promhttp does (parameters other than q, a
// malformed quality) and when promhttp would find nothing acceptable; the
// caller leaves those to promhttp.
func negotiateGzip(headers []string) (gz, ok bool) {
	bestQ := -1.0
	for _, offer := range []string{"identity", "gzip"} {
		for _, h := range headers {
			if h == "" {
				continue
			}
			if strings.TrimLeft(h, " \t") != h {
				return false, false // promhttp reads nothing of it
			}
			for spec := range strings.SplitSeq(h, ",") {
				value, q, ok := parseEncoding(spec)
				if !ok {
					return false, false
				}
				if q > bestQ && (value == "*" || value == offer) {
					bestQ = q
					gz = offer == "gzip"
				}
			}
		}
	}
	return gz, bestQ != 0
}

// parseEncoding parses one element of Accept-Encoding: a coding and an
// optional ";q=" weight of at most three decimals.
func parseEncoding(spec string) (value string, q float64, ok bool) {
	value, param, hasParam := strings.Cut(spec, ";")
	value = strings.TrimSpace(value)
	if value == "" || strings.IndexFunc(value, notTokenChar) >= 0 {
		return "", 0, false
	}
	if !hasParam {
		return value, 1, true
	}
	w, found := strings.CutPrefix(strings.TrimSpace(param), "q=")
	if !found || !validQuality(w) {
		return "", 0, false
	}
	q, err := strconv.ParseFloat(w, 64)
	return value, q, err == nil
}

// validQuality: "0", "1", "0." or "1." and up to three digits (RFC 9110's
// qvalue), 1 followed only by zeros.
func validQuality(s string) bool {
	if s == "" || s[0] != '0' && s[0] != '1' {
		return false
	}
	if len(s) == 1 {
		return true
	}
	if s[1] != '.' || len(s) > 5 {
		return false
	}
	for _, c := range s[2:] {
		if c < '0' || c > '9' || s[0] == '1' && c != '0' {
			return false
		}
	}
	return true
}

// notTokenChar: c may not be in an HTTP token (RFC 9110's tchar).
func notTokenChar(c rune) bool {
	return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", c))
}

package exporter

import (
	"bytes"
	"compress/gzip"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Accept headers of real scrapers.
const (
	acceptPrometheus2 = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
	acceptPrometheus3 = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
	acceptProtobuf    = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3"
)

var durationValue = regexp.MustCompile(`(?m)^(gpuslice_exporter_collect_duration_seconds\{[^}]*\}) \S+$`)

type response struct {
	status                int
	contentType, encoding string
	body                  string
}

func serve(t *testing.T, h http.Handler, accept, encoding, query string) response {
	t.Helper()
	r := httptest.NewRequest("GET", "/metrics"+query, nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	if encoding != "" {
		r.Header.Set("Accept-Encoding", encoding)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	res := response{status: w.Code, contentType: w.Header().Get("Content-Type"), encoding: w.Header().Get("Content-Encoding")}
	body := w.Body.Bytes()
	if res.encoding == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body, err = io.ReadAll(zr); err != nil {
			t.Fatal(err)
		}
	}
	if expfmt.Format(res.contentType).FormatType() == expfmt.TypeProtoDelim {
		// Compared as text: the durations are masked there.
		var text bytes.Buffer
		dec := expfmt.NewDecoder(bytes.NewReader(body), expfmt.Format(res.contentType))
		for {
			var mf dto.MetricFamily
			if err := dec.Decode(&mf); err == io.EOF {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			if _, err := expfmt.MetricFamilyToText(&text, &mf); err != nil {
				t.Fatal(err)
			}
		}
		body = text.Bytes()
	}
	res.body = durationValue.ReplaceAllString(string(body), "$1 X")
	return res
}

// TestHandlerMatchesPromhttp: for what real scrapers ask, the handler
// answers with the format, encoding and content that promhttp gives for a
// registry holding the exporter and the other collectors, family order
// included; and it writes the text formats itself.
func TestHandlerMatchesPromhttp(t *testing.T) {
	d := newDemo(t)
	d.exp.cfg.Now = func() time.Time { return time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC) }
	others := prometheus.NewPedanticRegistry()
	for _, name := range []string{"aaa_first", "gpuslice_gpu_aaa_between", "zzz_last"} {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: "A family of another collector."}, []string{"l"})
		g.WithLabelValues("v").Set(3)
		others.MustRegister(g)
	}
	h := d.exp.Handler(others, slog.New(slog.DiscardHandler))
	promhttpHandler := promhttp.HandlerFor(prometheus.Gatherers{others, prometheus.GathererFunc(d.exp.gather)}, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError, EnableOpenMetrics: true,
	})
	serve(t, h, "", "", "") // the OOM detector's baseline
	for _, accept := range []string{"", "text/plain;version=0.0.4", "text/plain", acceptPrometheus2, acceptPrometheus3,
		"application/openmetrics-text;version=0.0.1", "text/plain;version=0.0.4;escaping=underscores", acceptProtobuf} {
		for _, encoding := range []string{"", "gzip", "identity", "gzip, identity", "identity;q=0, gzip", "gzip;q=0.5, identity;q=0.2",
			"*", "br", "deflate, gzip;q=1.0, *;q=0.5", "gzip;level=9", "identity;q=0"} {
			for _, query := range []string{"", "?name[]=gpuslice_gpu_info&name[]=zzz_last"} {
				r := httptest.NewRequest("GET", "/metrics"+query, nil)
				r.Header.Set("Accept", accept)
				r.Header.Set("Accept-Encoding", encoding)
				p := negotiate(r)
				wantFast := accept != acceptProtobuf && query == "" && encoding != "gzip;level=9" && encoding != "identity;q=0"
				if p.fast != wantFast {
					t.Errorf("Accept %q, Accept-Encoding %q, query %q: written here %v, want %v", accept, encoding, query, p.fast, wantFast)
				}
				got := serve(t, h, accept, encoding, query)
				want := serve(t, promhttpHandler, accept, encoding, query)
				if got.status != want.status || got.contentType != want.contentType || got.encoding != want.encoding {
					t.Errorf("Accept %q, Accept-Encoding %q, query %q: %d %q %q, promhttp answers %d %q %q", accept, encoding, query,
						got.status, got.contentType, got.encoding, want.status, want.contentType, want.encoding)
				}
				if got.body != want.body {
					t.Errorf("Accept %q, Accept-Encoding %q, query %q: body differs from promhttp's:\n%s", accept, encoding, query, diffLines(want.body, got.body))
				}
				if p.fast && !strings.Contains(got.body, "gpuslice_container_gpu_memory_used_bytes{") {
					t.Errorf("Accept %q, Accept-Encoding %q: no container series", accept, encoding)
				}
			}
		}
	}
	if body := serve(t, h, acceptPrometheus2, "gzip", "").body; !strings.Contains(body, "# EOF\n") ||
		strings.Index(body, "aaa_first") > strings.Index(body, "gpuslice_gpu_aaa_between") ||
		strings.Index(body, "gpuslice_gpu_aaa_between") > strings.Index(body, "gpuslice_gpu_info") ||
		strings.Index(body, "gpuslice_unattributed") > strings.Index(body, "zzz_last") {
		t.Errorf("families out of order:\n%s", body)
	}
}

// TestNegotiateGzip: where the handler reads Accept-Encoding itself, it
// picks what promhttp picks.
func TestNegotiateGzip(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "x", Help: "x"}))
	ph := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	for _, h := range []string{"", "gzip", "GZIP", "identity", "gzip, identity", "identity, gzip", "gzip;q=0.999, identity;q=1",
		"*", "*;q=0.5, gzip;q=0.4", "identity;q=0.5, *", "x-gzip", "br, zstd", "gzip ; q=0.1", " gzip , identity;q=0.01",
		"gzip;q=1.000", "gzip;q=0., identity;q=0.001", "identity;q=0, gzip;q=0", "gzip;q=1.5", "gzip;q=2", "gzip;q=.5",
		"gzip;foo=1", "gzip,,identity", "gz(ip)", "gzip, deflate, br", "identity;q=0, *;q=0"} {
		gz, ok := negotiateGzip(strings.Split(h, "\n"))
		if h == "" {
			gz, ok = negotiateGzip(nil)
		}
		if !ok {
			continue
		}
		r := httptest.NewRequest("GET", "/metrics", nil)
		if h != "" {
			r.Header.Set("Accept-Encoding", h)
		}
		w := httptest.NewRecorder()
		ph.ServeHTTP(w, r)
		if want := w.Header().Get("Content-Encoding") == "gzip"; gz != want {
			t.Errorf("Accept-Encoding %q: gzip %v, promhttp %v", h, gz, want)
		}
	}
	for _, h := range []string{"", "gzip", "gzip, identity", "*", "identity;q=0, gzip"} {
		var headers []string
		if h != "" {
			headers = []string{h}
		}
		if _, ok := negotiateGzip(headers); !ok {
			t.Errorf("Accept-Encoding %q is left to promhttp", h)
		}
	}
}

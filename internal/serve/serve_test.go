package serve

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/internal/testproc"
)

// TestListenAddressRepeated: --web.listen-address given twice serves on
// both (node_exporter's way); given once it replaces the default.
func TestListenAddressRepeated(t *testing.T) {
	var f Flags
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	f.Register(fs, ":9846")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.ListenAddresses, []string{":9846"}) {
		t.Errorf("default: %v", f.ListenAddresses)
	}
	a, b := testproc.FreeAddr(t), testproc.FreeAddr(t)
	f = Flags{}
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	f.Register(fs, ":9846")
	if err := fs.Parse([]string{"--web.listen-address=" + a, "--web.listen-address=" + b}); err != nil {
		t.Fatal(err)
	}
	var g Flags
	gs := flag.NewFlagSet("t", flag.ContinueOnError)
	g.Register(gs, ":9846")
	// One value with commas, as the environment variable carries it.
	if err := gs.Set("web.listen-address", a+","+b); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(g.ListenAddresses, []string{a, b}) {
		t.Errorf("%s,%s: %v", a, b, g.ListenAddresses)
	}
	if err := f.Validate("/healthz"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, f.Options(Options{Name: "t", Registry: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)}))
	}()
	for _, addr := range []string{a, b} {
		testproc.Eventually(t, 10*time.Second, 20*time.Millisecond, func() string {
			resp, err := http.Get("http://" + addr + "/metrics")
			if err != nil {
				return err.Error()
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return ""
		})
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestMetricsPathRefused: a path ServeMux would panic on, or one another
// handler takes, is an error naming the flag, from Validate and Handler.
func TestMetricsPathRefused(t *testing.T) {
	for _, p := range []string{"metrics", "", "/a b", "/healthz", "GET /metrics"} {
		f := Flags{ListenAddresses: []string{":1"}, MetricsPath: p}
		if err := f.Validate("/healthz"); err == nil {
			t.Errorf("Validate(%q): no error", p)
		}
		_, err := Handler(Options{Name: "t", MetricsPath: p, Registry: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler),
			Extra: map[string]http.Handler{"/healthz": http.NotFoundHandler()}})
		if err == nil {
			t.Errorf("Handler(%q): no error", p)
		}
	}
	if err := (&Flags{ListenAddresses: []string{":1"}, MetricsPath: "/"}).Validate("/healthz"); err != nil {
		t.Errorf("metrics at /: %v", err)
	}
}

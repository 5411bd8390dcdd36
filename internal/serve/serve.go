// Package serve runs the HTTP endpoint every gpuslice program has: metrics at
// a telemetry path, a landing page at /, and TLS / basic auth from a
// Prometheus exporter-toolkit web config file, so all three programs are
// secured the same way as any Prometheus exporter.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/exporter-toolkit/web"
)

// Options for Run.
type Options struct {
	Name          string // e.g. "gpuslice-exporter"
	Description   string
	ListenAddress string
	// ListenAddresses, when set, replace ListenAddress: several addresses.
	ListenAddresses []string
	// SystemdSocket serves on the sockets systemd passes instead.
	SystemdSocket bool
	MetricsPath   string
	WebConfigFile string // empty: plain HTTP without auth
	Registry      *prometheus.Registry
	// Metrics, when set, serves MetricsPath instead of promhttp over
	// Registry (the exporter writes its own exposition).
	Metrics http.Handler
	Logger  *slog.Logger
	// Extra handlers (path → handler), e.g. /healthz.
	Extra map[string]http.Handler
}

// Handler builds the mux: metrics, landing page, extras.
func Handler(o Options) (http.Handler, error) {
	reserved := make([]string, 0, len(o.Extra))
	for p := range o.Extra {
		reserved = append(reserved, p)
	}
	if err := checkMetricsPath(o.MetricsPath, reserved); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	metrics := o.Metrics
	if metrics == nil {
		metrics = promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{
			ErrorLog:          slog.NewLogLogger(o.Logger.Handler(), slog.LevelError),
			ErrorHandling:     promhttp.ContinueOnError,
			EnableOpenMetrics: true,
		})
	}
	mux.Handle(o.MetricsPath, metrics)
	for p, h := range o.Extra {
		mux.Handle(p, h)
	}
	if o.MetricsPath != "/" {
		landing, err := web.NewLandingPage(web.LandingConfig{
			Name:        o.Name,
			Description: o.Description,
			Links:       []web.LandingLinks{{Address: o.MetricsPath, Text: "Metrics"}},
		})
		if err != nil {
			return nil, fmt.Errorf("landing page: %w", err)
		}
		mux.Handle("/", landing)
	}
	return mux, nil
}

// Run serves until ctx ends, then shuts down gracefully.
func Run(ctx context.Context, o Options) error {
	h, err := Handler(o)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	addrs := o.ListenAddresses
	if len(addrs) == 0 {
		addrs = []string{o.ListenAddress}
	}
	systemd := o.SystemdSocket
	flags := &web.FlagConfig{WebListenAddresses: &addrs, WebSystemdSocket: &systemd, WebConfigFile: &o.WebConfigFile}
	errc := make(chan error, 1)
	go func() { errc <- web.ListenAndServe(srv, flags, o.Logger) }()
	select {
	case err := <-errc:
		if systemd {
			return fmt.Errorf("serving on systemd's sockets: %w", err)
		}
		return fmt.Errorf("serving on %s: %w", strings.Join(addrs, ", "), err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	oteltrace "go.opentelemetry.io/otel/trace"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpuslice/gpuslice/internal/flagenv"
	"github.com/gpuslice/gpuslice/internal/logging"
	"github.com/gpuslice/gpuslice/internal/procmetrics"
	"github.com/gpuslice/gpuslice/internal/serve"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/controller"
	"github.com/gpuslice/gpuslice/internal/tuner/signals"
)

type runOptions struct {
	config, kubeconfig, identity string
	web                          serve.Flags
	log                          logging.Flags
}

func parseRunFlags(args []string) (*runOptions, error) {
	o := &runOptions{}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.StringVar(&o.config, "config", "", "tuner.yaml (required; see deploy/examples/tuner.yaml).")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubeconfig; empty means in-cluster.")
	fs.StringVar(&o.identity, "leader-election.identity", defaultIdentity(), "This replica's name in the leader Lease (default: $POD_NAME, else the hostname).")
	o.web.Register(fs, ":9847")
	o.log.Register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: run: %w", errUsage, err)
	}
	if err := flagenv.Apply(fs, "GPUSLICE_", nil); err != nil {
		return nil, fmt.Errorf("%w: run: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: run: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if err := o.web.Validate("/healthz"); err != nil {
		return nil, fmt.Errorf("%w: run: %w", errUsage, err)
	}
	if o.config == "" {
		return nil, fmt.Errorf("%w: run: --config is required", errUsage)
	}
	if o.identity == "" {
		return nil, fmt.Errorf("%w: run: --leader-election.identity is empty and neither $POD_NAME nor the hostname is known", errUsage)
	}
	return o, nil
}

func defaultIdentity() string {
	if p := os.Getenv("POD_NAME"); p != "" {
		return p
	}
	h, _ := os.Hostname()
	return h
}

// runCommand is `gpuslice-tuner run`: the controller, its signal source and
// its metrics endpoint, until ctx ends.
func runCommand(ctx context.Context, args []string) error {
	o, err := parseRunFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log, err := o.log.Logger(os.Stderr)
	if err != nil {
		return err
	}
	cfg, err := config.Load(o.config)
	if err != nil {
		return err
	}
	client, err := kubeClient(o.kubeconfig)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	running := 0
	goRun := func(name string, f func(context.Context) error) {
		running++
		go func() {
			err := f(ctx)
			if err != nil {
				err = fmt.Errorf("%s: %w", name, err)
			}
			errc <- err
		}()
	}

	var source signals.Source
	switch cfg.Signals.Source {
	case config.SourceExporters:
		exp, err := signals.NewExporters(signals.ExportersOptions{
			Config: cfg.Signals.Exporters, Client: client, Interval: cfg.Policy.SampleInterval,
			Keep: cfg.Policy.Window + 2*cfg.Policy.SampleInterval, Logger: log,
		})
		if err != nil {
			return err
		}
		source = exp
		goRun("signals", exp.Run)
	case config.SourcePrometheus:
		p, err := signals.NewPrometheus(signals.PrometheusOptions{Config: cfg.Signals.Prometheus, Step: cfg.Policy.SampleInterval, Logger: log})
		if err != nil {
			return err
		}
		source = p
	}

	tracer, shutdownTracing, err := tracing(ctx)
	if err != nil {
		return err
	}
	defer shutdownTracing()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), procmetrics.New())
	ctl, err := controller.New(controller.Options{
		Config: cfg, Client: client, Source: source, Logger: log, Registerer: reg, Tracer: tracer, Identity: o.identity,
	})
	if err != nil {
		return err
	}
	log.Info("gpuslice-tuner starting", "config", o.config, "mode", cfg.Apply.Mode, "signals", cfg.Signals.Source,
		"dryRun", cfg.DryRun, "leaderElection", cfg.LeaderElection.Enabled, "identity", o.identity, "address", o.web.ListenAddresses)
	goRun("controller", ctl.Run)
	goRun("web", func(ctx context.Context) error {
		return serve.Run(ctx, o.web.Options(serve.Options{
			Name:        "gpuslice-tuner",
			Description: "Tunes time-slicing replicas per node from measured GPU memory headroom and OOM events",
			Registry:    reg,
			Logger:      log,
			Extra: map[string]http.Handler{"/healthz": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte("ok\n"))
			})},
		}))
	})

	// The first part to stop (an error, or ctx) stops the others.
	var first error
	for range running {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
		cancel()
	}
	return first
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client (--kubeconfig %q): %w", kubeconfig, err)
	}
	cfg.UserAgent = "gpuslice-tuner"
	return kubernetes.NewForConfig(cfg)
}

// tracing exports a span per decision over OTLP/gRPC when
// OTEL_EXPORTER_OTLP_ENDPOINT (or the traces-only variable) is set; the
// exporter reads the rest of the standard OTEL_* variables itself.
// Otherwise it returns nil: the controller then records nothing.
func tracing(ctx context.Context) (oteltrace.Tracer, func(), error) {
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, func() {}, nil
	}
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", "gpuslice-tuner")))
	if err != nil {
		res = resource.Default()
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	shutdown := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			slog.Warn("flushing traces", "err", err)
		}
	}
	return tp.Tracer("github.com/gpuslice/gpuslice/internal/tuner/controller"), shutdown, nil
}

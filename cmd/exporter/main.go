// Command gpuslice-exporter exports per-GPU and per-container metrics of a
// node whose GPUs are shared by time-slicing: NVML (or the simulated node)
// for devices and processes, the kubelet's PodResources API for replica
// allocations, /proc for the pod of each process, and pod logs and statuses
// for GPU out-of-memory events.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gpuslice/gpuslice/internal/dra"
	"github.com/gpuslice/gpuslice/internal/exporter"
	"github.com/gpuslice/gpuslice/internal/flagenv"
	"github.com/gpuslice/gpuslice/internal/gpu/backend"
	"github.com/gpuslice/gpuslice/internal/kube"
	"github.com/gpuslice/gpuslice/internal/logging"
	"github.com/gpuslice/gpuslice/internal/oom"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/pods"
	"github.com/gpuslice/gpuslice/internal/procmetrics"
	"github.com/gpuslice/gpuslice/internal/serve"
)

type options struct {
	web                        serve.Flags
	backend, simFile           string
	procfs, podResourcesSocket string
	podsSource, kubeconfig     string
	nodeName, kubeletURL       string
	kubeletToken, kubeletCA    string
	kubeletInsecure            bool
	kubeletInterval            time.Duration
	podLogs                    string
	oomPatterns                stringList
	oomOff                     bool
	oomMaxRead                 int64
	oomInterval                time.Duration
	gpuFailureThreshold        int
	pprof                      bool
	draSlices                  bool
	log                        logging.Flags
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("gpuslice-exporter", flag.ContinueOnError)
	o.web.Register(fs, ":9846")
	fs.StringVar(&o.backend, "gpu.backend", backend.NVML, "GPU backend: nvml or sim.")
	fs.StringVar(&o.simFile, "sim.file", "", "Simulated node file, for --gpu.backend=sim (re-read at every scrape).")
	fs.StringVar(&o.procfs, "path.procfs", "/proc", "The host's /proc (the exporter runs with hostPID).")
	fs.StringVar(&o.podResourcesSocket, "kubelet.pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "Kubelet PodResources API socket; empty turns allocation metrics off.")
	fs.StringVar(&o.podsSource, "pods.source", "apiserver", "Where pod names come from: apiserver (a pod informer for this node), kubelet (its /pods endpoint) or none (no pod names: every GPU process counts as unattributed; the allocation series still come from the kubelet).")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubeconfig for --pods.source=apiserver; empty means in-cluster.")
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "This node's name (env NODE_NAME).")
	fs.StringVar(&o.kubeletURL, "kubelet.url", "", "Kubelet base URL for --pods.source=kubelet (default https://$NODE_IP:10250).")
	fs.StringVar(&o.kubeletToken, "kubelet.token-file", "/var/run/secrets/kubernetes.io/serviceaccount/token", "Bearer token for the kubelet.")
	fs.StringVar(&o.kubeletCA, "kubelet.ca-file", "", "CA bundle verifying the kubelet's certificate.")
	fs.BoolVar(&o.kubeletInsecure, "kubelet.insecure-skip-tls-verify", false, "Accept any kubelet certificate (self-signed kubelet certificates).")
	fs.DurationVar(&o.kubeletInterval, "kubelet.pods-interval", 10*time.Second, "How often --pods.source=kubelet reads /pods.")
	fs.BoolVar(&o.draSlices, "dra.resource-slices", true, "Attribute GPUs allocated by DRA ResourceClaims, resolved through this node's ResourceSlices (resource.k8s.io/v1; needs list/watch on resourceslices, --kubeconfig or in-cluster, and --node-name). Off by itself where the API server does not serve them.")
	fs.StringVar(&o.podLogs, "path.pod-logs", "/var/log/pods", "The kubelet's pod log directory, scanned for GPU OOM messages.")
	fs.Var(&o.oomPatterns, "oom.pattern", "Regular expression of a GPU OOM log line; repeat the flag for several. Setting it replaces the built-in catalogue (PyTorch, TensorFlow, JAX, llama.cpp/ollama, vLLM, ONNX Runtime, TensorRT, NVENC, CTranslate2, CuPy, Paddle, darknet, OptiX, CUDA driver, cuBLAS, cuDNN, NCCL messages; internal/oom/catalogue.go). Lines about host (pinned) memory never count.")
	fs.BoolVar(&o.oomOff, "oom.disable", false, "Turn GPU OOM detection off.")
	fs.Int64Var(&o.oomMaxRead, "oom.max-read-bytes", oom.DefaultMaxReadBytes, "Most bytes read from one log file per scan.")
	fs.DurationVar(&o.oomInterval, "oom.scan-interval", exporter.DefaultOOMWatchInterval, "How often GPU containers' logs and terminations are read between scrapes (also at every pod change), so that no run of a crash loop is lost whatever the scrape interval.")
	fs.IntVar(&o.gpuFailureThreshold, "healthz.gpu-failure-threshold", 3, "Collections in a row (scrapes, or /healthz probes when nothing scrapes) that read no GPU before /healthz fails and the kubelet restarts the exporter, which is what brings back NVML broken under a running container; 0 never fails. An exporter that never read a GPU stays healthy and logs what to fix.")
	fs.BoolVar(&o.pprof, "web.enable-pprof", false, "Serve Go's profiles under /debug/pprof/ (CPU, heap), for profiling a scrape on a real node; off by default, as it shows the program's internals to whoever can reach the port.")
	o.log.Register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: gpuslice-exporter takes flags only", fs.Arg(0))
	}
	if err := flagenv.Apply(fs, "GPUSLICE_", nil); err != nil {
		return nil, err
	}
	if err := o.web.Validate("/healthz"); err != nil {
		return nil, err
	}
	if o.gpuFailureThreshold < 0 {
		return nil, fmt.Errorf("--healthz.gpu-failure-threshold=%d: must be 0 (never fail) or more", o.gpuFailureThreshold)
	}
	if err := flagenv.NonNegative(fs, "oom.max-read-bytes", "kubelet.pods-interval", "oom.scan-interval"); err != nil {
		return nil, err
	}
	if o.kubeletURL == "" {
		if ip := os.Getenv("NODE_IP"); ip != "" {
			o.kubeletURL = "https://" + ip + ":10250"
		}
	}
	return o, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal starts a graceful shutdown; a second one, given
	// the default handling back, ends the program at once.
	context.AfterFunc(ctx, stop)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "gpuslice-exporter:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	log, err := o.log.Logger(os.Stderr)
	if err != nil {
		return err
	}

	// Without NVML the exporter keeps running and logs the fix: a crash
	// loop would hide the message behind restarts, and NVML is tried again.
	gpus, err := backend.Open(o.backend, o.simFile, log, true)
	if err != nil {
		return err
	}
	defer gpus.Close()

	cfg := exporter.Config{GPU: gpus, Procfs: o.procfs, Logger: log, MaxGPUFailures: o.gpuFailureThreshold}
	if o.podResourcesSocket != "" {
		c, err := podresources.NewClient(o.podResourcesSocket)
		if err != nil {
			return err
		}
		defer c.Close()
		cfg.Kubelet = c
		if o.draSlices {
			cfg.Kubelet = dra.Kubelet{Lister: c, Slices: draSlices(ctx, o, log), Logger: log}
		}
	}
	src, err := podSource(ctx, o, log)
	if err != nil {
		return err
	}
	cfg.Pods = src
	if !o.oomOff {
		d, err := oom.NewDetector(oom.Config{PodLogsDir: o.podLogs, Patterns: o.oomPatterns, MaxReadBytes: o.oomMaxRead, Logger: log})
		if err != nil {
			return err
		}
		cfg.OOM = d
	}

	exp := exporter.New(cfg)
	go exp.RunOOMWatch(ctx, o.oomInterval)
	// The registry holds the Go runtime's and the process's metrics; the
	// exporter's handler serves them beside its own series.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), procmetrics.New())
	log.Info("gpuslice-exporter listening", "address", o.web.ListenAddresses, "path", o.web.MetricsPath, "backend", o.backend, "pods", o.podsSource)
	return serve.Run(ctx, o.web.Options(serve.Options{
		Name:        "gpuslice-exporter",
		Description: "Per-pod GPU memory, utilization and CUDA OOM events on time-sliced GPUs",
		Registry:    reg,
		Metrics:     exp.Handler(reg, log),
		Logger:      log,
		Extra:       extraHandlers(exp, o.pprof),
	}))
}

// extraHandlers are the paths served beside the metrics: /healthz, and
// Go's profiles when asked for, so that the cost of a scrape on a real GPU
// (libnvidia-ml included) can be profiled where it is paid (make test-gpu).
func extraHandlers(exp *exporter.Exporter, withPprof bool) map[string]http.Handler {
	h := map[string]http.Handler{"/healthz": exp.Healthz()}
	if withPprof {
		h["/debug/pprof/"] = http.HandlerFunc(pprof.Index)
		h["/debug/pprof/profile"] = http.HandlerFunc(pprof.Profile)
	}
	return h
}

// lateSlices is the ResourceSlice informer once discovery has found that
// the API server serves ResourceSlices; until then, and for good where it
// does not, no slices. Discovery runs beside the serving: a slow API
// server must not keep the exporter's port closed.
type lateSlices struct {
	inf atomic.Pointer[dra.Informer]
	// why is the error Err gives while there is no informer.
	why atomic.Pointer[error]
}

func (l *lateSlices) Devices() dra.Devices {
	if i := l.inf.Load(); i != nil {
		return i.Devices()
	}
	return nil
}

func (l *lateSlices) Err() error {
	if i := l.inf.Load(); i != nil {
		return i.Err()
	}
	if w := l.why.Load(); w != nil {
		return *w
	}
	return errors.New("dra: finding out whether the API server serves ResourceSlices")
}

func (l *lateSlices) off(err error) { l.why.Store(&err) }

// draSlices starts finding out whether the API server serves DRA
// ResourceSlices and, if so, their informer; where DRA cannot be read it
// says why and the slices stay empty: DRA is an addition, and a node
// without it must export as before.
func draSlices(ctx context.Context, o *options, log *slog.Logger) *lateSlices {
	l := &lateSlices{}
	cfg, err := kube.Config(o.kubeconfig, "gpuslice-exporter")
	if err != nil {
		log.Info("DRA attribution off: no API server access", "err", err)
		l.off(fmt.Errorf("dra: no API server access: %w", err))
		return l
	}
	inf, err := dra.NewInformer(cfg, o.nodeName)
	if err != nil {
		log.Warn("DRA attribution off", "err", err)
		l.off(err)
		return l
	}
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		served, err := dra.Served(cctx, cfg)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			// Perhaps only a slow start of the API server: the informer
			// retries by itself.
			log.Warn("could not tell whether the API server serves DRA ResourceSlices; watching them anyway", "err", err)
		case !served:
			log.Info("DRA attribution off: the API server serves no resource.k8s.io/v1 ResourceSlices")
			l.off(errors.New("dra: the API server serves no resource.k8s.io/v1 ResourceSlices"))
			return
		}
		l.inf.Store(inf)
		if err := inf.Start(ctx); err != nil && ctx.Err() == nil {
			log.Error("ResourceSlice informer", "err", err)
		}
	}()
	return l
}

func podSource(ctx context.Context, o *options, log *slog.Logger) (pods.Source, error) {
	switch o.podsSource {
	case "apiserver":
		cfg, err := kube.Config(o.kubeconfig, "gpuslice-exporter")
		if err != nil {
			return nil, fmt.Errorf("--pods.source=apiserver: %w", err)
		}
		inf, err := pods.NewInformer(cfg, o.nodeName, 0)
		if err != nil {
			return nil, err
		}
		// Serve metrics while the informer syncs: GPU metrics do not need
		// pod names, and a slow API server must not make the exporter look
		// down. The pods collector reports 0 until it has synced.
		go func() {
			if err := inf.Start(ctx); err != nil && ctx.Err() == nil {
				log.Error("pod informer", "err", err)
			}
		}()
		return inf, nil
	case "kubelet":
		k, err := pods.NewKubelet(pods.KubeletConfig{
			URL: o.kubeletURL, TokenFile: o.kubeletToken, CAFile: o.kubeletCA,
			InsecureSkipVerify: o.kubeletInsecure, Interval: o.kubeletInterval, Logger: log,
		})
		if err != nil {
			return nil, err
		}
		// Serve metrics while the first read runs, as for the informer:
		// a kubelet that does not answer must not keep the port closed.
		go func() {
			if err := k.Start(ctx); err != nil && ctx.Err() == nil {
				log.Warn("first read of the kubelet's pods failed; retrying", "err", err)
			}
		}()
		return k, nil
	case "none":
		return nil, nil
	default:
		return nil, fmt.Errorf("unknown --pods.source %q (want apiserver, kubelet or none)", o.podsSource)
	}
}

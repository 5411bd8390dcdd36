// Command gpuslice-plugin is a kubelet device plugin for time-sliced NVIDIA
// GPUs that reads NVIDIA's device-plugin config and applies a new replica
// count live, on the open ListAndWatch stream, instead of restarting.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/flagenv"
	"github.com/gpuslice/gpuslice/internal/gpu/backend"
	"github.com/gpuslice/gpuslice/internal/kube"
	"github.com/gpuslice/gpuslice/internal/logging"
	"github.com/gpuslice/gpuslice/internal/mps"
	"github.com/gpuslice/gpuslice/internal/plugin"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/procmetrics"
	"github.com/gpuslice/gpuslice/internal/serve"
)

type options struct {
	web                                serve.Flags
	backend, simFile                   string
	pluginDir, kubeletSocket           string
	podResourcesSocket                 string
	source, configFile                 string
	configMap, defaultKey              string
	kubeconfig, nodeName               string
	policy, guardrails, mpsRoot        string
	healthInterval, recovery, heldPoll time.Duration
	log                                logging.Flags
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("gpuslice-plugin", flag.ContinueOnError)
	o.web.Register(fs, ":9848")
	fs.StringVar(&o.backend, "gpu.backend", backend.NVML, "GPU backend: nvml or sim.")
	fs.StringVar(&o.simFile, "sim.file", "", "Simulated node file, for --gpu.backend=sim.")
	fs.StringVar(&o.pluginDir, "device-plugin.path", pluginapi.DevicePluginPath, "The kubelet's device-plugin directory; the plugin's sockets go here.")
	fs.StringVar(&o.kubeletSocket, "kubelet.socket", "", "The kubelet's registration socket (default <device-plugin.path>/kubelet.sock).")
	fs.StringVar(&o.podResourcesSocket, "kubelet.pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock",
		"Kubelet PodResources API socket, to keep replica IDs in use advertised after a shrink; empty leaves that to the kubelet's checkpoint (kubelet_internal_checkpoint beside kubelet.sock), which also lists ended pods until the kubelet's next allocation.")
	fs.StringVar(&o.source, "config.source", "file", "Where the NVIDIA-format config comes from: file (--config-file) or kubernetes (--config.configmap).")
	fs.StringVar(&o.configFile, "config-file", "", "NVIDIA device-plugin config file, watched for changes; empty: every GPU exclusive.")
	fs.StringVar(&o.configMap, "config.configmap", "", "<namespace>/<name> of the ConfigMap holding configs, for --config.source=kubernetes.")
	fs.StringVar(&o.defaultKey, "config.default", "", "ConfigMap key used when the node has no "+plugin.ConfigLabel+" label.")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubeconfig for --config.source=kubernetes; empty means in-cluster.")
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "This node's name (env NODE_NAME).")
	fs.StringVar(&o.policy, "preferred-allocation", string(plugin.Distributed), "GetPreferredAllocation policy: distributed (least shared GPU first) or packed.")
	fs.StringVar(&o.guardrails, "memory-guardrails", "", "Resources (comma-separated, such as nvidia.com/gpu) whose containers get the memory guardrail variables (docs/plugin.md); empty: none.")
	fs.StringVar(&o.mpsRoot, "mps-root", "", "Host directory of the MPS control daemons, NVIDIA's layout (<root>/<resource>/pipe, .started; "+mps.DefaultRoot+" in NVIDIA's chart), mounted at the same path here; empty refuses configs with sharing.mps.")
	fs.DurationVar(&o.healthInterval, "health.interval", 5*time.Second, "How often GPUs are read for health.")
	fs.DurationVar(&o.recovery, "health.recovery-interval", time.Minute, "How long a GPU must answer well after a critical Xid or failed reading before it is healthy again.")
	fs.DurationVar(&o.heldPoll, "kubelet.pod-resources-interval", 10*time.Second, "How often the IDs in use are read from the PodResources API.")
	o.log.Register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: gpuslice-plugin takes flags only", fs.Arg(0))
	}
	if err := flagenv.Apply(fs, "GPUSLICE_", nil); err != nil {
		return nil, err
	}
	if err := o.web.Validate(); err != nil {
		return nil, err
	}
	if err := flagenv.NonNegative(fs, "health.interval", "health.recovery-interval", "kubelet.pod-resources-interval"); err != nil {
		return nil, err
	}
	return o, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal starts a graceful shutdown; a second one, given
	// the default handling back, ends the program at once.
	context.AfterFunc(ctx, stop)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "gpuslice-plugin:", err)
		os.Exit(1)
	}
}

// run runs the program until ctx ends or a part of it fails; it logs to
// logOut.
func run(ctx context.Context, args []string, logOut io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	log, err := o.log.Logger(logOut)
	if err != nil {
		return err
	}
	policy, err := plugin.ParsePolicy(o.policy)
	if err != nil {
		return fmt.Errorf("--preferred-allocation: %w", err)
	}
	guardrails, err := plugin.ParseGuardrails(o.guardrails)
	if err != nil {
		return fmt.Errorf("--memory-guardrails: %w", err)
	}
	source, err := configSource(o, log)
	if err != nil {
		return err
	}
	gpus, err := backend.Open(o.backend, o.simFile, log, false)
	if err != nil {
		return err
	}
	defer gpus.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), procmetrics.New())
	opts := plugin.Options{
		Backend: gpus, Source: source, DevicePluginDir: o.pluginDir, KubeletSocket: o.kubeletSocket,
		Policy: policy, Guardrails: guardrails, MPSRoot: o.mpsRoot, HealthInterval: o.healthInterval, RecoveryInterval: o.recovery, HeldInterval: o.heldPoll,
		Registerer: reg, Logger: log,
	}
	if o.podResourcesSocket != "" {
		c, err := podresources.NewClient(o.podResourcesSocket)
		if err != nil {
			return err
		}
		defer c.Close()
		opts.PodResources = c
	}
	p, err := plugin.New(opts)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	served := make(chan error, 1)
	go func() {
		err := serve.Run(ctx, o.web.Options(serve.Options{
			Name: "gpuslice-plugin", Description: "Kubelet device plugin for time-sliced NVIDIA GPUs with live replica changes",
			Registry: reg, Logger: log,
		}))
		if err != nil && ctx.Err() == nil {
			// A plugin nobody can scrape hides its reload failures and
			// unhealthy GPUs: stop, so that the pod restarts and says why.
			log.Error("metrics server failed; stopping", "address", o.web.ListenAddresses, "err", err)
			cancel()
		}
		served <- err
	}()
	log.Info("gpuslice-plugin starting", "device_plugin_dir", o.pluginDir, "config_source", o.source, "backend", o.backend, "policy", policy)
	err = p.Run(ctx)
	cancel()
	if serr := <-served; err == nil && serr != nil {
		err = serr
	}
	return err
}

func configSource(o *options, log *slog.Logger) (plugin.Source, error) {
	switch o.source {
	case "file":
		if o.configFile == "" {
			return plugin.StaticSource(nil), nil
		}
		return &plugin.FileSource{Path: o.configFile, Logger: log}, nil
	case "kubernetes":
		ns, name, ok := strings.Cut(o.configMap, "/")
		if !ok || ns == "" || name == "" {
			return nil, fmt.Errorf("--config.configmap %q: want <namespace>/<name>", o.configMap)
		}
		if o.nodeName == "" {
			return nil, errors.New("--config.source=kubernetes needs --node-name (or NODE_NAME)")
		}
		cfg, err := kube.Config(o.kubeconfig, "gpuslice-plugin")
		if err != nil {
			return nil, fmt.Errorf("--config.source=kubernetes: %w", err)
		}
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("--config.source=kubernetes: kubernetes client: %w", err)
		}
		return &plugin.KubeSource{Client: client, Namespace: ns, Name: name, NodeName: o.nodeName, DefaultKey: o.defaultKey}, nil
	default:
		return nil, fmt.Errorf("unknown --config.source %q (want file or kubernetes)", o.source)
	}
}

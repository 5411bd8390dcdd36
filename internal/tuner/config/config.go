// Package config reads tuner.yaml, the file `gpuslice-tuner run --config`
// takes: how the controller gathers signals, how it writes the device-plugin
// config, leader election, and the `policy:` section. `simulate --config`
// decodes the same file into Config the same way, unknown keys refused, and
// uses its policy section and apply.mode, so one file serves both.
//
// Unknown keys are errors, naming the file and line: a misspelt setting left
// silently at its default would, for example, point the tuner at the wrong
// ConfigMap. Durations are Go durations ("15s", "3m").
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	promconfig "github.com/prometheus/common/config"
	"gopkg.in/yaml.v3"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// ErrInvalid wraps every error about the content of a tuner.yaml.
var ErrInvalid = errors.New("invalid tuner config")

// Apply modes (DESIGN.md, "Tuner contract").
const (
	// ModeConfigManager: NVIDIA's plugin with its config-manager sidecar;
	// named configs in the ConfigMap and the node's
	// nvidia.com/device-plugin.config label.
	ModeConfigManager = "config-manager"
	// ModeRestart: NVIDIA's plugin reading one key; the key is patched and
	// the DaemonSet restarted. One count for the whole cluster.
	ModeRestart = "restart"
	// ModePlugin: gpuslice-plugin, which reads the ConfigMap through the API
	// and picks the key from the node label, as config-manager does, and
	// re-advertises without a restart.
	ModePlugin = "plugin"
)

// Signal sources.
const (
	SourceExporters  = "exporters"
	SourcePrometheus = "prometheus"
)

// Config is a whole tuner.yaml.
type Config struct {
	// Interval is how often the leader decides; default policy.sampleInterval.
	Interval time.Duration `yaml:"interval"`
	// DryRun decides, logs, records Events and metrics, and writes nothing.
	DryRun         bool           `yaml:"dryRun"`
	LeaderElection LeaderElection `yaml:"leaderElection"`
	Signals        Signals        `yaml:"signals"`
	Apply          Apply          `yaml:"apply"`
	// WorkloadMemory is where the policy's workload record (policy.Memory:
	// each workload's VRAM peak and the counts it OOMed at) is kept across
	// restarts and leader changes.
	WorkloadMemory WorkloadMemory `yaml:"workloadMemory"`
	// IdleHolderAfter is how long a container holding a replica must have
	// run no kernel for the tuner to name it, as an idle holder, in the
	// Event it puts on a pod waiting for a replica it does not raise for.
	IdleHolderAfter time.Duration `yaml:"idleHolderAfter"`
	// Policy is the `policy:` section, decoded by policy.Config's own
	// UnmarshalYAML over policy.DefaultConfig (as policy.ConfigFromYAML
	// does for a policy section on its own).
	Policy policy.Config `yaml:"policy"`
}

// LeaderElection configures the Lease lock. Only the leader decides and
// writes; every replica gathers signals, so a new leader has a full window.
type LeaderElection struct {
	// Enabled defaults to true; turn it off only with a single replica.
	Enabled       bool          `yaml:"enabled"`
	Namespace     string        `yaml:"namespace"`
	Name          string        `yaml:"name"`
	LeaseDuration time.Duration `yaml:"leaseDuration"`
	RenewDeadline time.Duration `yaml:"renewDeadline"`
	RetryPeriod   time.Duration `yaml:"retryPeriod"`
}

// Signals says where measurements come from. Samples are taken every
// policy.sampleInterval: the policy's coverage rule assumes that cadence, so
// it is not a separate setting.
type Signals struct {
	// Source is "exporters" (default) or "prometheus".
	Source     string     `yaml:"source"`
	Exporters  Exporters  `yaml:"exporters"`
	Prometheus Prometheus `yaml:"prometheus"`
}

// Exporters configures scraping gpuslice-exporter directly. With Targets
// set, exactly those are scraped and no pods are discovered.
type Exporters struct {
	// Namespace and LabelSelector find the exporter pods; the node of a
	// pod's samples is its spec.nodeName.
	Namespace     string `yaml:"namespace"`
	LabelSelector string `yaml:"labelSelector"`
	// PortName is the container port to scrape; Port is used when a pod
	// declares no port of that name.
	PortName string        `yaml:"portName"`
	Port     int           `yaml:"port"`
	Scheme   string        `yaml:"scheme"`
	Path     string        `yaml:"path"`
	Timeout  time.Duration `yaml:"timeout"`
	// Targets is a static list of exporters (tests, clusters without pod
	// discovery).
	Targets []Target `yaml:"targets"`
	// HTTPClient is Prometheus's HTTP client settings (tls_config,
	// basic_auth, authorization, ...), for exporters run with
	// --web.config.file. Its keys are written as in a Prometheus scrape
	// config.
	HTTPClient promconfig.HTTPClientConfig `yaml:"httpClient"`
}

// Target is one statically configured exporter.
type Target struct {
	Node string `yaml:"node"`
	URL  string `yaml:"url"`
}

// Prometheus configures reading the exporters' series from Prometheus.
type Prometheus struct {
	// URL of the Prometheus HTTP API (without /api/v1).
	URL string `yaml:"url"`
	// NodeLabel is the label the scrape config puts the node name in.
	NodeLabel string `yaml:"nodeLabel"`
	// Selector is extra label matchers for every series, e.g.
	// `job="gpuslice-exporter"`.
	Selector   string                      `yaml:"selector"`
	Timeout    time.Duration               `yaml:"timeout"`
	HTTPClient promconfig.HTTPClientConfig `yaml:"httpClient"`
}

// Apply says where and how the device-plugin config is written.
type Apply struct {
	// Mode is config-manager, restart or plugin (required: writing the wrong
	// way does nothing visible, or restarts a DaemonSet nobody asked for).
	Mode      string    `yaml:"mode"`
	ConfigMap ObjectRef `yaml:"configMap"`
	// Key is, in restart mode, the key the DaemonSet reads and the tuner
	// patches; in config-manager and plugin modes, the config of nodes
	// without a label and the base every named config is derived from.
	Key string `yaml:"key"`
	// DaemonSet is the device plugin restarted in restart mode. In
	// config-manager mode it is optional: when set, the tuner restarts it
	// after rewriting a named config that nodes already use (NVIDIA's
	// config-manager acts on label changes only, so such a rewrite reaches
	// no plugin by itself).
	DaemonSet ObjectRef `yaml:"daemonSet"`
	// PropagationDelay is, in config-manager mode, how long after a named
	// config is written the tuner waits before pointing a node's label at
	// it: config-manager reads the ConfigMap through a volume that the
	// kubelet refreshes up to about a minute late, and exits on a label
	// naming a key it cannot see yet.
	PropagationDelay time.Duration `yaml:"propagationDelay"`
	// NodeSelector limits the nodes the tuner manages (a label selector).
	NodeSelector string `yaml:"nodeSelector"`
	// ConfigPrefix names the configs the tuner keeps: <prefix><replicas>.
	ConfigPrefix string `yaml:"configPrefix"`
	// VerifyTimeout is how long a node's allocatable may take to reach the
	// new count after a change.
	VerifyTimeout time.Duration `yaml:"verifyTimeout"`
	// VerifyHold is the longest a node stays untouched after a failed
	// verification when nothing about it changes.
	VerifyHold time.Duration `yaml:"verifyHold"`
}

// WorkloadMemory configures the persisted workload record.
type WorkloadMemory struct {
	// ConfigMap holds one key per node (<node>.json); an empty name keeps
	// the record in memory only (lost on restart). The tuner creates it.
	ConfigMap ObjectRef `yaml:"configMap"`
	// SaveInterval is the longest the stored record lags the one in memory
	// when only watch times moved; a new workload, a new peak or an OOM is
	// saved at the end of the round that saw it.
	SaveInterval time.Duration `yaml:"saveInterval"`
}

// ObjectRef names a namespaced object.
type ObjectRef struct {
	Namespace string `yaml:"namespace"`
	Name      string `yaml:"name"`
}

func (r ObjectRef) String() string { return r.Namespace + "/" + r.Name }

// Default returns every default; Apply.Mode, ConfigMap and Key have none.
func Default() Config {
	return Config{
		LeaderElection: LeaderElection{
			Enabled:       true,
			Namespace:     "gpuslice",
			Name:          "gpuslice-tuner",
			LeaseDuration: 15 * time.Second,
			RenewDeadline: 10 * time.Second,
			RetryPeriod:   2 * time.Second,
		},
		Signals: Signals{
			Source: SourceExporters,
			Exporters: Exporters{
				Namespace:     "gpuslice",
				LabelSelector: "app.kubernetes.io/name=gpuslice-exporter",
				PortName:      "metrics",
				Port:          9846,
				Scheme:        "http",
				Path:          "/metrics",
				Timeout:       5 * time.Second,
				HTTPClient:    promconfig.DefaultHTTPClientConfig,
			},
			Prometheus: Prometheus{
				NodeLabel:  "node",
				Timeout:    30 * time.Second,
				HTTPClient: promconfig.DefaultHTTPClientConfig,
			},
		},
		Apply: Apply{
			ConfigPrefix:     "gpuslice-",
			PropagationDelay: 90 * time.Second,
			VerifyTimeout:    3 * time.Minute,
			VerifyHold:       time.Hour,
		},
		IdleHolderAfter: time.Hour,
		WorkloadMemory: WorkloadMemory{
			ConfigMap:    ObjectRef{Namespace: "gpuslice", Name: "gpuslice-tuner-memory"},
			SaveInterval: 5 * time.Minute,
		},
		Policy: policy.DefaultConfig(),
	}
}

// Load reads and validates a tuner.yaml; errors name the file.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	c, err := Parse(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse reads a tuner.yaml document over Default and validates it.
func Parse(data []byte) (Config, error) {
	c, err := Decode(data)
	if err != nil {
		return Config{}, err
	}
	if c.Interval == 0 {
		c.Interval = c.Policy.SampleInterval
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Decode reads tuner.yaml over Default without validating it: unknown keys
// are errors naming them and their line, and so is a second YAML document,
// which a decoder reading one would drop without a word (a policy section
// after a `---`, say); an empty one, as a trailing `---` makes, is not.
// `simulate --config` uses it, checking only the policy section.
func Decode(data []byte) (Config, error) {
	c := Default()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	for {
		var more yaml.Node
		err := dec.Decode(&more)
		if errors.Is(err, io.EOF) {
			return c, nil
		}
		if err != nil {
			return Config{}, fmt.Errorf("%w: after the first YAML document: %w", ErrInvalid, err)
		}
		if len(more.Content) > 1 || (len(more.Content) == 1 && more.Content[0].ShortTag() != "!!null") {
			return Config{}, fmt.Errorf("%w: line %d: a second YAML document: tuner.yaml is one document", ErrInvalid, more.Line)
		}
	}
}

// configKey is a valid ConfigMap key.
var configKey = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)

// Validate reports every bad field at once, by its tuner.yaml path.
func (c Config) Validate() error {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if err := c.Policy.Validate(); err != nil {
		bad("%v", err)
	}
	if c.Interval <= 0 {
		bad("interval must be > 0, got %s", c.Interval)
	}
	if le := c.LeaderElection; le.Enabled {
		name(bad, "leaderElection.namespace", le.Namespace)
		name(bad, "leaderElection.name", le.Name)
		if le.RetryPeriod <= 0 || le.RenewDeadline <= le.RetryPeriod || le.LeaseDuration <= le.RenewDeadline {
			bad("leaderElection: want 0 < retryPeriod < renewDeadline < leaseDuration, got %s, %s, %s",
				le.RetryPeriod, le.RenewDeadline, le.LeaseDuration)
		}
	}
	if c.IdleHolderAfter <= 0 {
		bad("idleHolderAfter must be > 0, got %s", c.IdleHolderAfter)
	}
	if m := c.WorkloadMemory; m.ConfigMap.Name != "" {
		name(bad, "workloadMemory.configMap.namespace", m.ConfigMap.Namespace)
		name(bad, "workloadMemory.configMap.name", m.ConfigMap.Name)
		if m.SaveInterval <= 0 {
			bad("workloadMemory.saveInterval must be > 0, got %s", m.SaveInterval)
		}
	}

	switch s := c.Signals; s.Source {
	case SourceExporters:
		e := s.Exporters
		if len(e.Targets) == 0 {
			name(bad, "signals.exporters.namespace", e.Namespace)
			if _, err := labels.Parse(e.LabelSelector); err != nil || e.LabelSelector == "" {
				bad("signals.exporters.labelSelector %q: must be a non-empty label selector (%v)", e.LabelSelector, err)
			}
			if e.Port < 1 || e.Port > 65535 {
				bad("signals.exporters.port must be a port number, got %d", e.Port)
			}
			if e.Scheme != "http" && e.Scheme != "https" {
				bad("signals.exporters.scheme must be http or https, got %q", e.Scheme)
			}
			if !strings.HasPrefix(e.Path, "/") {
				bad("signals.exporters.path must start with /, got %q", e.Path)
			}
		}
		seen := map[string]bool{}
		for i, t := range e.Targets {
			if t.Node == "" {
				bad("signals.exporters.targets[%d].node is empty", i)
			}
			if seen[t.Node] {
				bad("signals.exporters.targets[%d].node %q appears twice", i, t.Node)
			}
			seen[t.Node] = true
			if u, err := url.Parse(t.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				bad("signals.exporters.targets[%d].url %q: want an http(s) URL", i, t.URL)
			}
		}
		if e.Timeout <= 0 {
			bad("signals.exporters.timeout must be > 0, got %s", e.Timeout)
		}
		if err := e.HTTPClient.Validate(); err != nil {
			bad("signals.exporters.httpClient: %v", err)
		}
	case SourcePrometheus:
		p := s.Prometheus
		if u, err := url.Parse(p.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("signals.prometheus.url %q: want an http(s) URL", p.URL)
		}
		if !validLabelName(p.NodeLabel) {
			bad("signals.prometheus.nodeLabel %q is not a label name", p.NodeLabel)
		}
		if strings.ContainsAny(p.Selector, "{}") {
			bad("signals.prometheus.selector %q: write matchers without braces, e.g. job=\"gpuslice-exporter\"", p.Selector)
		}
		if p.Timeout <= 0 {
			bad("signals.prometheus.timeout must be > 0, got %s", p.Timeout)
		}
		if err := p.HTTPClient.Validate(); err != nil {
			bad("signals.prometheus.httpClient: %v", err)
		}
	default:
		bad("signals.source must be %s or %s, got %q", SourceExporters, SourcePrometheus, s.Source)
	}

	a := c.Apply
	switch a.Mode {
	case ModeConfigManager, ModePlugin, ModeRestart:
	case "":
		bad("apply.mode is required: %s, %s or %s", ModeConfigManager, ModeRestart, ModePlugin)
	default:
		bad("apply.mode must be %s, %s or %s, got %q", ModeConfigManager, ModeRestart, ModePlugin, a.Mode)
	}
	name(bad, "apply.configMap.namespace", a.ConfigMap.Namespace)
	name(bad, "apply.configMap.name", a.ConfigMap.Name)
	if !configKey.MatchString(a.Key) {
		bad("apply.key %q must be a ConfigMap key", a.Key)
	}
	if a.PropagationDelay < 0 {
		bad("apply.propagationDelay must be >= 0, got %s", a.PropagationDelay)
	}
	if a.Mode == ModeRestart || (a.Mode == ModeConfigManager && a.DaemonSet != (ObjectRef{})) {
		name(bad, "apply.daemonSet.namespace", a.DaemonSet.Namespace)
		name(bad, "apply.daemonSet.name", a.DaemonSet.Name)
	}
	if a.Mode != ModeRestart {
		// Named configs are ConfigMap keys and node label values.
		for _, n := range []int{c.Policy.MinReplicas, c.Policy.MaxReplicas} {
			k := fmt.Sprintf("%s%d", a.ConfigPrefix, n)
			if errs := validation.IsValidLabelValue(k); len(errs) > 0 || !configKey.MatchString(k) || a.ConfigPrefix == "" {
				bad("apply.configPrefix %q: %q must be a ConfigMap key and a label value", a.ConfigPrefix, k)
				break
			}
		}
		if strings.HasPrefix(a.Key, a.ConfigPrefix) && a.ConfigPrefix != "" {
			bad("apply.key %q must not start with apply.configPrefix %q (the tuner owns those keys)", a.Key, a.ConfigPrefix)
		}
	}
	if _, err := labels.Parse(a.NodeSelector); err != nil {
		bad("apply.nodeSelector %q: %v", a.NodeSelector, err)
	}
	if a.VerifyTimeout <= 0 {
		bad("apply.verifyTimeout must be > 0, got %s", a.VerifyTimeout)
	}
	if a.VerifyHold <= 0 {
		bad("apply.verifyHold must be > 0, got %s", a.VerifyHold)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(problems, "; "))
	}
	return nil
}

func name(bad func(string, ...any), field, v string) {
	if v == "" {
		bad("%s is required", field)
		return
	}
	if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
		bad("%s %q: %s", field, v, strings.Join(errs, ", "))
	}
}

var labelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

func validLabelName(s string) bool { return labelName.MatchString(s) }

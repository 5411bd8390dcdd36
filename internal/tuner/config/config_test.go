package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

const minimal = `
apply:
  mode: config-manager
  configMap: {namespace: nvidia, name: plugin-configs}
  key: default
`

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	if c.Policy != policy.DefaultConfig() {
		t.Errorf("policy = %+v, want the defaults", c.Policy)
	}
	if c.Interval != policy.DefaultConfig().SampleInterval {
		t.Errorf("interval = %s, want sampleInterval", c.Interval)
	}
	if c.Signals.Source != SourceExporters || c.Signals.Exporters.Port != 9846 || c.Signals.Exporters.LabelSelector != want.Signals.Exporters.LabelSelector {
		t.Errorf("signals = %+v", c.Signals)
	}
	if !c.LeaderElection.Enabled || c.LeaderElection.Name != "gpuslice-tuner" {
		t.Errorf("leaderElection = %+v", c.LeaderElection)
	}
	if c.Apply.ConfigPrefix != "gpuslice-" || c.Apply.VerifyTimeout != 3*time.Minute {
		t.Errorf("apply = %+v", c.Apply)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		doc   string
		check func(t *testing.T, c Config)
		// errs are substrings of the error; none means the document is valid.
		errs []string
	}{
		{
			name: "policy section read by the policy's decoder",
			doc:  minimal + "policy: {maxReplicas: 6, window: 5m, sampleInterval: 10s}\n",
			check: func(t *testing.T, c Config) {
				if c.Policy.MaxReplicas != 6 || c.Policy.Window != 5*time.Minute || c.Policy.MinReplicas != 1 {
					t.Errorf("policy = %+v", c.Policy)
				}
				if c.Interval != 10*time.Second {
					t.Errorf("interval = %s, want the sampleInterval 10s", c.Interval)
				}
			},
		},
		{
			// run would drop it without a word, as simulate once did.
			name: "a second document",
			doc:  minimal + "---\npolicy: {maxReplicas: 1}\n",
			errs: []string{"a second YAML document"},
		},
		{
			name: "a trailing document separator",
			doc:  minimal + "---\n",
			check: func(t *testing.T, c Config) {
				if c.Policy.MaxReplicas != policy.DefaultConfig().MaxReplicas {
					t.Errorf("policy = %+v, want the defaults", c.Policy)
				}
			},
		},
		{
			name: "restart mode",
			doc: `
interval: 1m
dryRun: true
apply:
  mode: restart
  configMap: {namespace: nvidia, name: cfg}
  key: config.yaml
  daemonSet: {namespace: nvidia, name: nvidia-device-plugin}
`,
			check: func(t *testing.T, c Config) {
				if !c.DryRun || c.Interval != time.Minute || c.Apply.DaemonSet.Name != "nvidia-device-plugin" {
					t.Errorf("config = %+v", c)
				}
			},
		},
		{
			name: "prometheus source with an HTTP client section",
			doc: minimal + `
signals:
  source: prometheus
  prometheus:
    url: http://prom:9090
    selector: job="gpuslice-exporter"
    httpClient:
      basic_auth: {username: u, password: p}
`,
			check: func(t *testing.T, c Config) {
				p := c.Signals.Prometheus
				if p.URL != "http://prom:9090" || p.NodeLabel != "node" || p.HTTPClient.BasicAuth == nil || p.HTTPClient.BasicAuth.Username != "u" {
					t.Errorf("prometheus = %+v", p)
				}
			},
		},
		{
			name: "static targets need no discovery settings",
			doc: minimal + `
signals:
  exporters:
    labelSelector: ""
    targets: [{node: n1, url: "http://127.0.0.1:9846/metrics"}]
`,
			check: func(t *testing.T, c Config) {
				if len(c.Signals.Exporters.Targets) != 1 || c.Signals.Exporters.Targets[0].Node != "n1" {
					t.Errorf("targets = %+v", c.Signals.Exporters.Targets)
				}
			},
		},
		{name: "empty document", doc: "", errs: []string{"apply.mode is required", "apply.configMap.name is required"}},
		{name: "unknown key names its line", doc: minimal + "aply: {}\n", errs: []string{"line 6", "aply"}},
		{name: "unknown nested key", doc: minimal + "leaderElection: {leaseDuraton: 3s}\n", errs: []string{"leaseDuraton"}},
		{name: "unknown policy key", doc: minimal + "policy: {maxReplica: 3}\n", errs: []string{"maxReplica"}},
		{name: "bad policy value", doc: minimal + "policy: {minReplicas: 0}\n", errs: []string{"minReplicas must be >= 1"}},
		{name: "unknown mode", doc: strings.Replace(minimal, "config-manager", "configmanager", 1), errs: []string{`apply.mode must be`, `"configmanager"`}},
		{name: "restart needs a DaemonSet", doc: strings.Replace(minimal, "config-manager", "restart", 1), errs: []string{"apply.daemonSet.name is required"}},
		{name: "config-manager may name a DaemonSet to restart for rewritten keys", doc: strings.Replace(minimal, "apply:", "apply:\n  daemonSet: {namespace: nvidia, name: ''}\n  propagationDelay: 2m", 1),
			errs: []string{"apply.daemonSet.name is required"}},
		{name: "negative propagation delay", doc: strings.Replace(minimal, "apply:", "apply:\n  propagationDelay: -1s", 1), errs: []string{"apply.propagationDelay must be >= 0"}},
		{name: "key inside the tuner's prefix", doc: strings.Replace(minimal, "key: default", "key: gpuslice-4", 1), errs: []string{"must not start with apply.configPrefix"}},
		{name: "bad source", doc: minimal + "signals: {source: dcgm}\n", errs: []string{"signals.source"}},
		{name: "prometheus without url", doc: minimal + "signals: {source: prometheus}\n", errs: []string{"signals.prometheus.url"}},
		{name: "selector with braces", doc: minimal + "signals: {source: prometheus, prometheus: {url: 'http://p:9090', selector: '{job=\"x\"}'}}\n", errs: []string{"without braces"}},
		{name: "bad target", doc: minimal + "signals: {exporters: {targets: [{node: n1, url: 'ftp://x'}, {node: n1, url: 'http://x/m'}]}}\n",
			errs: []string{"targets[0].url", `targets[1].node "n1" appears twice`}},
		{name: "bad durations", doc: minimal + "leaderElection: {leaseDuration: 1s, renewDeadline: 2s}\n", errs: []string{"retryPeriod < renewDeadline < leaseDuration"}},
		{name: "bad node selector", doc: "apply: {nodeSelector: 'a in (', mode: plugin, configMap: {namespace: a, name: b}, key: k}\n", errs: []string{"apply.nodeSelector"}},
		{name: "unknown HTTP client key", doc: minimal + "signals: {exporters: {httpClient: {basic_auth: {usernme: x}}}}\n", errs: []string{"usernme"}},
		{name: "bad duration", doc: minimal + "interval: soon\n", errs: []string{"soon"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc))
			if len(tc.errs) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				tc.check(t, c)
				return
			}
			if err == nil {
				t.Fatalf("no error, want one mentioning %q", tc.errs)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			for _, s := range tc.errs {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

// TestExampleFile keeps deploy/examples/tuner.yaml valid and equal to the
// defaults it claims to show.
func TestExampleFile(t *testing.T) {
	path := filepath.Join("..", "..", "..", "deploy", "examples", "tuner.yaml")
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy != policy.DefaultConfig() {
		t.Errorf("example policy %+v differs from the defaults %+v", c.Policy, policy.DefaultConfig())
	}
	d := Default()
	if c.LeaderElection != d.LeaderElection {
		t.Errorf("example leaderElection %+v differs from the defaults %+v", c.LeaderElection, d.LeaderElection)
	}
	if c.Apply.VerifyTimeout != d.Apply.VerifyTimeout || c.Apply.VerifyHold != d.Apply.VerifyHold || c.Apply.ConfigPrefix != d.Apply.ConfigPrefix ||
		c.Apply.PropagationDelay != d.Apply.PropagationDelay {
		t.Errorf("example apply %+v differs from the defaults", c.Apply)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.ConfigFromYAML(data); err != nil {
		t.Errorf("simulate --config cannot read the example: %v", err)
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tuner.yaml")
	if err := os.WriteFile(path, []byte("apply: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("error %v does not name %s", err, path)
	}
}

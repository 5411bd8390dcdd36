package policy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults are invalid: %v", err)
	}
	tests := []struct {
		name   string
		change func(*Config)
		field  string
	}{
		{"min below 1", func(c *Config) { c.MinReplicas = 0 }, "minReplicas"},
		{"max below min", func(c *Config) { c.MinReplicas, c.MaxReplicas = 4, 3 }, "maxReplicas"},
		{"no step", func(c *Config) { c.MaxStepUp = 0 }, "maxStepUp"},
		{"no sample interval", func(c *Config) { c.SampleInterval = 0 }, "sampleInterval"},
		{"window shorter than a sample", func(c *Config) { c.Window = 10 * time.Second }, "window"},
		{"pressure window longer than the window", func(c *Config) { c.PressureWindow = 11 * time.Minute }, "pressureWindow"},
		{"negative cooldown", func(c *Config) { c.Cooldown = -time.Second }, "cooldown"},
		{"target above 1", func(c *Config) { c.TargetUtilization = 1.2 }, "targetUtilization"},
		{"target zero", func(c *Config) { c.TargetUtilization = 0 }, "targetUtilization"},
		{"pressure below target", func(c *Config) { c.PressureThreshold = 0.85 }, "pressureThreshold"},
		{"an OOM that costs nothing", func(c *Config) { c.OOMCost = 0 }, "oomCost"},
		{"a change that pays", func(c *Config) { c.ChangeCost = -time.Second }, "changeCost"},
		{"negative settle", func(c *Config) { c.Settle = -time.Second }, "settle"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.change(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("Validate() = %v, want ErrInvalidConfig naming %s", err, tc.field)
			}
		})
	}
}

func TestConfigFromYAML(t *testing.T) {
	custom := DefaultConfig()
	custom.Window, custom.MaxReplicas, custom.TargetUtilization = 30*time.Minute, 6, 0.8
	priced := DefaultConfig()
	priced.OOMCost, priced.ChangeCost, priced.Settle, priced.EvictCrashLoops = 2*time.Hour, time.Minute, 10*time.Minute, true

	tests := []struct {
		name    string
		yaml    string
		want    Config
		wantErr string // substring; empty means success
	}{
		{"no policy section gives the defaults", "source: exporters\napplyMode: plugin\n", DefaultConfig(), ""},
		{"empty document", "", DefaultConfig(), ""},
		{"empty policy section", "policy:\n", DefaultConfig(), ""},
		{"keys left out keep their defaults, other sections are ignored",
			"source: {kind: prometheus, url: http://prom:9090}\npolicy:\n  window: 30m\n  maxReplicas: 6\n  targetUtilization: 0.8\ndryRun: true\n",
			custom, ""},
		{"the objective's prices and eviction",
			"policy:\n  oomCost: 2h\n  changeCost: 1m\n  settle: 10m\n  evictCrashLoops: true\n", priced, ""},
		{"zero settle is allowed: a change may be undone at once", "policy:\n  settle: 0s\n",
			func() Config { c := DefaultConfig(); c.Settle = 0; return c }(), ""},
		{"oomCost must be positive", "policy:\n  oomCost: 0s\n", Config{}, "oomCost must be > 0"},
		{"unknown key inside policy", "policy:\n  window: 30m\n  windwo: 5m\n", Config{}, `line 3: policy: unknown key "windwo"`},
		{"duration as a bare number", "policy:\n  cooldown: 900\n", Config{}, "line 2"},
		{"bad duration", "policy:\n  window: ten minutes\n", Config{}, "line 2: cannot unmarshal"},
		{"policy not a mapping", "policy: [1, 2]\n", Config{}, "policy must be a mapping"},
		{"valid YAML, invalid values", "policy:\n  minReplicas: 5\n  maxReplicas: 2\n", Config{}, "maxReplicas must be >= minReplicas"},
		{"not YAML", "policy: {window: 5m\n", Config{}, "yaml"},
		// A second document was dropped unread: its policy never applied.
		{"a second document", "apply: {mode: plugin}\n---\npolicy: {maxReplicas: 1}\n", Config{}, "line 2: a second YAML document"},
		{"a second document that does not parse", "policy: {}\n---\npolicy: [1\n", Config{}, "after the first YAML document"},
		{"a trailing --- drops nothing", "policy:\n  maxReplicas: 6\n---\n",
			func() Config { c := DefaultConfig(); c.MaxReplicas = 6; return c }(), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ConfigFromYAML([]byte(tc.yaml))
			if tc.wantErr != "" {
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want ErrInvalidConfig containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

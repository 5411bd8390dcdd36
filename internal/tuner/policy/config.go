package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// ErrInvalidConfig wraps every error about a policy configuration: a bad
// value, an unknown key in the policy section, a section that does not parse.
var ErrInvalidConfig = errors.New("invalid tuner policy config")

// Config holds the knobs of Decide. One Config applies to a node: every GPU
// of the node is judged with it and the node gets the smallest answer.
//
// In tuner.yaml it is the `policy:` section, durations written as Go
// durations:
//
//	policy:
//	  minReplicas: 1
//	  maxReplicas: 8
//	  window: 10m
//
// Keys left out keep their DefaultConfig value.
type Config struct {
	// MinReplicas is the floor; 1 means the GPU may end up exclusive (a
	// device-plugin config without `sharing`).
	MinReplicas int `yaml:"minReplicas"`
	// MaxReplicas is the ceiling, whatever the headroom.
	MaxReplicas int `yaml:"maxReplicas"`
	// MaxStepUp bounds one raise.
	MaxStepUp int `yaml:"maxStepUp"`
	// Window is the span of samples Decide looks at (container peaks, OOM
	// events), the history a raise needs, how long a workload is watched
	// before it is known, and how far ahead a running pod's growth is
	// reserved.
	Window time.Duration `yaml:"window"`
	// Cooldown is kept so that configurations that set it stay valid; the
	// objective's change cost and Settle replaced it, and it is not read.
	Cooldown time.Duration `yaml:"cooldown"`
	// PressureWindow is how long memory pressure must last before a lowering,
	// and the least time between a change and a lowering for pressure.
	PressureWindow time.Duration `yaml:"pressureWindow"`
	// SampleInterval is how often signals are sampled. A window counts as
	// covered when its first sample is at most one interval after the
	// window's start and no two samples (nor the last sample and now) are
	// more than two intervals apart: one lost scrape is tolerated, a longer
	// gap is time nobody watched.
	SampleInterval time.Duration `yaml:"sampleInterval"`
	// TargetUtilization is the fraction of a GPU's memory the OOM rule's
	// "the measured footprints fit" and the DRA memory advice leave room
	// under; the objective uses the measured variability of sizes instead
	// of a fixed margin.
	TargetUtilization float64 `yaml:"targetUtilization"`
	// PressureThreshold is the used/total ratio that counts as pressure,
	// and as fullness when the pods holding replicas reach it even without
	// the smallest of them. It is above TargetUtilization so that a raise
	// can never by itself lead to a lowering for pressure.
	PressureThreshold float64 `yaml:"pressureThreshold"`
	// Remember is how long a workload's record (Memory) outlives its last
	// sighting, and how long an OOM keeps its workload from being given the
	// count it OOMed at: longer than a week, so that a weekly job finds its
	// record when it returns.
	Remember time.Duration `yaml:"remember"`
	// MaxWorkloads bounds the workload records kept, and the container
	// records, the most recently seen first.
	MaxWorkloads int `yaml:"maxWorkloads"`
	// OOMCost is what one GPU OOM is worth in one pod's waiting: the
	// objective lets a pod in when the chance that it brings an OOM, times
	// OOMCost, is less than the wait it saves. An OOM throws work away and,
	// once a pod that cannot fit is in, repeats until room appears (a crash
	// loop), so it is priced at hours.
	OOMCost time.Duration `yaml:"oomCost"`
	// ChangeCost is what one change of the count costs beyond its apply
	// mode's latency (a config write, an Event, a plugin that re-registers):
	// a change is made only when it saves more than this over the horizon.
	ChangeCost time.Duration `yaml:"changeCost"`
	// Settle is how long, beyond its apply mode's latency, a change stands
	// before the count may move the other way: a raise undone minutes
	// later, with no OOM to say it was wrong, paid twice (a config write, a
	// plugin restart in some modes) for nothing. An OOM ends it at once.
	Settle time.Duration `yaml:"settle"`
	// EvictCrashLoops lets the tuner evict, through the Eviction API, a pod
	// whose container OOMed twice in a row on a full GPU beside other pods,
	// when a controller recreates it (never a bare pod; PodDisruptionBudgets
	// are honoured by the API server). It then waits Pending, priced at the
	// memory its OOMs showed, instead of hammering its neighbours. Off by
	// default: the tuner only reports such loops (Event, metric).
	EvictCrashLoops bool `yaml:"evictCrashLoops"`
}

// DefaultConfig returns the defaults justified in docs/tuner-policy.md.
func DefaultConfig() Config {
	return Config{
		MinReplicas:       1,
		MaxReplicas:       16,
		MaxStepUp:         16,
		Window:            10 * time.Minute,
		Cooldown:          15 * time.Minute,
		PressureWindow:    2 * time.Minute,
		SampleInterval:    15 * time.Second,
		TargetUtilization: 0.9,
		PressureThreshold: 0.95,
		Remember:          14 * 24 * time.Hour,
		MaxWorkloads:      256,
		OOMCost:           6 * time.Hour,
		ChangeCost:        10 * time.Second,
		Settle:            5 * time.Minute,
	}
}

// Validate reports every bad field at once, by its tuner.yaml name.
func (c Config) Validate() error {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if c.MinReplicas < 1 {
		bad("minReplicas must be >= 1, got %d", c.MinReplicas)
	}
	if c.MaxReplicas < c.MinReplicas {
		bad("maxReplicas must be >= minReplicas (%d), got %d", c.MinReplicas, c.MaxReplicas)
	}
	if c.MaxStepUp < 1 {
		bad("maxStepUp must be >= 1, got %d", c.MaxStepUp)
	}
	if c.SampleInterval <= 0 {
		bad("sampleInterval must be > 0, got %s", c.SampleInterval)
	}
	if c.Window < c.SampleInterval || c.Window <= 0 {
		bad("window must be > 0 and >= sampleInterval (%s), got %s", c.SampleInterval, c.Window)
	}
	if c.PressureWindow < c.SampleInterval || c.PressureWindow <= 0 || c.PressureWindow > c.Window {
		bad("pressureWindow must be between sampleInterval (%s) and window (%s), got %s", c.SampleInterval, c.Window, c.PressureWindow)
	}
	if c.Cooldown < 0 {
		bad("cooldown must be >= 0, got %s", c.Cooldown)
	}
	if !(c.TargetUtilization > 0 && c.TargetUtilization <= 1) {
		bad("targetUtilization must be in (0, 1], got %g", c.TargetUtilization)
	}
	if !(c.PressureThreshold > 0 && c.PressureThreshold <= 1) {
		bad("pressureThreshold must be in (0, 1], got %g", c.PressureThreshold)
	} else if c.PressureThreshold <= c.TargetUtilization {
		bad("pressureThreshold (%g) must be above targetUtilization (%g)", c.PressureThreshold, c.TargetUtilization)
	}
	if c.Remember < c.Window {
		bad("remember must be >= window (%s), got %s", c.Window, c.Remember)
	}
	if c.MaxWorkloads < 1 {
		bad("maxWorkloads must be >= 1, got %d", c.MaxWorkloads)
	}
	if c.OOMCost <= 0 {
		bad("oomCost must be > 0, got %s", c.OOMCost)
	}
	if c.Settle < 0 {
		bad("settle must be >= 0, got %s", c.Settle)
	}
	if c.ChangeCost < 0 {
		bad("changeCost must be >= 0, got %s", c.ChangeCost)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(problems, "; "))
	}
	return nil
}

// configKeys are the keys a policy section may hold, in the order of Config.
var configKeys = []string{
	"minReplicas", "maxReplicas", "maxStepUp", "window", "cooldown",
	"pressureWindow", "sampleInterval", "targetUtilization", "pressureThreshold",
	"remember", "maxWorkloads", "oomCost", "changeCost", "settle", "evictCrashLoops",
}

// UnmarshalYAML decodes a policy section over the values already in c (so
// decoding into DefaultConfig() keeps defaults for absent keys) and rejects
// keys it does not know: a misspelt knob silently left at its default would
// change how a cluster is tuned without anyone noticing.
func (c *Config) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("%w: line %d: policy must be a mapping", ErrInvalidConfig, n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if !slices.Contains(configKeys, k.Value) {
			return fmt.Errorf("%w: line %d: policy: unknown key %q (known: %s)",
				ErrInvalidConfig, k.Line, k.Value, strings.Join(configKeys, ", "))
		}
	}
	type plain Config // no UnmarshalYAML: decodes field by field
	if err := n.Decode((*plain)(c)); err != nil {
		return fmt.Errorf("%w: policy: %w", ErrInvalidConfig, err)
	}
	return nil
}

// ConfigFromYAML reads the `policy:` section of a tuner.yaml document, starting
// from DefaultConfig, and validates it. Other top-level keys belong to the
// controller and are not checked here (`simulate --config` decodes the whole
// file through the config package's types, as `run` does, to refuse unknown
// ones); a document without a policy section gives the defaults. A second
// document is an error: it would be dropped unread. It takes the bytes, not
// a path, so that callers own file access and can name the file in their own
// errors.
func ConfigFromYAML(data []byte) (Config, error) {
	var doc struct {
		Policy yaml.Node `yaml:"policy"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	for {
		var more yaml.Node
		err := dec.Decode(&more)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Config{}, fmt.Errorf("%w: after the first YAML document: %w", ErrInvalidConfig, err)
		}
		// A trailing `---` makes an empty document, which drops nothing.
		if len(more.Content) > 1 || (len(more.Content) == 1 && more.Content[0].ShortTag() != "!!null") {
			return Config{}, fmt.Errorf("%w: line %d: a second YAML document: tuner.yaml is one document", ErrInvalidConfig, more.Line)
		}
	}
	cfg := DefaultConfig()
	if doc.Policy.Kind != 0 && doc.Policy.Tag != "!!null" {
		if err := doc.Policy.Decode(&cfg); err != nil {
			return Config{}, err
		}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

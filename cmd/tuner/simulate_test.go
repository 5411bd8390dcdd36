package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func trace(name string) string { return filepath.Join("..", "..", "test", "traces", name) }

// simulate runs the subcommand as main would and returns stdout.
func simulate(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := dispatch(context.Background(), append([]string{"simulate"}, args...), &out, &errOut)
	return out.String(), err
}

// decodeOne reads stdout as exactly one JSON object.
func decodeOne(t *testing.T, stdout string) map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(stdout))
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		t.Fatalf("stdout is not a JSON object: %v\n%s", err, stdout)
	}
	if err := dec.Decode(new(any)); !errors.Is(err, io.EOF) {
		t.Fatalf("stdout holds more than one JSON value (%v)", err)
	}
	return obj
}

func TestSimulatePrintsTheContractedJSON(t *testing.T) {
	stdout, err := simulate(t, "--trace", trace("tiny.yaml"), "--policy", "static:2")
	if err != nil {
		t.Fatal(err)
	}
	obj := decodeOne(t, stdout)
	// DESIGN.md's keys, with tiny.yaml's hand-checked values under static:2.
	want := map[string]any{"policy": "static:2", "oomEvents": 1.0, "podSecondsPending": 80.0,
		"podSecondsRunning": 260.0, "replicaChanges": 0.0, "finalReplicas": 2.0}
	for k, v := range want {
		if obj[k] != v {
			t.Errorf("%s = %v (%T), want %v", k, obj[k], obj[k], v)
		}
	}
	if _, ok := obj["changes"].([]any); !ok {
		t.Errorf("changes = %v, want a list", obj["changes"])
	}
}

func TestSimulateDefaultsToTheTunerPolicy(t *testing.T) {
	stdout, err := simulate(t, "--trace", trace("queue.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	obj := decodeOne(t, stdout)
	if obj["policy"] != "tuner" || obj["replicaChanges"].(float64) == 0 {
		t.Errorf("policy %v with %v changes, want the tuner raising replicas on queue.yaml", obj["policy"], obj["replicaChanges"])
	}
}

func TestSimulateReadsOnlyThePolicySectionOfTheConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// maxReplicas 3 caps the tuner that would otherwise reach 8 on queue.yaml;
	// the controller's sections are read but need not be complete for run.
	good := write("tuner.yaml", "signals: {source: exporters}\napply: {mode: plugin}\ndryRun: true\npolicy:\n  maxReplicas: 3\n  window: 5m\n")
	stdout, err := simulate(t, "--trace", trace("queue.yaml"), "--config", good)
	if err != nil {
		t.Fatal(err)
	}
	if got := decodeOne(t, stdout)["maxReplicas"]; got != 3.0 {
		t.Errorf("maxReplicas reached %v, want the config's 3", got)
	}

	bad := write("bad.yaml", "policy:\n  maxReplicas: 3\n  maxReplica: 4\n")
	_, err = simulate(t, "--trace", trace("queue.yaml"), "--config", bad)
	if err == nil || !strings.Contains(err.Error(), "bad.yaml") || !strings.Contains(err.Error(), `unknown key "maxReplica"`) {
		t.Errorf("err = %v, want one naming bad.yaml and the unknown key", err)
	}
}

func TestSimulateErrors(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"no trace", nil, true, "--trace is required"},
		{"unknown flag", []string{"--trace", trace("tiny.yaml"), "--speed", "2"}, true, "speed"},
		{"extra argument", []string{"--trace", trace("tiny.yaml"), "extra"}, true, `unexpected argument "extra"`},
		// A bad --policy is a command line not understood, as a bad
		// --apply-mode is: exit 2 with the usage.
		{"bad policy", []string{"--trace", trace("tiny.yaml"), "--policy", "static:0"}, true, "static:0"},
		{"unknown policy", []string{"--trace", trace("tiny.yaml"), "--policy", "foo"}, true, `--policy: bad policy: "foo"`},
		{"static count not a number", []string{"--trace", trace("tiny.yaml"), "--policy", "static:x"}, true, "static:x"},
		{"missing trace file", []string{"--trace", "nope.yaml"}, false, "nope.yaml"},
		{"missing config file", []string{"--trace", trace("tiny.yaml"), "--config", "nope.yaml"}, false, "nope.yaml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stdout, err := simulate(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, errUsage) != tc.usage {
				t.Errorf("err = %v, want one containing %q (usage error: %v)", err, tc.want, tc.usage)
			}
			if stdout != "" {
				t.Errorf("printed %q on failure", stdout)
			}
		})
	}
}

// simulate reads tuner.yaml as run does: a key run would refuse, at the top
// or inside a section, is an error naming it (a misspelt `policy:` ran on
// the defaults), and so is a second YAML document (it was dropped unread).
func TestSimulateConfigStrict(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"misspelt section", "polcy:\n  maxReplicas: 1\n", "field polcy not found"},
		{"key of no section", "applyMode: plugin\n", "field applyMode not found"},
		{"misspelt key in a section", "apply: {mdoe: instant}\n", "field mdoe not found"},
		{"unknown policy key", "policy: {maxReplica: 1}\n", `unknown key "maxReplica"`},
		{"second document", "apply: {mode: plugin}\n---\npolicy: {maxReplicas: 1}\n", "line 2: a second YAML document"},
		{"second document that does not parse", "policy: {}\n---\npolicy: [1\n", "after the first YAML document"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writeFile(t, "tuner.yaml", tc.body)
			stdout, err := simulate(t, "--trace", trace("tiny.yaml"), "--config", cfg)
			if err == nil || !strings.Contains(err.Error(), "tuner.yaml") || !strings.Contains(err.Error(), tc.want) || errors.Is(err, errUsage) {
				t.Errorf("err = %v, want one naming tuner.yaml and containing %q", err, tc.want)
			}
			if stdout != "" {
				t.Errorf("printed %q on failure", stdout)
			}
		})
	}

	// What run takes, simulate takes: the shipped example, and a trailing
	// `---`.
	for _, path := range []string{filepath.Join("..", "..", "deploy", "examples", "tuner.yaml"), writeFile(t, "t.yaml", "policy: {maxReplicas: 3}\n---\n")} {
		if _, err := simulate(t, "--trace", trace("tiny.yaml"), "--config", path); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
}

func TestDispatch(t *testing.T) {
	for _, args := range [][]string{nil, {"tune"}} {
		if err := dispatch(context.Background(), args, io.Discard, io.Discard); !errors.Is(err, errUsage) {
			t.Errorf("dispatch(%q) = %v, want a usage error", args, err)
		}
	}
	var out bytes.Buffer
	if err := dispatch(context.Background(), []string{"help"}, &out, io.Discard); err != nil || !strings.Contains(out.String(), "simulate --trace") {
		t.Errorf("help: %v, printed %q", err, out.String())
	}
}

// writeFile writes body to name in a fresh temporary folder.
func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSimulateApplyMode: the replay charges the apply mode's latency per
// change and reports it with the issue-21 keys; the mode comes from
// --apply-mode, else the config's apply.mode, else plugin.
func TestSimulateApplyMode(t *testing.T) {
	restartCfg := writeFile(t, "tuner.yaml", "apply:\n  mode: restart\npolicy:\n  window: 5m\n")
	// apply.mode alone, with none of the sections `run` needs.
	cmCfg := writeFile(t, "cm.yaml", "apply: {mode: config-manager}\n")
	tests := []struct {
		name    string
		args    []string
		mode    string
		latency float64 // seconds per change
	}{
		{"default", nil, "plugin", 10},
		{"config's apply.mode", []string{"--config", restartCfg}, "restart", 11},
		{"config with apply.mode only", []string{"--config", cmCfg}, "config-manager", 6},
		{"flag over config", []string{"--config", restartCfg, "--apply-mode", "instant"}, "instant", 0},
		{"flag", []string{"--apply-mode", "config-manager"}, "config-manager", 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stdout, err := simulate(t, append([]string{"--trace", trace("queue.yaml")}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			obj := decodeOne(t, stdout)
			for _, k := range []string{"applyLatencySeconds", "blackoutSeconds", "reversals", "maxOOMsInARow", "evictions"} {
				if _, ok := obj[k].(float64); !ok {
					t.Errorf("%s = %v (%T), want a number", k, obj[k], obj[k])
				}
			}
			if _, ok := obj["oomsPerContainer"].(map[string]any); !ok {
				t.Errorf("oomsPerContainer = %v (%T), want an object", obj["oomsPerContainer"], obj["oomsPerContainer"])
			}
			if obj["applyMode"] != tc.mode {
				t.Errorf("applyMode = %v, want %s", obj["applyMode"], tc.mode)
			}
			changes := obj["replicaChanges"].(float64)
			if changes == 0 {
				t.Fatalf("no change on queue.yaml: nothing to charge")
			}
			if got := obj["applyLatencySeconds"]; got != changes*tc.latency {
				t.Errorf("applyLatencySeconds = %v, want %v changes × %vs", got, changes, tc.latency)
			}
		})
	}

	// A static policy never changes, so no mode costs it anything; the
	// output still names the mode.
	stdout, err := simulate(t, "--trace", trace("queue.yaml"), "--policy", "static:3", "--apply-mode", "restart")
	if err != nil {
		t.Fatal(err)
	}
	if obj := decodeOne(t, stdout); obj["applyMode"] != "restart" || obj["applyLatencySeconds"] != 0.0 || obj["blackoutSeconds"] != 0.0 {
		t.Errorf("static:3 in restart mode: applyMode %v, latency %v, blackout %v; want restart, 0, 0",
			obj["applyMode"], obj["applyLatencySeconds"], obj["blackoutSeconds"])
	}
}

func TestSimulateBadApplyMode(t *testing.T) {
	stdout, err := simulate(t, "--trace", trace("tiny.yaml"), "--apply-mode", "rolling")
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--apply-mode") || !strings.Contains(err.Error(), `"rolling"`) {
		t.Errorf("err = %v, want a usage error naming --apply-mode and the value", err)
	}
	if stdout != "" {
		t.Errorf("printed %q on failure", stdout)
	}
	cfg := writeFile(t, "tuner.yaml", "apply:\n  mode: rolling\n")
	_, err = simulate(t, "--trace", trace("tiny.yaml"), "--config", cfg)
	if err == nil || !strings.Contains(err.Error(), "tuner.yaml") || !strings.Contains(err.Error(), "apply.mode") {
		t.Errorf("err = %v, want one naming the config and apply.mode", err)
	}
	// A valid flag replaces the config's bad mode: the flag is what is
	// replayed.
	if _, err := simulate(t, "--trace", trace("tiny.yaml"), "--config", cfg, "--apply-mode", "plugin"); err != nil {
		t.Errorf("--apply-mode plugin over a config's unknown mode: %v", err)
	}
}

// crashLoop is issue 21's third failure in small: three 4 GiB services on
// 24 GiB and a job admitted at the operator's 4 while it held 2 GiB, which
// grows to 14 GiB three minutes into each attempt: 12 + 14 > 24, so it OOMs
// on every attempt, restarted in place, whatever the count.
const crashLoop = `gpu: {memoryTotalBytes: 25769803776}
initialReplicas: 4
duration: 2h
pods:
  - {name: svc-a, arrive: 0s, run: 2h, memory: [[0s, 4294967296]]}
  - {name: svc-b, arrive: 0s, run: 2h, memory: [[0s, 4294967296]]}
  - {name: svc-c, arrive: 0s, run: 2h, memory: [[0s, 4294967296]]}
  - {name: job, arrive: 1m, run: 90m, memory: [[0s, 2147483648], [3m, 15032385536]]}
`

func TestSimulateEvictCrashLoops(t *testing.T) {
	tr := writeFile(t, "loop.yaml", crashLoop)
	evictCfg := writeFile(t, "evict.yaml", "policy:\n  evictCrashLoops: true\n")
	tests := []struct {
		name  string
		args  []string
		evict bool
	}{
		{"off by default", nil, false},
		{"flag", []string{"--evict-crash-loops"}, true},
		{"config", []string{"--config", evictCfg}, true},
		{"flag off over config", []string{"--config", evictCfg, "--evict-crash-loops=false"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stdout, err := simulate(t, append([]string{"--trace", tr}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			obj := decodeOne(t, stdout)
			evictions, row := obj["evictions"].(float64), obj["maxOOMsInARow"].(float64)
			ooms, _ := obj["oomsPerContainer"].(map[string]any)
			if tc.evict && (evictions < 1 || row > 2) {
				t.Errorf("with eviction: %v evictions, %v OOMs in a row (per container %v); want >= 1 and <= 2", evictions, row, ooms)
			}
			if !tc.evict && (evictions != 0 || row <= 2) {
				t.Errorf("without eviction: %v evictions, %v OOMs in a row (per container %v); want 0 and a loop of more than 2", evictions, row, ooms)
			}
			if ooms["job"] == nil || ooms["svc-a"] != nil {
				t.Errorf("oomsPerContainer = %v, want the job's OOMs only", ooms)
			}
		})
	}
}

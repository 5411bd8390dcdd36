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
	// maxReplicas 3 caps the tuner that would otherwise reach 8 on queue.yaml.
	good := write("tuner.yaml", "source: exporters\napplyMode: plugin\ndryRun: true\npolicy:\n  maxReplicas: 3\n  window: 5m\n")
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
		{"bad policy", []string{"--trace", trace("tiny.yaml"), "--policy", "static:0"}, false, "static:0"},
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

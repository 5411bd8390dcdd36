package dashboards

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// panelExpr returns the query of a dashboard's panel's first target, with
// the template variables set as Grafana would for "All" and the given
// range and rate interval.
func panelExpr(t *testing.T, file, title, rng, rateInterval string) string {
	t.Helper()
	d := loadJSON(t, file)
	var found []string
	var walk func(ps []any)
	walk = func(ps []any) {
		for _, p := range ps {
			p, _ := p.(map[string]any)
			if nested, ok := p["panels"].([]any); ok {
				walk(nested)
			}
			if p["title"] != title {
				continue
			}
			targets, _ := p["targets"].([]any)
			if len(targets) == 0 {
				continue
			}
			tg, _ := targets[0].(map[string]any)
			if e, ok := tg["expr"].(string); ok {
				found = append(found, e)
			}
		}
	}
	panels, _ := d["panels"].([]any)
	walk(panels)
	if len(found) != 1 {
		t.Fatalf("%s: %d panels titled %q with a query, want 1", file, len(found), title)
	}
	return strings.NewReplacer(`"$node"`, `".*"`, `"$gpu"`, `".*"`, `"$namespace"`, `".*"`,
		"$__range", rng, "$__rate_interval", rateInterval).Replace(found[0])
}

// TestEventCountsSeeEveryEvent evaluates the OOM and Xid panels' queries
// with promtool on series shaped as the exporter makes them:
//   - A: a device OOM counter created at 0, one OOM 30 minutes ago;
//   - B: an encoder-session counter, created by its first OOM 20 minutes
//     ago (increase() alone sees nothing of it);
//   - an exporter rolled out 50 minutes ago: a new instance, which counts
//     no history; C's device counter starts again at 0, and E's
//     encoder-session counter, which the old instance had at 1, is created
//     again by a new OOM 30 minutes ago;
//   - F: an unknown-kind counter created by its OOM 30 minutes ago, gone
//     since (its pod ended 10 minutes ago);
//   - an Xid 79 (the GPU's) and an Xid 13 (an application's), each
//     created by its first event 10 minutes ago;
//   - an alert firing from 100m.
func TestEventCountsSeeEveryEvent(t *testing.T) {
	oom := func(instance, pod, kind string) string {
		return fmt.Sprintf(`gpuslice_gpu_oom_events_total{instance=%q, job="gpuslice-exporter", node="n1", namespace="ml", pod=%q, container="main", gpu="0", uuid="GPU-1", source="log", kind=%q}`, instance, pod, kind)
	}
	xid := func(x string) string {
		return fmt.Sprintf(`gpuslice_gpu_xid_errors_total{instance="i1", job="gpuslice-exporter", node="n1", gpu="0", uuid="GPU-1", xid=%q}`, x)
	}
	// One sample a minute; the queries are evaluated at 180m.
	input := map[string]string{
		oom("i1", "a", "device"):          "0x150 1x30",
		oom("i1", "b", "encoder-session"): "_x160 1x20",
		oom("i1", "c", "device"):          "2x130",
		oom("i2", "c", "device"):          "_x131 0x49",
		oom("i1", "e", "encoder-session"): "1x130",
		oom("i2", "e", "encoder-session"): "_x150 1x30",
		oom("i1", "f", "unknown"):         "_x150 1x20 stale",
		xid("79"):                         "_x170 1x10",
		xid("13"):                         "_x170 1x10",
		`ALERTS{alertname="GPUSliceOOM", alertstate="firing", severity="warning"}`: "_x100 1x80",
	}
	tests := []struct {
		file, title, rng string
		at               string
		want             []sample
	}{
		{"gpu-sharing-cluster.json", "CUDA OOMs", "1h", "180m", []sample{{"{}", "4"}}},
		{"gpu-sharing-cluster.json", "Critical Xids", "1h", "180m", []sample{{"{}", "1"}}},
		{"gpu-sharing-cluster.json", "CUDA OOMs by pod", "1h", "180m", []sample{
			{`{node="n1", namespace="ml", pod="a", container="main", kind="device"}`, "1"},
			{`{node="n1", namespace="ml", pod="b", container="main", kind="encoder-session"}`, "1"},
			{`{node="n1", namespace="ml", pod="e", container="main", kind="encoder-session"}`, "1"},
			{`{node="n1", namespace="ml", pod="f", container="main", kind="unknown"}`, "1"},
		}},
		// Per interval: B's first OOM shows in the interval it came in.
		{"gpu-sharing-cluster.json", "CUDA OOMs per node", "1h", "162m", []sample{{`{node="n1"}`, "1"}}},
		{"gpu-sharing-node.json", "CUDA OOMs by pod", "1h", "162m", []sample{
			{`{namespace="ml", pod="a", kind="device"}`, "0"},
			{`{namespace="ml", pod="b", kind="encoder-session"}`, "1"},
			{`{namespace="ml", pod="c", kind="device"}`, "0"},
			{`{namespace="ml", pod="e", kind="encoder-session"}`, "0"},
			{`{namespace="ml", pod="f", kind="unknown"}`, "0"},
		}},
		// A 0 when nothing fires, and only then.
		{"gpu-sharing-cluster.json", "Firing alerts", "1h", "50m", []sample{{"{}", "0"}}},
		{"gpu-sharing-cluster.json", "Firing alerts", "1h", "150m", []sample{{`{severity="warning"}`, "1"}}},
		{"gpu-sharing-node.json", "Xid errors", "1h", "172m", []sample{
			{`{gpu="0", xid="13"}`, "1"},
			{`{gpu="0", xid="79"}`, "1"},
		}},
	}
	// The OOM annotation marks B's first OOM when it comes, and not the
	// rolled-out exporter's new counters at 0.
	annotation := ""
	annotations, _ := loadJSON(t, "gpu-sharing-node.json")["annotations"].(map[string]any)
	list, _ := annotations["list"].([]any)
	for _, a := range list {
		if a, _ := a.(map[string]any); a["name"] == "CUDA OOM" {
			annotation, _ = a["expr"].(string)
		}
	}
	if annotation == "" {
		t.Fatal("gpu-sharing-node.json has no CUDA OOM annotation with a query")
	}
	annotation = strings.NewReplacer(`"$node"`, `".*"`, `"$gpu"`, `".*"`, `"$namespace"`, `".*"`).Replace(annotation)

	var cases []exprCase
	for _, tc := range tests {
		cases = append(cases, exprCase{"round(" + panelExpr(t, tc.file, tc.title, tc.rng, "5m") + ")", tc.at, tc.want})
	}
	cases = append(cases,
		exprCase{annotation, "131m", nil},
		exprCase{annotation, "160m", []sample{{oom("i1", "b", "encoder-session"), "1"}}})
	promtoolEval(t, input, cases)
}

// TestPodMemoryPeakSumsContainers: a pod's peak is what its GPU
// containers hold together, each counted once over two exporter instances
// (a rollout).
func TestPodMemoryPeakSumsContainers(t *testing.T) {
	mem := func(instance, container string) string {
		return fmt.Sprintf(`gpuslice_container_gpu_memory_used_bytes{instance=%q, node="n1", namespace="ml", pod="p", container=%q, gpu="0", uuid="GPU-1"}`, instance, container)
	}
	input := map[string]string{
		mem("i1", "main"):    "1073741824x30 4294967296x10",
		mem("i2", "main"):    "_x40 4294967296x20",
		mem("i1", "sidecar"): "1073741824x60",
	}
	promtoolEval(t, input, []exprCase{
		{panelExpr(t, "gpu-sharing-node.json", "Memory peak by pod", "1h", "5m"), "60m", []sample{{`{namespace="ml", pod="p", gpu="0"}`, "5368709120"}}},
		{panelExpr(t, "gpu-sharing-node.json", "Memory by pod, 1h rolling peak", "1h", "5m"), "60m", []sample{{`{namespace="ml", pod="p", gpu="0"}`, "5368709120"}}},
	})
}

type sample struct{ labels, value string }

type exprCase struct {
	expr, at string
	want     []sample
}

// promtoolEval has promtool evaluate each case's expression at its time on
// the input series (one sample a minute) and compare the result.
func promtoolEval(t *testing.T, input map[string]string, cases []exprCase) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (%v); apt-get install prometheus (make test does)", err)
	}
	var b strings.Builder
	b.WriteString("rule_files: []\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n")
	for series, values := range input {
		fmt.Fprintf(&b, "      - series: %q\n        values: %q\n", series, values)
	}
	b.WriteString("    promql_expr_test:\n")
	for _, c := range cases {
		fmt.Fprintf(&b, "      - expr: %q\n        eval_time: %s\n        exp_samples:", c.expr, c.at)
		if len(c.want) == 0 {
			b.WriteString(" []")
		}
		b.WriteString("\n")
		for _, s := range c.want {
			fmt.Fprintf(&b, "          - labels: %q\n            value: %s\n", s.labels, s.value)
		}
	}
	f := filepath.Join(t.TempDir(), "promql_test.yaml")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "test", "rules", f).CombinedOutput()
	if err != nil {
		t.Errorf("promtool test rules: %v\n%s", err, out)
	}
}

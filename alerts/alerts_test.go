package alerts

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/gpuslice/gpuslice/dashboards/metricnames"
)

const (
	rulesFile    = "gpuslice-rules.yaml"
	amFile       = "alertmanager-example.yaml"
	runbookURL   = "https://github.com/gpuslice/gpuslice/blob/main/docs/runbook.md#"
	installHint  = "apt-get install prometheus prometheus-alertmanager"
	checkScript  = "check.sh"
	testsPattern = "tests/*.yaml"
)

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         *string           `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type testFile struct {
	Tests []struct {
		Name        string `yaml:"name"`
		InputSeries []struct {
			Series string `yaml:"series"`
		} `yaml:"input_series"`
		AlertRuleTests []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func loadRules(t *testing.T, path string) []rule {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s: no rules", path)
	}
	return rules
}

func loadTests(t *testing.T) map[string]testFile {
	t.Helper()
	paths, err := filepath.Glob(testsPattern)
	if err != nil || len(paths) == 0 {
		t.Fatalf("no rule tests match %s (%v)", testsPattern, err)
	}
	files := map[string]testFile{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var f testFile
		if err := yaml.Unmarshal(data, &f); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		files[p] = f
	}
	return files
}

// requireTools fails rather than skips: without promtool and amtool nothing
// proves the alerts work, and a skipped test reads as a passing one.
func requireTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"promtool", "amtool", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found (%v); %s", tool, err, installHint)
		}
	}
}

func runCheck(t *testing.T, dir string) (string, error) {
	t.Helper()
	script, err := filepath.Abs(checkScript)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", script, dir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestCheckScript(t *testing.T) {
	requireTools(t)
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	out, err := runCheck(t, dir)
	if err != nil {
		t.Fatalf("check.sh failed: %v\n%s", err, out)
	}
	for _, want := range []string{"promtool check rules", "promtool test rules", "amtool check-config", "config routes test", "all checks passed"} {
		if !strings.Contains(out, want) {
			t.Errorf("check.sh output lacks %q:\n%s", want, out)
		}
	}
}

// TestCheckScriptCatchesBreakage copies the alerts into a temporary folder,
// breaks one thing at a time, and expects check.sh to fail: the script must be
// able to say no.
func TestCheckScriptCatchesBreakage(t *testing.T) {
	requireTools(t)
	tests := []struct {
		name string
		file string
		old  string
		new  string
		want string
	}{
		{
			name: "rule syntax",
			file: rulesFile,
			old:  "gpuslice_gpu_temperature_celsius > 85",
			new:  "gpuslice_gpu_temperature_celsius >> 85",
			want: "FAILED: promtool check rules",
		},
		{
			name: "threshold no longer matches its test",
			file: rulesFile,
			old:  "gpuslice_gpu_temperature_celsius > 85",
			new:  "gpuslice_gpu_temperature_celsius > 95",
			want: "FAILED: promtool test rules",
		},
		{
			name: "OOM alert routed to the default receiver",
			file: amFile,
			old:  "    - receiver: gpu-oom\n",
			new:  "    - receiver: default\n",
			want: "--verify.receivers=gpu-oom alertname=GPUSliceOOM",
		},
		{
			name: "invalid Alertmanager config",
			file: amFile,
			old:  "receiver: default\n  group_by",
			new:  "receiver: nobody\n  group_by",
			want: "FAILED: amtool check-config",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			copyAlerts(t, dir)
			path := filepath.Join(dir, tc.file)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(data, []byte(tc.old)) {
				t.Fatalf("%s no longer contains %q; update this test", tc.file, tc.old)
			}
			data = bytes.Replace(data, []byte(tc.old), []byte(tc.new), 1)
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := runCheck(t, dir)
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("check.sh on a broken %s: err = %v, want exit status 1\n%s", tc.file, err, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("check.sh output lacks %q:\n%s", tc.want, out)
			}
		})
	}
}

func copyAlerts(t *testing.T, dir string) {
	t.Helper()
	paths, err := filepath.Glob(testsPattern)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "tests"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range append([]string{rulesFile, amFile}, paths...) {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRulesReadOnlyKnownMetrics(t *testing.T) {
	for _, r := range loadRules(t, rulesFile) {
		t.Run(r.Alert+r.Record, func(t *testing.T) {
			if err := metricnames.Check(r.Expr); err != nil {
				t.Error(err)
			}
		})
	}
}

// The tests' input series must be metrics that exist too, or a rule test
// could pass against data no exporter produces.
func TestRuleTestSeriesAreKnownMetrics(t *testing.T) {
	for path, f := range loadTests(t) {
		for _, tc := range f.Tests {
			for _, s := range tc.InputSeries {
				if err := metricnames.Check(s.Series); err != nil {
					t.Errorf("%s: test %q: %v", path, tc.Name, err)
				}
			}
		}
	}
}

func TestEveryAlertIsComplete(t *testing.T) {
	anchors := runbookAnchors(t)
	severities := []string{"critical", "warning", "info"}
	seen := map[string]bool{}
	for _, r := range loadRules(t, rulesFile) {
		if r.Alert == "" {
			continue
		}
		t.Run(r.Alert, func(t *testing.T) {
			if seen[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			seen[r.Alert] = true
			if r.For == nil {
				t.Error("no for:")
			}
			if s := r.Labels["severity"]; !slices.Contains(severities, s) {
				t.Errorf("labels.severity = %q, want one of %v", s, severities)
			}
			for _, key := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[key]) == "" {
					t.Errorf("annotations.%s is empty", key)
				}
			}
			// absent() returns one label-less series of value 1: nothing to template.
			desc := r.Annotations["description"]
			if !strings.HasPrefix(strings.TrimSpace(r.Expr), "absent(") &&
				!strings.Contains(desc, "$labels.") && !strings.Contains(desc, "$value") {
				t.Errorf("description has no templated value: %q", desc)
			}
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, runbookURL)
			if !ok {
				t.Errorf("runbook_url %q does not start with %s", url, runbookURL)
			} else if !anchors[anchor] {
				t.Errorf("runbook_url anchor #%s has no heading in the runbook", anchor)
			}
		})
	}
}

// bareNode is the node label printed without a check that it is set.
var bareNode = regexp.MustCompile(`\{\{-?\s*\$labels\.node\s*-?\}\}`)

// TestAnnotationsSurviveMissingNodeLabel: the exporter's and the plugin's
// `node` label comes from the scrape config's relabelling, which a
// hand-written config may lack; their alerts must not read "on node ".
// The tuner sets `node` on its own series.
func TestAnnotationsSurviveMissingNodeLabel(t *testing.T) {
	for _, r := range loadRules(t, rulesFile) {
		if r.Alert == "" || strings.Contains(r.Expr, "gpuslice_tuner_") {
			continue
		}
		for key, text := range r.Annotations {
			if bareNode.MatchString(text) {
				t.Errorf("%s: annotations.%s prints $labels.node unguarded; use {{ with $labels.node }}: %q", r.Alert, key, text)
			}
		}
	}
}

// TestEveryAlertTestedBothWays holds the rule tests to covering, for every
// alert, a case where it fires and a case where it must not.
func TestEveryAlertTestedBothWays(t *testing.T) {
	fires, quiet := map[string]bool{}, map[string]bool{}
	for path, f := range loadTests(t) {
		for _, tc := range f.Tests {
			for _, a := range tc.AlertRuleTests {
				if a.Alertname == "" {
					t.Errorf("%s: test %q has an alert_rule_test without alertname", path, tc.Name)
				}
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				} else {
					quiet[a.Alertname] = true
				}
			}
		}
	}
	alerts := map[string]bool{}
	for _, r := range loadRules(t, rulesFile) {
		if r.Alert == "" {
			continue
		}
		alerts[r.Alert] = true
		if !fires[r.Alert] {
			t.Errorf("%s: no rule test where it fires", r.Alert)
		}
		if !quiet[r.Alert] {
			t.Errorf("%s: no rule test where it stays quiet", r.Alert)
		}
	}
	for name := range fires {
		if !alerts[name] {
			t.Errorf("rule tests expect alert %s, which %s does not define", name, rulesFile)
		}
	}
}

// TestRunbookQueriesReadKnownMetrics checks the ```promql blocks of the
// runbook, so its advice does not rot when a metric is renamed.
func TestRunbookQueriesReadKnownMetrics(t *testing.T) {
	path := runbookPath(t)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		in    bool
		block strings.Builder
		start int
		count int
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		switch {
		case !in && strings.TrimSpace(text) == "```promql":
			in, start = true, line
			block.Reset()
		case in && strings.TrimSpace(text) == "```":
			in = false
			count++
			if err := metricnames.Check(block.String()); err != nil {
				t.Errorf("%s:%d: %v", path, start, err)
			}
		case in:
			block.WriteString(text + "\n")
		}
	}
	if in {
		t.Errorf("%s:%d: unterminated promql block", path, start)
	}
	if count == 0 {
		t.Errorf("%s: no promql blocks found", path)
	}
}

// runbookPath prefers docs/runbook.md, where runbook_url points, and falls back
// to the copy kept beside the rules until it moves there.
func runbookPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{filepath.Join("..", "docs", "runbook.md"), "RUNBOOK.md"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("no runbook: neither ../docs/runbook.md nor RUNBOOK.md exists")
	return ""
}

var headingRE = regexp.MustCompile(`^#{1,6}\s+(.+?)\s*#*\s*$`)

// runbookAnchors returns the anchors GitHub gives the runbook's headings.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(runbookPath(t))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if m := headingRE.FindStringSubmatch(line); m != nil {
			anchors[slug(m[1])] = true
		}
	}
	return anchors
}

// slug follows GitHub's heading anchors: lower case, punctuation other than
// '-' and '_' dropped, spaces turned into '-'.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	tests := []struct{ in, want string }{
		{"GPUSliceOOM", "gpusliceoom"},
		{"Exporter down: what to do", "exporter-down-what-to-do"},
		{"gpu_oom-events", "gpu_oom-events"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			if got := slug(tc.in); got != tc.want {
				t.Errorf("slug(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

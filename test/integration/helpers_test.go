package integration

import (
	"github.com/gpuslice/gpuslice/internal/testproc"

	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// binary builds a command of this module once per test run.
func binary(t *testing.T, pkg string) string { return testproc.Build(t, pkg) }

// freeAddr returns a loopback address with a free port.
func freeAddr(t *testing.T) string { return testproc.FreeAddr(t) }

// process is a program run for one test; its output goes to the test log
// when the test fails.
type process struct {
	cmd *exec.Cmd
	out testproc.Output
}

func (p *process) Output() string { return p.out.String() }

func start(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	return startEnv(t, nil, bin, args...)
}

// startEnv is start with env added to the test's environment.
func startEnv(t *testing.T, env []string, bin string, args ...string) *process {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &process{}
	p.cmd = exec.CommandContext(ctx, bin, args...)
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.Cancel = func() error { return p.cmd.Process.Signal(os.Interrupt) }
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = p.cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), p.Output())
		}
	})
	return p
}

// scrape fetches and parses a /metrics page.
func scrape(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// metrics is one scrape with lookups by labels.
type metrics map[string]*dto.MetricFamily

// value returns the value of the one series of name whose labels include
// want, and whether there was exactly one.
func (m metrics) value(name string, want map[string]string) (float64, bool) {
	var found []float64
	mf := m[name]
	if mf == nil {
		return 0, false
	}
	for _, s := range mf.GetMetric() {
		if matches(s, want) {
			switch {
			case s.Gauge != nil:
				found = append(found, s.GetGauge().GetValue())
			case s.Counter != nil:
				found = append(found, s.GetCounter().GetValue())
			case s.Untyped != nil:
				found = append(found, s.GetUntyped().GetValue())
			}
		}
	}
	if len(found) != 1 {
		return 0, false
	}
	return found[0], true
}

func (m metrics) count(name string, want map[string]string) int {
	n := 0
	if mf := m[name]; mf != nil {
		for _, s := range mf.GetMetric() {
			if matches(s, want) {
				n++
			}
		}
	}
	return n
}

func (m metrics) dump(name string) string {
	var lines []string
	if mf := m[name]; mf != nil {
		for _, s := range mf.GetMetric() {
			var ls []string
			for _, l := range s.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			v := s.GetGauge().GetValue() + s.GetCounter().GetValue()
			lines = append(lines, fmt.Sprintf("%s{%s} %g", name, strings.Join(ls, ","), v))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func matches(s *dto.Metric, want map[string]string) bool {
	got := map[string]string{}
	for _, l := range s.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// eventually polls cond until it returns "" or the deadline passes, then
// fails with cond's last complaint.
func eventually(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	testproc.Eventually(t, timeout, 100*time.Millisecond, cond)
}

package main

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/testenv"
)

// statusHelp returns what `status -h` prints, split into the synopsis
// (before "flags:") and the flags' defaults.
func statusHelp(t *testing.T) (synopsis, defaults string) {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := statusCommand(t.Context(), []string{"-h"}, &out, &errOut, time.Now); err != nil {
		t.Fatalf("status -h: %v", err)
	}
	synopsis, defaults, ok := strings.Cut(errOut.String(), "\nflags:\n")
	if !ok {
		t.Fatalf("status -h has no synopsis before the flags:\n%s", errOut.String())
	}
	return synopsis, defaults
}

// TestStatusHelpPlaceholders: Go's flag package takes a backquoted word in
// a help text as the flag's placeholder; --exporter's once read
// "-exporter kubectl port-forward".
func TestStatusHelpPlaceholders(t *testing.T) {
	_, defaults := statusHelp(t)
	for _, want := range []string{"-exporter NODE=URL\n", "-prometheus URL\n", "-kubeconfig FILE\n"} {
		if !strings.Contains(defaults, "  "+want) {
			t.Errorf("status -h lacks %q:\n%s", want, defaults)
		}
	}
}

// TestStatusSynopsis: the synopsis of `status -h` names every flag status
// defines, and every flag docs/tuner.md gives status is one status defines.
func TestStatusSynopsis(t *testing.T) {
	synopsis, defaults := statusHelp(t)
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -(\S+)`).FindAllStringSubmatch(defaults, -1) {
		defined[m[1]] = true
		dashes := "--"
		if len(m[1]) == 1 {
			dashes = "-"
		}
		if !regexp.MustCompile(`\[` + regexp.QuoteMeta(dashes+m[1]) + `[ \]]`).MatchString(synopsis) {
			t.Errorf("synopsis lacks [%s%s …]:\n%s", dashes, m[1], synopsis)
		}
	}
	if len(defined) == 0 {
		t.Fatalf("no flags in status -h:\n%s", defaults)
	}

	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "tuner.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "## `gpuslice-tuner status`")
	if !ok {
		t.Fatal("docs/tuner.md has no status section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for _, m := range regexp.MustCompile(`(?:^|[\s\x60\[])--?([a-z][a-z.-]*)`).FindAllStringSubmatch(section, -1) {
		if !defined[m[1]] {
			t.Errorf("docs/tuner.md gives status --%s, which status does not define", m[1])
		}
	}
}

func TestStatusTimeoutMustBePositive(t *testing.T) {
	for _, v := range []string{"0s", "-1s"} {
		var out, errOut bytes.Buffer
		err := statusCommand(t.Context(), []string{"--timeout", v}, &out, &errOut, time.Now)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--timeout "+v) {
			t.Errorf("status --timeout %s = %v, want a usage error naming --timeout %s", v, err, v)
		}
	}
}

// TestStatusExporterForUnlistedNode: an --exporter node the API server
// does not list (here a typo of gpu-node-1) fails the command, naming the
// flag and the node, after the report of the listed nodes; its URL is not
// scraped.
func TestStatusExporterForUnlistedNode(t *testing.T) {
	env := testenv.Start(t)
	ctx := t.Context()
	node, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Allocatable = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("4")}
	if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var scrapes atomic.Int32
	exporter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		scrapes.Add(1)
		_, _ = w.Write([]byte("gpuslice_gpu_memory_total_bytes{gpu=\"0\",uuid=\"GPU-1\"} 100\n"))
	}))
	defer exporter.Close()
	kubeconfig := env.Kubeconfig(t, t.TempDir())

	var out, errOut bytes.Buffer
	err = statusCommand(ctx, []string{"--kubeconfig", kubeconfig, "--exporter", "gpu-nod-1=" + exporter.URL},
		&out, &errOut, time.Now)
	want := `--exporter gpu-nod-1=` + exporter.URL + `: the API server lists no node "gpu-nod-1"`
	if err == nil || !strings.Contains(err.Error(), want) || errors.Is(err, errUsage) {
		t.Errorf("err = %v, want one (not a usage error) containing %q", err, want)
	}
	if !strings.Contains(out.String(), "NODE gpu-node-1") {
		t.Errorf("the listed node's report is missing:\n%s", out.String())
	}
	if n := scrapes.Load(); n != 0 {
		t.Errorf("the unlisted node's exporter was scraped %d times, want 0", n)
	}
}

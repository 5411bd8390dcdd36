// Package deploy holds gpuslice's Helm chart (helm/gpuslice) and the plain
// manifests rendered from it (manifests/), and the code that renders them
// with the helm command-line tool.
//
// The chart cannot read files outside its directory, so it carries copies of
// alerts/gpuslice-rules.yaml and dashboards/*.json under helm/gpuslice/files;
// ChartCopies lists them. `make manifests` refreshes the copies and the
// rendered manifests (go test ./deploy -run 'TestChartCopies|TestManifests'
// -update); the tests fail when either is stale, lint the chart, and have a
// real kube-apiserver accept every rendered object in a server-side dry run.
package deploy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Release and Namespace are the Helm release name and namespace the plain
// manifests are rendered with: the object names users see
// (gpuslice-exporter, ...) and the namespace they create first.
const (
	Release   = "gpuslice"
	Namespace = "gpuslice"
)

// ChartDir is the chart, relative to this package's directory (the repo's
// deploy/).
const ChartDir = "helm/gpuslice"

// ErrHelm wraps every failure of the helm command.
var ErrHelm = errors.New("helm failed")

// Helm runs one helm binary.
type Helm struct {
	Path string
}

// Run runs helm with args and returns its standard output; a non-zero exit
// is an error wrapping ErrHelm and carrying helm's standard error.
func (h Helm) Run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, h.Path, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%w: helm %s: %w\n%s%s", ErrHelm, strings.Join(args, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// Template renders chart as release in namespace with extra arguments
// (--set, -f, --show-only).
func (h Helm) Template(ctx context.Context, chart, release, namespace string, args ...string) ([]byte, error) {
	return h.Run(ctx, append([]string{"template", release, chart, "--namespace", namespace}, args...)...)
}

// Manifest is one file of deploy/manifests and the helm template arguments
// that produce it.
type Manifest struct {
	File        string   // name under deploy/manifests
	Description string   // first line of the file's header
	Args        []string // after `helm template gpuslice deploy/helm/gpuslice --namespace gpuslice`
}

// Manifests lists the plain manifests kept in deploy/manifests.
func Manifests() []Manifest {
	return []Manifest{
		{
			File:        "gpuslice.yaml",
			Description: "gpuslice with the chart's default values: exporter DaemonSet and tuner (restart mode, NVIDIA's static device plugin in kube-system) in dry run: it writes nothing until tuner.yaml says dryRun: false.",
		},
		{
			File:        "gpuslice-plugin.yaml",
			Description: "gpuslice with its own device plugin: exporter, gpuslice-plugin DaemonSet, and the tuner in plugin mode, in dry run until tuner.yaml says dryRun: false.",
			Args:        []string{"--set", "plugin.enabled=true", "--set", "tuner.mode=plugin"},
		},
		{
			File:        "gpuslice-k3s.yaml",
			Description: "gpuslice on k3s with the NVIDIA Container Toolkit: the defaults (tuner in dry run) plus runtimeClassName nvidia.",
			Args:        []string{"--set", "runtimeClassName=nvidia"},
		},
		{
			File:        "gpuslice-k3s-plugin.yaml",
			Description: "gpuslice on k3s with the NVIDIA Container Toolkit and its own device plugin: runtimeClassName nvidia, exporter, gpuslice-plugin DaemonSet, and the tuner in plugin mode, in dry run until tuner.yaml says dryRun: false.",
			Args:        []string{"--set", "runtimeClassName=nvidia", "--set", "plugin.enabled=true", "--set", "tuner.mode=plugin"},
		},
		{
			File:        "gpuslice-monitoring.yaml",
			Description: "kube-prometheus-stack objects only: ServiceMonitors, the PrometheusRule and the Grafana dashboard ConfigMaps (apply after gpuslice.yaml; add the release label your Prometheus selects).",
			Args: []string{
				"--set", "monitoring.serviceMonitor.enabled=true",
				"--set", "monitoring.prometheusRule.enabled=true",
				"--set", "monitoring.dashboards.enabled=true",
				"--show-only", "templates/servicemonitor.yaml",
				"--show-only", "templates/prometheusrule.yaml",
				"--show-only", "templates/dashboards.yaml",
			},
		},
	}
}

// Command is the helm command line that renders m, as written in its header.
func (m Manifest) Command() string {
	parts := []string{"helm template " + Release + " deploy/" + ChartDir + " --namespace " + Namespace}
	for i := 0; i < len(m.Args); i++ {
		if strings.HasPrefix(m.Args[i], "--") && i+1 < len(m.Args) {
			parts = append(parts, m.Args[i]+" "+m.Args[i+1])
			i++
			continue
		}
		parts = append(parts, m.Args[i])
	}
	return strings.Join(parts, " \\\n#     ")
}

// Render produces the content of m's file: a header saying how it was made,
// then helm's output. chart is the chart directory.
func (m Manifest) Render(ctx context.Context, h Helm, chart string) ([]byte, error) {
	out, err := h.Template(ctx, chart, Release, Namespace, m.Args...)
	if err != nil {
		return nil, fmt.Errorf("rendering %s: %w", m.File, err)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s\n#\n", m.Description)
	fmt.Fprintf(&b, "# Generated by `make manifests` from the Helm chart; do not edit. It ran:\n#   %s\n", m.Command())
	fmt.Fprintf(&b, "#\n# Namespaced objects are in namespace %q: kubectl create namespace %s first.\n", Namespace, Namespace)
	b.Write(out)
	return b.Bytes(), nil
}

// ChartCopy is a file the chart carries a copy of.
type ChartCopy struct {
	Source string // relative to the repository root
	Copy   string // relative to the repository root
}

// ChartCopies lists the copies inside the chart of files kept elsewhere in
// the repository. sources are the dashboard JSON file names in dashboards/.
func ChartCopies(dashboards []string) []ChartCopy {
	copies := []ChartCopy{{Source: "alerts/gpuslice-rules.yaml", Copy: "deploy/" + ChartDir + "/files/gpuslice-rules.yaml"}}
	for _, d := range dashboards {
		name := filepath.Base(d)
		copies = append(copies, ChartCopy{Source: "dashboards/" + name, Copy: "deploy/" + ChartDir + "/files/dashboards/" + name})
	}
	return copies
}

// Object is one rendered Kubernetes object and the template it came from.
type Object struct {
	Source string // helm's "# Source:" line, e.g. gpuslice/templates/tuner-rbac.yaml
	*unstructured.Unstructured
}

// String names the object for messages: Kind namespace/name (template).
func (o Object) String() string {
	name := o.GetName()
	if ns := o.GetNamespace(); ns != "" {
		name = ns + "/" + name
	}
	return fmt.Sprintf("%s %s (%s)", o.GetKind(), name, o.Source)
}

// ErrBadObject wraps a rendered document that is not a Kubernetes object.
var ErrBadObject = errors.New("rendered document is not a Kubernetes object")

// Objects splits a multi-document YAML stream (helm template output) into
// objects, skipping empty documents.
func Objects(data []byte) ([]Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []Object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		source := sourceOf(doc)
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("%w: document %d (%s): %w", ErrBadObject, i, source, err)
		}
		if s := strings.TrimSpace(string(js)); s == "null" || s == "{}" {
			continue
		}
		// UnmarshalJSON, unlike a plain decode, keeps integers int64 as
		// client-go's typed objects have them.
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("%w: document %d (%s): %w", ErrBadObject, i, source, err)
		}
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("%w: document %d (%s) lacks apiVersion, kind or metadata.name", ErrBadObject, i, source)
		}
		objs = append(objs, Object{Source: source, Unstructured: u})
	}
}

func sourceOf(doc []byte) string {
	for line := range strings.SplitSeq(string(doc), "\n") {
		if s, ok := strings.CutPrefix(line, "# Source: "); ok {
			return strings.TrimSpace(s)
		}
	}
	return "unknown template"
}

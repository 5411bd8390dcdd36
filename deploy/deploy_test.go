package deploy

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/testproc"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
)

var update = flag.Bool("update", false, "rewrite deploy/manifests and the chart's copies of the alert rules and dashboards (what `make manifests` runs)")

// repoRoot is the repository root: tests run in deploy/.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// helmBinary builds helm once through hack/helm.sh (a no-op when
// .cache/bin/helm exists) and fails the test when it cannot: CI must never
// pass without having linted and rendered the chart.
func helmBinary(t *testing.T) Helm {
	t.Helper()
	return Helm{Path: testproc.Hack(t, "helm.sh")}
}

func chartPath(t *testing.T) string {
	return filepath.Join(repoRoot(t), "deploy", ChartDir)
}

// valueSet is one way to install the chart. Each has its own release name
// and namespace so that all of them can be installed in one API server
// (cluster-scoped objects are named after the release).
type valueSet struct {
	name, release, namespace string
	args                     []string
}

func valueSets() []valueSet {
	return []valueSet{
		{name: "default", release: "gpuslice", namespace: "gpuslice"},
		// A live tuner: it writes only with dryRun false; it evicts
		// crash-looping pods only with evictCrashLoops.
		{name: "plugin", release: "gp", namespace: "gpu-plugin", args: []string{
			"--set", "plugin.enabled=true", "--set", "tuner.mode=plugin",
			"--set", "tuner.config.dryRun=false",
			"--set", "tuner.config.policy.evictCrashLoops=true",
		}},
		{name: "servicemonitors-rules-dashboards", release: "mon", namespace: "gpu-mon", args: []string{
			"--set", "plugin.enabled=true", "--set", "tuner.mode=plugin",
			"--set", "monitoring.serviceMonitor.enabled=true",
			"--set", "monitoring.serviceMonitor.labels.release=kube-prometheus-stack",
			"--set", "monitoring.serviceMonitor.scrapeTimeout=10s",
			"--set", "monitoring.prometheusRule.enabled=true",
			"--set", "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
			"--set", "monitoring.dashboards.enabled=true",
			"--set", "monitoring.dashboards.namespace=monitoring",
			"--set", "monitoring.dashboards.annotations.grafana_folder=GPU",
		}},
		// gpuslice-plugin sharing through MPS, with the chart's control
		// daemon (docs/mps.md).
		{name: "mps", release: "mps", namespace: "gpu-mps", args: []string{
			"--set", "plugin.enabled=true", "--set", "mps.enabled=true",
			"--set-json", `plugin.config.default="version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"`,
		}},
		// A cluster with time-sliced and MPS nodes: the MPS daemon only on
		// the nodes whose label picks the MPS config.
		{name: "mps-mixed", release: "mixed", namespace: "gpu-mixed", args: []string{
			"--set", "plugin.enabled=true", "--set", "mps.enabled=true",
			"--set-json", `plugin.config.mps="version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"`,
			"--set", "mps.nodeSelector.nvidia\\.com/device-plugin\\.config=mps",
		}},
		{name: "podmonitors", release: "pm", namespace: "gpu-pm", args: []string{
			"--set", "plugin.enabled=true",
			"--set", "monitoring.podMonitor.enabled=true",
		}},
		{name: "k3s-runtimeclass", release: "k3s", namespace: "gpu-k3s", args: []string{
			"--set", "runtimeClassName=nvidia",
		}},
		{name: "kubelet-pods-config-manager", release: "kcm", namespace: "gpu-kcm", args: []string{
			"--set", "exporter.podsSource=kubelet",
			"--set", "exporter.kubeletInsecureSkipTLSVerify=true",
			"--set", "exporter.rbac.nodesProxy=true",
			"--set", "exporter.webConfig.basic_auth_users.prometheus=$2y$10$abcdefghijklmnopqrstuv",
			// Basic auth without TLS: the tuner still scrapes over http.
			"--set-json", `tuner.config.signals.exporters.httpClient={"basic_auth":{"username":"prometheus","password_file":"/etc/gpuslice-client/password"}}`,
			"--set-json", `tuner.extraVolumes=[{"name":"client","secret":{"secretName":"kcm-client"}}]`,
			"--set-json", `tuner.extraVolumeMounts=[{"name":"client","mountPath":"/etc/gpuslice-client","readOnly":true}]`,
			"--set", "exporter.oom.patterns={CUDA error: out of memory}",
			"--set", "exporter.podAnnotations.example\\.com/team=ml",
			"--set", "tuner.mode=config-manager",
			"--set", "tuner.devicePlugin.namespace=nvidia-device-plugin",
			"--set", "tuner.replicas=2",
			"--set", "tuner.config.policy.maxReplicas=6",
			"--set", "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			"--set", "gpuNodeSelector.nvidia\\.com/gpu\\.present=null",
			"--set", "gpuNodeSelector.gpu=rtx-a6000",
		}},
		{name: "exporter-tls-servicemonitor", release: "tls", namespace: "gpu-tls", args: slices.Concat(exporterTLSArgs(),
			[]string{"--set", "monitoring.serviceMonitor.enabled=true"},
			monitorTLSArgs("serviceMonitor"))},
		{name: "exporter-tls-podmonitor", release: "tlspm", namespace: "gpu-tlspm", args: slices.Concat(exporterTLSArgs(),
			[]string{"--set", "monitoring.podMonitor.enabled=true", "--set", "plugin.enabled=true"},
			monitorTLSArgs("podMonitor"))},
	}
}

// exporterTLSArgs serve the exporter over TLS with basic auth and give the
// tuner what it needs to scrape it: https, the CA, a server name the
// certificate has (the tuner dials pod IPs) and a password, from a Secret.
func exporterTLSArgs() []string {
	return []string{
		"--set-json", `exporter.webConfig={"tls_server_config":{"cert_file":"/etc/gpuslice/tls/tls.crt","key_file":"/etc/gpuslice/tls/tls.key"},"basic_auth_users":{"prometheus":"$2y$10$abcdefghijklmnopqrstuv"}}`,
		"--set-json", `exporter.extraVolumes=[{"name":"tls","secret":{"secretName":"exporter-tls"}}]`,
		"--set-json", `exporter.extraVolumeMounts=[{"name":"tls","mountPath":"/etc/gpuslice/tls","readOnly":true}]`,
		"--set", "tuner.config.signals.exporters.scheme=https",
		"--set-json", `tuner.config.signals.exporters.httpClient={"tls_config":{"ca_file":"/etc/gpuslice-client/ca.crt","server_name":"gpuslice-exporter"},"basic_auth":{"username":"prometheus","password_file":"/etc/gpuslice-client/password"}}`,
		"--set-json", `tuner.extraVolumes=[{"name":"client","secret":{"secretName":"tuner-client"}}]`,
		"--set-json", `tuner.extraVolumeMounts=[{"name":"client","mountPath":"/etc/gpuslice-client","readOnly":true}]`,
	}
}

// monitorTLSArgs set the exporter monitor's endpoint to match
// exporterTLSArgs (kind serviceMonitor or podMonitor).
func monitorTLSArgs(kind string) []string {
	return []string{
		"--set-json", "monitoring." + kind + `.endpoint.exporter={"scheme":"https","tlsConfig":{"ca":{"secret":{"name":"exporter-tls","key":"ca.crt"}},"serverName":"gpuslice-exporter"},"basicAuth":{"username":{"name":"scrape","key":"username"},"password":{"name":"scrape","key":"password"}}}`,
	}
}

func render(t *testing.T, h Helm, vs valueSet) []Object {
	t.Helper()
	out, err := h.Template(t.Context(), chartPath(t), vs.release, vs.namespace, vs.args...)
	if err != nil {
		t.Fatalf("value set %s: %v", vs.name, err)
	}
	objs, err := Objects(out)
	if err != nil {
		t.Fatalf("value set %s: %v", vs.name, err)
	}
	return objs
}

func TestHelmLint(t *testing.T) {
	h := helmBinary(t)
	for _, vs := range valueSets() {
		t.Run(vs.name, func(t *testing.T) {
			for _, strict := range []bool{false, true} {
				args := []string{"lint", chartPath(t), "--namespace", vs.namespace}
				if strict {
					args = append(args, "--strict")
				}
				if out, err := h.Run(t.Context(), append(args, vs.args...)...); err != nil {
					t.Errorf("helm %s: %v\n%s", strings.Join(args[:1], " "), err, out)
				}
			}
		})
	}
}

// A tag that YAML or --set reads as a number is still the image's tag.
func TestNumericImageTag(t *testing.T) {
	h := helmBinary(t)
	objs := render(t, h, valueSet{name: "numeric-tag", release: "gpuslice", namespace: "gpuslice", args: []string{"--set", "image.tag=1"}})
	if got := container(t, find(t, objs, "DaemonSet", "gpuslice-exporter"))["image"]; got != "ghcr.io/gpuslice/gpuslice:1" {
		t.Errorf("image %v, want ghcr.io/gpuslice/gpuslice:1", got)
	}
}

func TestTemplateRejectsBadValues(t *testing.T) {
	h := helmBinary(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"both monitor kinds", []string{"--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.podMonitor.enabled=true"}, "scraped twice"},
		{"unknown tuner mode", []string{"--set", "tuner.mode=live"}, `tuner.mode "live"`},
		{"unknown pods source", []string{"--set", "exporter.podsSource=cri"}, `exporter.podsSource "cri"`},
		{"plugin mode without the plugin", []string{"--set", "tuner.mode=plugin"}, "needs plugin.enabled=true"},
		{"unknown device list strategy", []string{"--set", "plugin.deviceListStrategy={envvar,cdi}"}, `plugin.deviceListStrategy "cdi"`},
		{"unknown device ID strategy", []string{"--set", "plugin.deviceIDStrategy=serial"}, `plugin.deviceIDStrategy "serial"`},
		{"exporter TLS, tuner on http", []string{"--set", "exporter.webConfig.tls_server_config.cert_file=/c", "--set", "exporter.webConfig.tls_server_config.key_file=/k"},
			"set tuner.config.signals.exporters.scheme=https"},
		{"exporter basic auth, tuner without credentials", []string{"--set", "exporter.webConfig.basic_auth_users.p=x"},
			"set tuner.config.signals.exporters.httpClient.basic_auth"},
		{"exporter TLS, ServiceMonitor on http", slices.Concat(exporterTLSArgs(), []string{"--set", "monitoring.serviceMonitor.enabled=true"}),
			"set monitoring.serviceMonitor.endpoint.exporter.scheme=https"},
		{"exporter basic auth, PodMonitor without credentials", slices.Concat(exporterTLSArgs(),
			[]string{"--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.podMonitor.endpoint.exporter.scheme=https"}),
			"set monitoring.podMonitor.endpoint.exporter.basicAuth"},
		{"monitor endpoint repeats a key the chart sets", []string{"--set", "monitoring.serviceMonitor.endpoint.tuner.interval=5s"},
			"monitoring.serviceMonitor.endpoint.tuner.interval: the chart sets interval itself"},
		{"plugin mode, tuner and plugin on different default keys", []string{"--set", "plugin.enabled=true", "--set", "tuner.mode=plugin", "--set", "tuner.devicePlugin.configKey=base"},
			`the tuner's apply.key "base" (tuner.devicePlugin.configKey or tuner.config.apply.key) differs from plugin.defaultConfigKey "default"`},
		{"plugin mode, the key set through tuner.config", []string{"--set", "plugin.enabled=true", "--set", "tuner.mode=plugin", "--set", "tuner.config.apply.key=base"},
			`the tuner's apply.key "base"`},
		{"monitors with a name the alerts do not find", []string{"--set", "fullnameOverride=gpu", "--set", "monitoring.serviceMonitor.enabled=true"},
			`base name "gpu" (the release name, fullnameOverride, nameOverride) does not end in "gpuslice"`},
		{"monitors with gpuslice inside the name", []string{"--set", "fullnameOverride=gpuslice-prod", "--set", "monitoring.podMonitor.enabled=true"},
			`base name "gpuslice-prod"`},
		{"a tag YAML reads as a number", []string{"--set-json", "image.tag=1.10"}, "image.tag 1.1 is a number in YAML"},
		{"plugin mode, tuner.config.apply not a map", []string{"--set", "plugin.enabled=true", "--set", "tuner.mode=plugin", "--set", "tuner.config.apply=foo"},
			"tuner.config.apply must be a map"},
		{"an MPS config whose sharing is not a map", []string{"--set", "mps.enabled=true", "--set", "plugin.enabled=true",
			"--set-json", `plugin.config.default="version: v1\nsharing: mps\n"`}, "plugin.config default does not share through MPS"},
		{"MPS daemon without gpuslice-plugin", []string{"--set", "mps.enabled=true"}, "mps.enabled needs plugin.enabled=true"},
		{"MPS daemon on every GPU node, beside a time-slicing config", []string{"--set", "mps.enabled=true", "--set", "plugin.enabled=true"},
			"plugin.config default does not share through MPS"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.Template(t.Context(), chartPath(t), Release, Namespace, tc.args...)
			if !errors.Is(err, ErrHelm) {
				t.Fatalf("helm template %v: want an error, got %v", tc.args, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm template %v: error does not say %q:\n%v", tc.args, tc.want, err)
			}
		})
	}
}

// TestChartCopies checks that the chart's copies of the alert rules and the
// dashboards are byte-for-byte the files they copy, and that the chart
// carries no dashboard that dashboards/ no longer has.
func TestChartCopies(t *testing.T) {
	root := repoRoot(t)
	sources, err := filepath.Glob(filepath.Join(root, "dashboards", "*.json"))
	if err != nil || len(sources) == 0 {
		t.Fatalf("no dashboards/*.json found (%v)", err)
	}
	copies := ChartCopies(sources)
	for _, c := range copies {
		want, err := os.ReadFile(filepath.Join(root, c.Source))
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(root, c.Copy)
		if *update {
			if err := os.WriteFile(dst, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(dst)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is not a copy of %s (run `make manifests`)", c.Copy, c.Source)
		}
	}
	inChart, err := filepath.Glob(filepath.Join(chartPath(t), "files", "dashboards", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range inChart {
		rel, _ := filepath.Rel(root, f)
		if !slices.ContainsFunc(copies, func(c ChartCopy) bool { return c.Copy == rel }) {
			if *update {
				if err := os.Remove(f); err != nil {
					t.Fatal(err)
				}
				continue
			}
			t.Errorf("%s has no source in dashboards/ (run `make manifests`)", rel)
		}
	}
}

// TestManifests checks that deploy/manifests holds exactly what the chart
// renders now.
func TestManifests(t *testing.T) {
	h := helmBinary(t)
	dir := filepath.Join(repoRoot(t), "deploy", "manifests")
	want := map[string]bool{}
	for _, m := range Manifests() {
		want[m.File] = true
		t.Run(m.File, func(t *testing.T) {
			got, err := m.Render(t.Context(), h, chartPath(t))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, m.File)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			have, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run `make manifests`)", err)
			}
			if diff := cmp.Diff(string(have), string(got)); diff != "" {
				t.Errorf("deploy/manifests/%s is stale; run `make manifests` (-committed +rendered):\n%s", m.File, diff)
			}
			if _, err := Objects(got); err != nil {
				t.Errorf("deploy/manifests/%s: %v", m.File, err)
			}
		})
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !want[e.Name()] && e.Name() != "README.md" {
			t.Errorf("deploy/manifests/%s is not rendered by Manifests() (delete it, or add it there)", e.Name())
		}
	}
}

// find returns the rendered object of kind and name, failing when absent.
func find(t *testing.T, objs []Object, kind, name string) Object {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	var have []string
	for _, o := range objs {
		have = append(have, o.GetKind()+"/"+o.GetName())
	}
	t.Fatalf("no %s %s rendered; have %v", kind, name, have)
	return Object{}
}

func kinds(objs []Object, kind string) []Object {
	var out []Object
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func nested[T any](t *testing.T, o Object, path ...string) T {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(o.Object, path...)
	if err != nil || !ok {
		t.Fatalf("%s: no %s (%v)", o, strings.Join(path, "."), err)
	}
	typed, ok := v.(T)
	if !ok {
		t.Fatalf("%s: %s is %T, want %T", o, strings.Join(path, "."), v, typed)
	}
	return typed
}

// container returns the only container of a workload's pod template.
func container(t *testing.T, o Object) map[string]any {
	t.Helper()
	cs := nested[[]any](t, o, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%s: %d containers, want 1", o, len(cs))
	}
	return cs[0].(map[string]any)
}

// isMPSDaemon tells the chart's MPS control daemon, the one workload that
// runs another image than gpuslice's (a shell and NVIDIA's driver tools).
func isMPSDaemon(o Object) bool {
	return o.GetLabels()["app.kubernetes.io/component"] == "mps-control-daemon"
}

func strs(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

func appVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartPath(t), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(data, &c); err != nil || c.AppVersion == "" {
		t.Fatalf("Chart.yaml appVersion: %q, %v", c.AppVersion, err)
	}
	return c.AppVersion
}

// mountsOf maps mount path → {volume, readOnly} and volumes name → host path.
func mountsOf(t *testing.T, o Object) (map[string]corev1.VolumeMount, map[string]string) {
	t.Helper()
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range container(t, o)["volumeMounts"].([]any) {
		mm := m.(map[string]any)
		ro, _ := mm["readOnly"].(bool)
		mounts[mm["mountPath"].(string)] = corev1.VolumeMount{Name: mm["name"].(string), ReadOnly: ro}
	}
	hostPaths := map[string]string{}
	for _, v := range nested[[]any](t, o, "spec", "template", "spec", "volumes") {
		vm := v.(map[string]any)
		if hp, ok := vm["hostPath"].(map[string]any); ok {
			hostPaths[vm["name"].(string)] = hp["path"].(string)
		}
	}
	return mounts, hostPaths
}

func checkHostMount(t *testing.T, o Object, mountPath, hostPath string, readOnly bool) {
	t.Helper()
	mounts, hostPaths := mountsOf(t, o)
	m, ok := mounts[mountPath]
	if !ok {
		t.Errorf("%s: nothing mounted at %s", o, mountPath)
		return
	}
	if got := hostPaths[m.Name]; got != hostPath {
		t.Errorf("%s: %s comes from host path %q, want %q", o, mountPath, got, hostPath)
	}
	if m.ReadOnly != readOnly {
		t.Errorf("%s: %s readOnly=%v, want %v", o, mountPath, m.ReadOnly, readOnly)
	}
}

// checkLocked asserts the container is not privileged, cannot gain
// privileges, drops every capability and has a read-only root.
func checkLocked(t *testing.T, o Object) {
	t.Helper()
	sc, _ := container(t, o)["securityContext"].(map[string]any)
	if sc == nil {
		t.Errorf("%s: no container securityContext", o)
		return
	}
	if sc["privileged"] != false || sc["allowPrivilegeEscalation"] != false || sc["readOnlyRootFilesystem"] != true {
		t.Errorf("%s: securityContext %v, want privileged=false allowPrivilegeEscalation=false readOnlyRootFilesystem=true", o, sc)
	}
	caps, _ := sc["capabilities"].(map[string]any)
	if caps == nil || !slices.Equal(strs(caps["drop"]), []string{"ALL"}) || caps["add"] != nil {
		t.Errorf("%s: capabilities %v, want drop [ALL] and nothing added", o, caps)
	}
}

func checkPort(t *testing.T, o Object, port int64) {
	t.Helper()
	ports, _ := container(t, o)["ports"].([]any)
	for _, p := range ports {
		pm := p.(map[string]any)
		if pm["name"] == "metrics" {
			if pm["containerPort"] != port {
				t.Errorf("%s: metrics port %v, want %d", o, pm["containerPort"], port)
			}
			return
		}
	}
	t.Errorf("%s: no container port named metrics", o)
}

func envFieldRefs(t *testing.T, o Object) map[string]string {
	t.Helper()
	refs := map[string]string{}
	for _, e := range container(t, o)["env"].([]any) {
		em := e.(map[string]any)
		if vf, ok := em["valueFrom"].(map[string]any); ok {
			if fr, ok := vf["fieldRef"].(map[string]any); ok {
				refs[em["name"].(string)] = fr["fieldPath"].(string)
			}
		}
	}
	return refs
}

// exporterJobRegex is the job matcher of the GPUSliceExporterDown alert, read
// from the rule file so the chart's job names are checked against the rule
// that depends on them.
func exporterJobRegex(t *testing.T) *regexp.Regexp {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "alerts", "gpuslice-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "GPUSliceExporterDown" {
				continue
			}
			m := regexp.MustCompile(`job=~"([^"]+)"`).FindStringSubmatch(r.Expr)
			if m == nil {
				t.Fatalf("GPUSliceExporterDown expr %q has no job=~ matcher", r.Expr)
			}
			// PromQL regexes are anchored.
			return regexp.MustCompile("^(?:" + m[1] + ")$")
		}
	}
	t.Fatal("alerts/gpuslice-rules.yaml has no GPUSliceExporterDown alert")
	return nil
}

func TestRenderedWorkloads(t *testing.T) {
	h := helmBinary(t)
	sets := map[string]valueSet{}
	for _, vs := range valueSets() {
		sets[vs.name] = vs
	}

	t.Run("exporter", func(t *testing.T) {
		objs := render(t, h, sets["default"])
		ds := find(t, objs, "DaemonSet", "gpuslice-exporter")
		if !nested[bool](t, ds, "spec", "template", "spec", "hostPID") {
			t.Errorf("%s: hostPID is not true", ds)
		}
		c := container(t, ds)
		if got := strs(c["command"]); !slices.Equal(got, []string{"gpuslice-exporter"}) {
			t.Errorf("%s: command %v", ds, got)
		}
		if got, want := c["image"], "ghcr.io/gpuslice/gpuslice:"+appVersion(t); got != want {
			t.Errorf("%s: image %v, want %s", ds, got, want)
		}
		args := strs(c["args"])
		for _, want := range []string{
			"--web.listen-address=:9846", "--path.procfs=/host/proc",
			"--kubelet.pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
			"--path.pod-logs=/var/log/pods", "--pods.source=apiserver",
		} {
			if !slices.Contains(args, want) {
				t.Errorf("%s: args %v lack %s", ds, args, want)
			}
		}
		checkHostMount(t, ds, "/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources", true)
		checkHostMount(t, ds, "/var/log/pods", "/var/log/pods", true)
		checkHostMount(t, ds, "/host/proc", "/proc", true)
		if diff := cmp.Diff(map[string]string{"NODE_NAME": "spec.nodeName", "NODE_IP": "status.hostIP"}, envFieldRefs(t, ds)); diff != "" {
			t.Errorf("%s: downward-API env (-want +got):\n%s", ds, diff)
		}
		if got := nested[map[string]any](t, ds, "spec", "template", "spec", "nodeSelector"); !cmp.Equal(got, map[string]any{"nvidia.com/gpu.present": "true"}) {
			t.Errorf("%s: nodeSelector %v", ds, got)
		}
		if _, ok, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "runtimeClassName"); ok {
			t.Errorf("%s: runtimeClassName set by default", ds)
		}
		// An exporter left Pending on a full node is a node the tuner
		// cannot see.
		if got, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "priorityClassName"); got != "system-node-critical" {
			t.Errorf("%s: priorityClassName %q, want system-node-critical", ds, got)
		}
		checkLocked(t, ds)
		checkPort(t, ds, 9846)
		// The kubelet restarts an exporter whose NVML broke: /healthz says so.
		if got, _, _ := unstructured.NestedString(c, "livenessProbe", "httpGet", "path"); got != "/healthz" {
			t.Errorf("%s: liveness probe path %q, want /healthz", ds, got)
		}
		if !slices.Contains(args, "--healthz.gpu-failure-threshold=3") {
			t.Errorf("%s: args %v lack --healthz.gpu-failure-threshold=3", ds, args)
		}
		// Older k3s kills nvidia-runtime pods that are not Guaranteed.
		req, _, _ := unstructured.NestedMap(c, "resources", "requests")
		lim, _, _ := unstructured.NestedMap(c, "resources", "limits")
		if len(req) != 2 || !cmp.Equal(req, lim) {
			t.Errorf("%s: requests %v, limits %v; want cpu and memory requests equal to limits", ds, req, lim)
		}
		cr := find(t, objs, "ClusterRole", "gpuslice-exporter")
		if !slices.Contains(args, "--dra.resource-slices=true") {
			t.Errorf("%s: args %v lack --dra.resource-slices=true", ds, args)
		}
		if diff := cmp.Diff([]any{
			map[string]any{"apiGroups": []any{""}, "resources": []any{"pods"}, "verbs": []any{"get", "list", "watch"}},
			map[string]any{"apiGroups": []any{"resource.k8s.io"}, "resources": []any{"resourceslices"}, "verbs": []any{"get", "list", "watch"}},
		}, nested[[]any](t, cr, "rules")); diff != "" {
			t.Errorf("%s rules (-want +got):\n%s", cr, diff)
		}
	})

	t.Run("exporter without DRA", func(t *testing.T) {
		objs := render(t, h, valueSet{name: "no-dra", release: "gpuslice", namespace: "gpuslice", args: []string{"--set", "exporter.dra.enabled=false"}})
		ds := find(t, objs, "DaemonSet", "gpuslice-exporter")
		if args := strs(container(t, ds)["args"]); !slices.Contains(args, "--dra.resource-slices=false") {
			t.Errorf("%s: args %v lack --dra.resource-slices=false", ds, args)
		}
		cr := find(t, objs, "ClusterRole", "gpuslice-exporter")
		if diff := cmp.Diff([]any{map[string]any{"apiGroups": []any{""}, "resources": []any{"pods"}, "verbs": []any{"get", "list", "watch"}}}, nested[[]any](t, cr, "rules")); diff != "" {
			t.Errorf("%s rules (-want +got):\n%s", cr, diff)
		}
		// Pod names from nowhere and no DRA: the exporter reads no API.
		objs = render(t, h, valueSet{name: "no-api", release: "gpuslice", namespace: "gpuslice",
			args: []string{"--set", "exporter.dra.enabled=false", "--set", "exporter.podsSource=none"}})
		for _, o := range objs {
			if o.GetKind() == "ClusterRole" && o.GetName() == "gpuslice-exporter" {
				t.Errorf("a ClusterRole for an exporter that reads no API: %v", o.Object["rules"])
			}
		}
	})

	t.Run("exporter with kubelet pods, k3s paths and overrides", func(t *testing.T) {
		objs := render(t, h, sets["kubelet-pods-config-manager"])
		ds := find(t, objs, "DaemonSet", "kcm-gpuslice-exporter")
		args := strs(container(t, ds)["args"])
		for _, want := range []string{"--pods.source=kubelet", "--kubelet.insecure-skip-tls-verify", "--web.config.file=/etc/gpuslice/web/web-config.yaml", "--oom.pattern=CUDA error: out of memory"} {
			if !slices.Contains(args, want) {
				t.Errorf("%s: args %v lack %s", ds, args, want)
			}
		}
		if got := container(t, ds)["image"]; !strings.HasPrefix(fmt.Sprint(got), "ghcr.io/gpuslice/gpuslice@sha256:") {
			t.Errorf("%s: image %v, want the digest", ds, got)
		}
		if got := nested[map[string]any](t, ds, "spec", "template", "spec", "nodeSelector"); !cmp.Equal(got, map[string]any{"gpu": "rtx-a6000"}) {
			t.Errorf("%s: nodeSelector %v, want only gpu=rtx-a6000", ds, got)
		}
		cr := find(t, objs, "ClusterRole", "kcm-gpuslice-exporter")
		if got := strs(nested[[]any](t, cr, "rules")[0].(map[string]any)["resources"]); !slices.Equal(got, []string{"nodes/pods", "nodes/proxy"}) {
			t.Errorf("%s: resources %v", cr, got)
		}
		find(t, objs, "Secret", "kcm-gpuslice-exporter-web-config")
	})

	t.Run("runtime class", func(t *testing.T) {
		objs := render(t, h, sets["k3s-runtimeclass"])
		ds := find(t, objs, "DaemonSet", "k3s-gpuslice-exporter")
		if got := nested[string](t, ds, "spec", "template", "spec", "runtimeClassName"); got != "nvidia" {
			t.Errorf("%s: runtimeClassName %q", ds, got)
		}
	})

	t.Run("tuner", func(t *testing.T) {
		objs := render(t, h, sets["default"])
		d := find(t, objs, "Deployment", "gpuslice-tuner")
		c := container(t, d)
		if got := strs(c["command"]); !slices.Equal(got, []string{"gpuslice-tuner"}) {
			t.Errorf("%s: command %v", d, got)
		}
		if got := strs(c["args"]); !slices.Equal(got[:2], []string{"run", "--config=/etc/gpuslice/tuner.yaml"}) {
			t.Errorf("%s: args %v", d, got)
		}
		mounts, _ := mountsOf(t, d)
		if m := mounts["/etc/gpuslice"]; m.Name != "config" {
			t.Errorf("%s: /etc/gpuslice mounts %q", d, m.Name)
		}
		if cfg := tunerConfig(t, objs, sets["default"]); cfg.Apply.Mode != config.ModeRestart || cfg.Apply.Key != "config.yaml" ||
			cfg.Apply.ConfigMap.String() != "kube-system/nvidia-device-plugin-config" || cfg.Apply.DaemonSet.String() != "kube-system/nvidia-device-plugin-daemonset" {
			t.Errorf("default tuner.yaml apply %+v, want restart mode on NVIDIA's static DaemonSet in kube-system", cfg.Apply)
		}
		checkLocked(t, d)
		checkPort(t, d, 9847)
		role := find(t, objs, "Role", "gpuslice-tuner-device-plugin")
		if role.GetNamespace() != "kube-system" {
			t.Errorf("%s: namespace %q, want kube-system", role, role.GetNamespace())
		}

		objs = render(t, h, sets["kubelet-pods-config-manager"])
		d = find(t, objs, "Deployment", "kcm-gpuslice-tuner")
		if got := nested[int64](t, d, "spec", "replicas"); got != 2 {
			t.Errorf("%s: replicas %d", d, got)
		}
		nested[map[string]any](t, d, "spec", "template", "spec", "affinity", "podAntiAffinity")
		cfg := tunerConfig(t, objs, sets["kubelet-pods-config-manager"])
		if cfg.Policy.MaxReplicas != 6 || cfg.Policy.MinReplicas != 1 {
			t.Errorf("policy %+v, want maxReplicas 6 from tuner.config and minReplicas 1 from values.yaml", cfg.Policy)
		}
		if cfg.Apply.ConfigMap.String() != "nvidia-device-plugin/nvidia-device-plugin-config" || cfg.Apply.Key != "default" {
			t.Errorf("apply %+v, want the ConfigMap in nvidia-device-plugin and key default", cfg.Apply)
		}
	})

	t.Run("plugin", func(t *testing.T) {
		if objs := render(t, h, sets["default"]); len(slices.DeleteFunc(kinds(objs, "DaemonSet"), func(o Object) bool { return !strings.HasSuffix(o.GetName(), "-plugin") })) != 0 {
			t.Errorf("the plugin DaemonSet is rendered by default")
		}
		objs := render(t, h, sets["plugin"])
		ds := find(t, objs, "DaemonSet", "gp-gpuslice-plugin")
		if got := strs(container(t, ds)["command"]); !slices.Equal(got, []string{"gpuslice-plugin"}) {
			t.Errorf("%s: command %v", ds, got)
		}
		checkHostMount(t, ds, "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins", false)
		checkLocked(t, ds)
		checkPort(t, ds, 9848)
		cm := find(t, objs, "ConfigMap", "gp-gpuslice-plugin-config")
		if !strings.Contains(nested[string](t, cm, "data", "default"), "replicas: 4") {
			t.Errorf("%s: default config %q", cm, nested[string](t, cm, "data", "default"))
		}
		role := find(t, objs, "Role", "gp-gpuslice-plugin")
		if got := strs(nested[[]any](t, role, "rules")[0].(map[string]any)["resourceNames"]); !slices.Equal(got, []string{"gp-gpuslice-plugin-config"}) {
			t.Errorf("%s: resourceNames %v", role, got)
		}
	})

	t.Run("plugin CDI strategy, exporter RuntimeClass for DRA nodes", func(t *testing.T) {
		vs := sets["plugin"]
		vs.args = slices.Concat(vs.args, []string{"--set", "plugin.deviceListStrategy=cdi-cri", "--set", "plugin.deviceIDStrategy=index",
			"--set", "runtimeClassName=nvidia", "--set", "exporter.runtimeClassName=nvidia-cdi"})
		objs := render(t, h, vs)
		cm := find(t, objs, "ConfigMap", "gp-gpuslice-plugin-config")
		f, err := dpconfig.Parse([]byte(nested[string](t, cm, "data", "default")))
		if err != nil {
			t.Fatalf("%s: the rendered config does not parse: %v", cm, err)
		}
		c := f.Config()
		if !slices.Equal(c.DeviceListStrategy, []string{"cdi-cri"}) || c.DeviceIDStrategy != "index" || len(c.Resources) != 1 || c.Resources[0].Replicas != 4 {
			t.Errorf("%s: config %+v, want cdi-cri, index and the 4 replicas kept", cm, c)
		}
		for name, want := range map[string]string{"gp-gpuslice-exporter": "nvidia-cdi", "gp-gpuslice-plugin": "nvidia"} {
			if got := nested[string](t, find(t, objs, "DaemonSet", name), "spec", "template", "spec", "runtimeClassName"); got != want {
				t.Errorf("%s: runtimeClassName %q, want %q", name, got, want)
			}
		}
		vs.args = slices.Concat(vs.args, []string{"--set", "exporter.runtimeClassName="})
		ds := find(t, render(t, h, vs), "DaemonSet", "gp-gpuslice-exporter")
		if got, ok, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "runtimeClassName"); ok {
			t.Errorf("%s: runtimeClassName %q with exporter.runtimeClassName empty, want none", ds, got)
		}
	})

	t.Run("MPS control daemon and plugin", func(t *testing.T) {
		for _, name := range []string{"default", "plugin"} {
			for _, ds := range kinds(render(t, h, sets[name]), "DaemonSet") {
				if isMPSDaemon(ds) {
					t.Errorf("value set %s renders %s; MPS is off by default", name, ds)
				}
			}
		}
		objs := render(t, h, sets["mps"])
		ds := find(t, objs, "DaemonSet", "mps-gpuslice-mps-control-daemon")
		if !nested[bool](t, ds, "spec", "template", "spec", "hostPID") {
			t.Errorf("%s: hostPID is not true", ds)
		}
		c := container(t, ds)
		script := strings.Join(strs(c["args"]), "\n")
		for _, want := range []string{"nvidia-cuda-mps-control -d", "CUDA_MPS_PIPE_DIRECTORY=/mps/$res/pipe", "CUDA_MPS_LOG_DIRECTORY=/mps/$res/log",
			"touch /mps/$0/.started", "nvidia-smi -c EXCLUSIVE_PROCESS", "echo quit | nvidia-cuda-mps-control"} {
			if !strings.Contains(script, want) {
				t.Errorf("%s: script lacks %q:\n%s", ds, want, script)
			}
		}
		checkMPSScriptStarts(t, script)
		for _, probe := range []string{"livenessProbe", "readinessProbe"} {
			cmd, _, _ := unstructured.NestedSlice(c, probe, "exec", "command")
			if !strings.Contains(strings.Join(strs(cmd), " "), "get_default_active_thread_percentage") {
				t.Errorf("%s: %s %v does not ask the control daemon", ds, probe, cmd)
			}
		}
		env := map[string]string{}
		envs, _, _ := unstructured.NestedSlice(c, "env")
		for _, e := range envs {
			m := e.(map[string]any)
			env[fmt.Sprint(m["name"])] = fmt.Sprint(m["value"])
		}
		if env["MPS_RESOURCES"] != "nvidia.com/gpu" || env["NVIDIA_DRIVER_CAPABILITIES"] != "compute,utility" {
			t.Errorf("%s: env %v", ds, env)
		}
		checkHostMount(t, ds, "/mps", "/run/nvidia/mps", false)
		checkHostMount(t, ds, "/dev/shm", "/run/nvidia/mps/shm", false)
		plugin := find(t, objs, "DaemonSet", "mps-gpuslice-plugin")
		if args := strs(container(t, plugin)["args"]); !slices.Contains(args, "--mps-root=/run/nvidia/mps") {
			t.Errorf("%s: args %v lack --mps-root=/run/nvidia/mps", plugin, args)
		}
		checkHostMount(t, plugin, "/run/nvidia/mps", "/run/nvidia/mps", true)
		checkLocked(t, plugin)
		// The exporter reads MPS clients' limits from their environ: another
		// uid's needs CAP_SYS_PTRACE, added to what it drops, only with MPS.
		for name, want := range map[string][]any{"mps": {"SYS_PTRACE"}, "plugin": nil} {
			exp := find(t, render(t, h, sets[name]), "DaemonSet", map[string]string{"mps": "mps", "plugin": "gp"}[name]+"-gpuslice-exporter")
			sc := container(t, exp)["securityContext"].(map[string]any)
			caps := sc["capabilities"].(map[string]any)
			if add, _ := caps["add"].([]any); !slices.Equal(add, want) || fmt.Sprint(caps["drop"]) != "[ALL]" {
				t.Errorf("value set %s: %s capabilities %v, want drop [ALL], add %v", name, exp, caps, want)
			}
		}
		cm := find(t, objs, "ConfigMap", "mps-gpuslice-plugin-config")
		f, err := dpconfig.Parse([]byte(nested[string](t, cm, "data", "default")))
		if err != nil || !f.Config().MPS || f.Config().MPSSharing.Replicas() != 4 {
			t.Errorf("%s: config %q does not share through MPS: %v", cm, nested[string](t, cm, "data", "default"), err)
		}
	})

	// Every Service selects its workload's pods and has the port the
	// monitors name.
	t.Run("services select their pods", func(t *testing.T) {
		objs := render(t, h, sets["plugin"])
		for _, svc := range kinds(objs, "Service") {
			sel := nested[map[string]any](t, svc, "spec", "selector")
			matched := 0
			for _, w := range slices.Concat(kinds(objs, "DaemonSet"), kinds(objs, "Deployment")) {
				labels := nested[map[string]any](t, w, "spec", "template", "metadata", "labels")
				all := true
				for k, v := range sel {
					all = all && labels[k] == v
				}
				if all {
					matched++
				}
			}
			if matched != 1 {
				t.Errorf("%s selects the pods of %d workloads, want 1", svc, matched)
			}
		}
	})
}

func TestRenderedMonitoring(t *testing.T) {
	h := helmBinary(t)
	sets := map[string]valueSet{}
	for _, vs := range valueSets() {
		sets[vs.name] = vs
	}
	jobRe := exporterJobRegex(t)
	nodeRelabel := map[string]any{"action": "replace", "sourceLabels": []any{"__meta_kubernetes_pod_node_name"}, "targetLabel": "node"}
	podLabelsDrop := map[string]any{"action": "labeldrop", "regex": "namespace|pod|container"}

	checkRelabel := func(t *testing.T, o Object, endpoints string) {
		t.Helper()
		eps := nested[[]any](t, o, "spec", endpoints)
		relabels, _ := eps[0].(map[string]any)["relabelings"].([]any)
		hasNode := slices.ContainsFunc(relabels, func(r any) bool { return cmp.Equal(r, nodeRelabel) })
		wantNode := !strings.HasSuffix(o.GetName(), "-tuner")
		if hasNode != wantNode {
			t.Errorf("%s: node relabel present=%v, want %v (relabelings %v)", o, hasNode, wantNode, relabels)
		}
		// Every component's own namespace/pod/container labels (the
		// exporter's containers, the tuner's DRA advice) keep their names.
		if !slices.ContainsFunc(relabels, func(r any) bool { return cmp.Equal(r, podLabelsDrop) }) {
			t.Errorf("%s: relabelings %v do not drop the target's namespace/pod/container", o, relabels)
		}
	}

	t.Run("servicemonitors", func(t *testing.T) {
		objs := render(t, h, sets["servicemonitors-rules-dashboards"])
		sms := kinds(objs, "ServiceMonitor")
		if len(sms) != 3 {
			t.Fatalf("%d ServiceMonitors, want exporter, tuner and plugin", len(sms))
		}
		for _, sm := range sms {
			checkRelabel(t, sm, "endpoints")
			if sm.GetLabels()["release"] != "kube-prometheus-stack" {
				t.Errorf("%s: labels %v lack release", sm, sm.GetLabels())
			}
			// The job is the name of the Service the monitor selects.
			sel := nested[map[string]any](t, sm, "spec", "selector", "matchLabels")
			var services []string
			for _, svc := range kinds(objs, "Service") {
				labels := svc.GetLabels()
				all := true
				for k, v := range sel {
					all = all && labels[k] == v
				}
				if all {
					services = append(services, svc.GetName())
				}
			}
			if len(services) != 1 {
				t.Fatalf("%s selects Services %v, want one", sm, services)
			}
			isExporter := strings.HasSuffix(sm.GetName(), "-exporter")
			if jobRe.MatchString(services[0]) != isExporter {
				t.Errorf("%s: job %q matches the exporter-down alert's %s: %v, want %v", sm, services[0], jobRe, !isExporter, isExporter)
			}
		}
	})

	t.Run("podmonitors", func(t *testing.T) {
		vs := sets["podmonitors"]
		pms := kinds(render(t, h, vs), "PodMonitor")
		if len(pms) != 3 {
			t.Fatalf("%d PodMonitors, want exporter, tuner and plugin", len(pms))
		}
		for _, pm := range pms {
			checkRelabel(t, pm, "podMetricsEndpoints")
			job := vs.namespace + "/" + pm.GetName()
			isExporter := strings.HasSuffix(pm.GetName(), "-exporter")
			if jobRe.MatchString(job) != isExporter {
				t.Errorf("%s: job %q matches the exporter-down alert's %s: %v, want %v", pm, job, jobRe, !isExporter, isExporter)
			}
		}
	})

	t.Run("prometheusrule is the rule file", func(t *testing.T) {
		objs := render(t, h, sets["servicemonitors-rules-dashboards"])
		pr := find(t, objs, "PrometheusRule", "mon-gpuslice")
		data, err := os.ReadFile(filepath.Join(repoRoot(t), "alerts", "gpuslice-rules.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var want map[string]any
		if err := yaml.Unmarshal(data, &want); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, nested[map[string]any](t, pr, "spec")); diff != "" {
			t.Errorf("%s spec differs from alerts/gpuslice-rules.yaml (-file +rendered):\n%s", pr, diff)
		}
	})

	t.Run("dashboards", func(t *testing.T) {
		objs := render(t, h, sets["servicemonitors-rules-dashboards"])
		sources, err := filepath.Glob(filepath.Join(repoRoot(t), "dashboards", "*.json"))
		if err != nil {
			t.Fatal(err)
		}
		found := map[string]bool{}
		for _, cm := range kinds(objs, "ConfigMap") {
			if cm.GetLabels()["grafana_dashboard"] != "1" {
				continue
			}
			if cm.GetNamespace() != "monitoring" || cm.GetAnnotations()["grafana_folder"] != "GPU" {
				t.Errorf("%s: namespace %q annotations %v", cm, cm.GetNamespace(), cm.GetAnnotations())
			}
			for key, v := range nested[map[string]any](t, cm, "data") {
				want, err := os.ReadFile(filepath.Join(repoRoot(t), "dashboards", key))
				if err != nil {
					t.Errorf("%s: key %s is no file of dashboards/: %v", cm, key, err)
					continue
				}
				if v != string(want) {
					t.Errorf("%s: %s differs from dashboards/%s", cm, key, key)
				}
				found[key] = true
			}
		}
		for _, s := range sources {
			if !found[filepath.Base(s)] {
				t.Errorf("dashboards/%s is in no ConfigMap labelled grafana_dashboard=1", filepath.Base(s))
			}
		}
	})

	t.Run("off by default", func(t *testing.T) {
		for _, o := range render(t, h, sets["default"]) {
			if o.GetAPIVersion() == "monitoring.coreos.com/v1" || o.GetLabels()["grafana_dashboard"] != "" {
				t.Errorf("%s rendered by default", o)
			}
		}
	})
}

// apiServer is a real kube-apiserver with the monitoring CRDs installed.
type apiServer struct {
	env    *testenv.Env
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func startAPIServer(t *testing.T) *apiServer {
	t.Helper()
	env := testenv.Start(t)
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	a := &apiServer{env: env, dyn: dyn}
	data, err := os.ReadFile(filepath.Join("testdata", "monitoring-crds.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crds, err := Objects(data)
	if err != nil {
		t.Fatalf("testdata/monitoring-crds.yaml: %v", err)
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, crd := range crds {
		if _, err := dyn.Resource(crdGVR).Create(t.Context(), crd.Unstructured, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("installing CRD %s: %v", crd.GetName(), err)
		}
	}
	// Poll until the API server serves all three kinds.
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		groups, err := restmapper.GetAPIGroupResources(dc)
		if err == nil {
			a.mapper = restmapper.NewDiscoveryRESTMapper(groups)
			ok := true
			for _, kind := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"} {
				_, err := a.mapper.RESTMapping(schema.GroupKind{Group: "monitoring.coreos.com", Kind: kind}, "v1")
				ok = ok && err == nil
			}
			if ok {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API server does not serve the monitoring.coreos.com kinds 30s after installing their CRDs (last error %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return a
}

// ensureNamespace creates ns unless it exists (kube-system does; the API
// server may still be creating it right after start).
func (a *apiServer) ensureNamespace(t *testing.T, ns string) {
	t.Helper()
	_, err := a.env.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("namespace %s: %v", ns, err)
	}
}

// create sends o to the API server with strict field validation, as a
// server-side dry run when dryRun is set.
func (a *apiServer) create(ctx context.Context, o Object, dryRun bool) error {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("the API server does not serve %s: %w", gvk, err)
	}
	opts := metav1.CreateOptions{FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var r dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if o.GetNamespace() == "" {
			return errors.New("namespaced object without metadata.namespace (the manifests must apply in any current namespace)")
		}
		r = a.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	} else if o.GetNamespace() != "" {
		return fmt.Errorf("cluster-scoped object with metadata.namespace %q", o.GetNamespace())
	}
	_, err = r.Create(ctx, o.Unstructured, opts)
	return err
}

func (a *apiServer) namespaces(t *testing.T, objs []Object) {
	t.Helper()
	seen := map[string]bool{}
	for _, o := range objs {
		if ns := o.GetNamespace(); ns != "" && !seen[ns] {
			seen[ns] = true
			a.ensureNamespace(t, ns)
		}
	}
}

// TestAPIServer sends every object the chart renders, for every value set and
// every committed manifest, to a real kube-apiserver as a server-side dry run
// with strict field validation; then installs two releases for real and asks
// the API server's RBAC authorizer what each component's ServiceAccount may
// do.
func TestAPIServer(t *testing.T) {
	h := helmBinary(t)
	a := startAPIServer(t)

	// The checks can fail: the API server rejects a misspelt field, and the
	// monitoring CRDs reject a monitor the operator would.
	t.Run("negative controls", func(t *testing.T) {
		a.ensureNamespace(t, "controls")
		bad := []string{
			`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: typo, namespace: controls}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      hostPid: true
      containers: [{name: c, image: i}]`,
			`apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: bad-action, namespace: controls}
spec:
  selector: {matchLabels: {a: b}}
  endpoints: [{port: metrics, relabelings: [{action: rename, targetLabel: node}]}]`,
			`apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata: {name: bad-interval, namespace: controls}
spec:
  selector: {matchLabels: {a: b}}
  podMetricsEndpoints: [{port: metrics, interval: 15 seconds}]`,
			`apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: no-expr, namespace: controls}
spec:
  groups: [{name: g, rules: [{alert: A, for: 5m}]}]`,
		}
		for _, doc := range bad {
			objs, err := Objects([]byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			err = a.create(t.Context(), objs[0], true)
			if err == nil {
				t.Errorf("%s was accepted; the dry run would not catch a broken chart", objs[0])
				continue
			}
			t.Logf("%s rejected as it should be: %v", objs[0], err)
		}
	})

	for _, vs := range valueSets() {
		t.Run("dry-run/"+vs.name, func(t *testing.T) {
			objs := render(t, h, vs)
			a.namespaces(t, objs)
			for _, o := range objs {
				if err := a.create(t.Context(), o, true); err != nil {
					t.Errorf("%s rejected: %v", o, err)
				}
			}
		})
	}
	for _, m := range Manifests() {
		t.Run("dry-run/manifests/"+m.File, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "manifests", m.File))
			if err != nil {
				t.Fatalf("%v (run `make manifests`)", err)
			}
			objs, err := Objects(data)
			if err != nil {
				t.Fatal(err)
			}
			a.namespaces(t, objs)
			for _, o := range objs {
				if err := a.create(t.Context(), o, true); err != nil {
					t.Errorf("deploy/manifests/%s: %s rejected: %v", m.File, o, err)
				}
			}
		})
	}

	t.Run("rbac", func(t *testing.T) {
		sets := map[string]valueSet{}
		for _, vs := range valueSets() {
			sets[vs.name] = vs
		}
		for _, name := range []string{"default", "plugin"} {
			objs := render(t, h, sets[name])
			a.namespaces(t, objs)
			for _, o := range objs {
				if err := a.create(t.Context(), o, false); err != nil {
					t.Fatalf("installing %s: %v", o, err)
				}
			}
		}
		type access struct {
			sa                                     string // namespace/name
			verb, group, resource, namespace, name string
			allowed                                bool
		}
		tests := []access{
			// default: release gpuslice in gpuslice, tuner in restart mode.
			{"gpuslice/gpuslice-exporter", "list", "", "pods", "", "", true},
			{"gpuslice/gpuslice-exporter", "watch", "", "pods", "", "", true},
			{"gpuslice/gpuslice-exporter", "get", "", "nodes/proxy", "", "n1", false},
			{"gpuslice/gpuslice-exporter", "get", "", "secrets", "gpuslice", "", false},
			{"gpuslice/gpuslice-tuner", "patch", "apps", "daemonsets", "kube-system", "nvidia-device-plugin-daemonset", true},
			{"gpuslice/gpuslice-tuner", "patch", "apps", "daemonsets", "kube-system", "kube-proxy", false},
			{"gpuslice/gpuslice-tuner", "update", "", "configmaps", "kube-system", "nvidia-device-plugin-config", true},
			{"gpuslice/gpuslice-tuner", "watch", "", "configmaps", "kube-system", "nvidia-device-plugin-config", true},
			{"gpuslice/gpuslice-tuner", "update", "", "configmaps", "kube-system", "coredns", false},
			{"gpuslice/gpuslice-tuner", "create", "coordination.k8s.io", "leases", "gpuslice", "", true},
			{"gpuslice/gpuslice-tuner", "update", "coordination.k8s.io", "leases", "gpuslice", "gpuslice-tuner", true},
			{"gpuslice/gpuslice-tuner", "update", "coordination.k8s.io", "leases", "kube-system", "gpuslice-tuner", false},
			{"gpuslice/gpuslice-tuner", "update", "coordination.k8s.io", "leases", "gpuslice", "other", false},
			{"gpuslice/gpuslice-tuner", "list", "", "nodes", "", "", true},
			// The tuner records its decision on the Node in every mode, with
			// a patch (internal/tuner/controller's updateNode); found missing
			// by TestHelmInstall on the real node. Never a whole-object update.
			{"gpuslice/gpuslice-tuner", "patch", "", "nodes", "", "n1", true},
			{"gpuslice/gpuslice-tuner", "update", "", "nodes", "", "n1", false},
			{"gpuslice/gpuslice-tuner", "update", "apps", "daemonsets", "kube-system", "nvidia-device-plugin-daemonset", false},
			{"gpuslice/gpuslice-tuner", "create", "", "events", "default", "", true},
			{"gpuslice/gpuslice-tuner", "get", "", "secrets", "kube-system", "", false},
			// Pending pods in every namespace are demand; exporter discovery.
			{"gpuslice/gpuslice-tuner", "list", "", "pods", "gpuslice", "", true},
			{"gpuslice/gpuslice-tuner", "list", "", "pods", "kube-system", "", true},
			{"gpuslice/gpuslice-tuner", "list", "", "pods", "", "", true},
			{"gpuslice/gpuslice-tuner", "watch", "", "pods", "", "", true},
			// get: the owner of a measured pod names its workload.
			{"gpuslice/gpuslice-tuner", "get", "", "pods", "kube-system", "p", true},
			{"gpuslice/gpuslice-tuner", "delete", "", "pods", "gpuslice", "p", false},
			{"gpuslice/gpuslice-tuner", "update", "", "pods", "gpuslice", "p", false},
			// The workload memory: one ConfigMap in the release namespace.
			{"gpuslice/gpuslice-tuner", "create", "", "configmaps", "gpuslice", "", true},
			{"gpuslice/gpuslice-tuner", "update", "", "configmaps", "gpuslice", "gpuslice-tuner-memory", true},
			{"gpuslice/gpuslice-tuner", "get", "", "configmaps", "gpuslice", "gpuslice-tuner-memory", true},
			{"gpuslice/gpuslice-tuner", "update", "", "configmaps", "gpuslice", "gpuslice-exporter-web-config", false},
			{"gpuslice/gpuslice-tuner", "create", "", "configmaps", "kube-system", "", false},
			// plugin: release gp in gpu-plugin, tuner in plugin mode.
			{"gpu-plugin/gp-gpuslice-tuner", "patch", "", "nodes", "", "n1", true},
			{"gpu-plugin/gp-gpuslice-tuner", "list", "", "pods", "", "", true},
			{"gpu-plugin/gp-gpuslice-tuner", "watch", "", "pods", "", "", true},
			{"gpu-plugin/gp-gpuslice-tuner", "update", "", "configmaps", "gpu-plugin", "gp-gpuslice-plugin-config", true},
			{"gpu-plugin/gp-gpuslice-tuner", "update", "", "configmaps", "kube-system", "nvidia-device-plugin-config", false},
			{"gpu-plugin/gp-gpuslice-tuner", "patch", "apps", "daemonsets", "kube-system", "nvidia-device-plugin-daemonset", false},
			{"gpu-plugin/gp-gpuslice-plugin", "watch", "", "configmaps", "gpu-plugin", "gp-gpuslice-plugin-config", true},
			{"gpu-plugin/gp-gpuslice-plugin", "get", "", "configmaps", "gpu-plugin", "gp-gpuslice-tuner", false},
			{"gpu-plugin/gp-gpuslice-plugin", "update", "", "configmaps", "gpu-plugin", "gp-gpuslice-plugin-config", false},
			{"gpu-plugin/gp-gpuslice-plugin", "watch", "", "nodes", "", "", true},
			{"gpu-plugin/gp-gpuslice-plugin", "patch", "", "nodes", "", "n1", false},
			{"gpu-plugin/gp-gpuslice-plugin", "create", "", "events", "default", "", true},
		}
		for _, tc := range tests {
			ns, sa, _ := strings.Cut(tc.sa, "/")
			name := fmt.Sprintf("%s %s %s/%s %s/%s", tc.sa, tc.verb, tc.group, tc.resource, tc.namespace, tc.name)
			resource, sub, _ := strings.Cut(tc.resource, "/")
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   "system:serviceaccount:" + ns + ":" + sa,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: tc.verb, Group: tc.group, Resource: resource, Subresource: sub,
					Namespace: tc.namespace, Name: tc.name,
				},
			}}
			got, err := a.env.Client.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got.Status.Allowed != tc.allowed {
				t.Errorf("%s: allowed=%v, want %v (%s)", name, got.Status.Allowed, tc.allowed, got.Status.Reason)
			}
		}
	})
}

// tunerConfig renders the tuner's ConfigMap and parses its tuner.yaml with
// the tuner's own parser.
func tunerConfig(t *testing.T, objs []Object, vs valueSet) config.Config {
	t.Helper()
	cm := find(t, objs, "ConfigMap", vs.fullname()+"-tuner")
	data := nested[string](t, cm, "data", "tuner.yaml")
	c, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatalf("value set %s: %s: the tuner rejects its tuner.yaml: %v\n%s", vs.name, cm, err, data)
	}
	return c
}

// fullname mirrors gpuslice.fullname for these value sets.
func (vs valueSet) fullname() string {
	if strings.Contains(vs.release, "gpuslice") {
		return vs.release
	}
	return vs.release + "-gpuslice"
}

// resourceNames returns the resourceNames of the rule of role granting verb
// on resource.
func resourceNames(t *testing.T, role Object, resource, verb string) []string {
	t.Helper()
	for _, r := range nested[[]any](t, role, "rules") {
		rm := r.(map[string]any)
		if slices.Contains(strs(rm["resources"]), resource) && slices.Contains(strs(rm["verbs"]), verb) {
			if rm["resourceNames"] == nil {
				return nil
			}
			return strs(rm["resourceNames"])
		}
	}
	t.Fatalf("%s grants no %s on %s", role, verb, resource)
	return nil
}

// TestTunerConfig checks that the tuner accepts the tuner.yaml the chart
// renders for every value set, and that the objects it names are the ones
// the RBAC rules (and gpuslice-plugin's flags) name.
func TestTunerConfig(t *testing.T) {
	h := helmBinary(t)
	for _, vs := range valueSets() {
		t.Run(vs.name, func(t *testing.T) {
			objs := render(t, h, vs)
			c := tunerConfig(t, objs, vs)
			if c.Apply.Mode != modeOf(vs) {
				t.Errorf("apply.mode %q, want %q", c.Apply.Mode, modeOf(vs))
			}
			// A plain install must not rewrite anyone's device-plugin config.
			if want := vs.set("tuner.config.dryRun", "true") == "true"; c.DryRun != want {
				t.Errorf("dryRun %v, want %v", c.DryRun, want)
			}
			// Nor evict a pod: the right to is granted with the option only.
			evict := vs.set("tuner.config.policy.evictCrashLoops", "false") == "true"
			if c.Policy.EvictCrashLoops != evict {
				t.Errorf("policy.evictCrashLoops %v, want %v", c.Policy.EvictCrashLoops, evict)
			}
			var granted []string
			for _, r := range nested[[]any](t, find(t, objs, "ClusterRole", vs.fullname()+"-tuner"), "rules") {
				if rm := r.(map[string]any); slices.Contains(strs(rm["resources"]), "pods/eviction") {
					granted = append(granted, strs(rm["verbs"])...)
				}
			}
			if want := []string{"create"}; evict != slices.Equal(granted, want) || (!evict && granted != nil) {
				t.Errorf("evictCrashLoops %v, the ClusterRole grants %v on pods/eviction", evict, granted)
			}
			dp := find(t, objs, "Role", vs.fullname()+"-tuner-device-plugin")
			if dp.GetNamespace() != c.Apply.ConfigMap.Namespace {
				t.Errorf("apply.configMap is in %s, the tuner's Role in %s", c.Apply.ConfigMap.Namespace, dp.GetNamespace())
			}
			if got := resourceNames(t, dp, "configmaps", "update"); !slices.Equal(got, []string{c.Apply.ConfigMap.Name}) {
				t.Errorf("apply.configMap %s, the Role lets the tuner update %v", c.Apply.ConfigMap, got)
			}
			if c.Apply.Mode == config.ModeRestart {
				if got := resourceNames(t, dp, "daemonsets", "patch"); !slices.Equal(got, []string{c.Apply.DaemonSet.Name}) || c.Apply.DaemonSet.Namespace != dp.GetNamespace() {
					t.Errorf("apply.daemonSet %s, the Role in %s lets the tuner patch %v", c.Apply.DaemonSet, dp.GetNamespace(), got)
				}
			}
			lease := find(t, objs, "Role", vs.fullname()+"-tuner")
			if got := resourceNames(t, lease, "leases", "update"); !slices.Equal(got, []string{c.LeaderElection.Name}) || lease.GetNamespace() != c.LeaderElection.Namespace {
				t.Errorf("leaderElection %s/%s, the Role in %s lets the tuner update %v", c.LeaderElection.Namespace, c.LeaderElection.Name, lease.GetNamespace(), got)
			}
			if m := c.WorkloadMemory.ConfigMap; m.Name == "" || m.Namespace != lease.GetNamespace() ||
				!slices.Equal(resourceNames(t, lease, "configmaps", "update"), []string{m.Name}) {
				t.Errorf("workloadMemory.configMap %s, the Role in %s lets the tuner update configmaps %v", m, lease.GetNamespace(), resourceNames(t, lease, "configmaps", "update"))
			}
			if c.Signals.Source == config.SourceExporters {
				ds := find(t, objs, "DaemonSet", vs.fullname()+"-exporter")
				sel, err := labels.Parse(c.Signals.Exporters.LabelSelector)
				if err != nil {
					t.Fatal(err)
				}
				podLabels := map[string]string{}
				for k, v := range nested[map[string]any](t, ds, "spec", "template", "metadata", "labels") {
					podLabels[k] = fmt.Sprint(v)
				}
				if !sel.Matches(labels.Set(podLabels)) || c.Signals.Exporters.Namespace != ds.GetNamespace() {
					t.Errorf("signals.exporters %s %q does not find the exporter pods (%s, labels %v)", c.Signals.Exporters.Namespace, sel, ds, podLabels)
				}
			}
			// Pending pods in every namespace are demand, the exporter pods
			// are found with the same rule, and a measured pod's owner names
			// its workload: get, list and watch of pods in the ClusterRole,
			// whatever the signal source, and no other.
			cr := find(t, objs, "ClusterRole", vs.fullname()+"-tuner")
			for _, verb := range []string{"list", "watch"} {
				if got := resourceNames(t, cr, "pods", verb); got != nil {
					t.Errorf("%s limits %s of pods to %v, want every pod", cr, verb, got)
				}
			}
			for _, r := range nested[[]any](t, cr, "rules") {
				rm := r.(map[string]any)
				if slices.Contains(strs(rm["resources"]), "pods") && !slices.Equal(strs(rm["verbs"]), []string{"get", "list", "watch"}) {
					t.Errorf("%s grants %v on pods, want get, list and watch", cr, strs(rm["verbs"]))
				}
			}
			for _, o := range objs {
				if o.GetKind() == "Role" && o.GetName() == vs.fullname()+"-tuner-exporters" {
					t.Errorf("%s: the ClusterRole already lets the tuner find the exporter pods", o)
				}
			}
			if c.Apply.Mode == config.ModePlugin {
				args := strs(container(t, find(t, objs, "DaemonSet", vs.fullname()+"-plugin"))["args"])
				for _, want := range []string{"--config.configmap=" + c.Apply.ConfigMap.String(), "--config.default=" + c.Apply.Key} {
					if !slices.Contains(args, want) {
						t.Errorf("gpuslice-plugin args %v lack %s: the plugin would not read what the tuner writes", args, want)
					}
				}
			}
		})
	}
	t.Run("a misspelt key fails", func(t *testing.T) {
		vs := valueSet{name: "typo", release: "gpuslice", namespace: "gpuslice", args: []string{"--set", "tuner.config.policy.maxReplica=4"}}
		cm := find(t, render(t, h, vs), "ConfigMap", "gpuslice-tuner")
		if _, err := config.Parse([]byte(nested[string](t, cm, "data", "tuner.yaml"))); !errors.Is(err, config.ErrInvalid) {
			t.Errorf("tuner.yaml with policy.maxReplica: want config.ErrInvalid, got %v", err)
		}
	})
}

func modeOf(vs valueSet) string {
	return vs.set("tuner.mode", config.ModeRestart)
}

// set returns the value vs sets key to with --set, or def.
func (vs valueSet) set(key, def string) string {
	v := def
	for i, a := range vs.args {
		if s, ok := strings.CutPrefix(a, key+"="); ok && i > 0 && vs.args[i-1] == "--set" {
			v = s
		}
	}
	return v
}

// TestProgramsAcceptRenderedArgs builds the three programs and runs each
// container's command line as rendered, with -h appended: Go's flag package
// parses the flags before -h and stops at the first it does not know, so
// the chart cannot pass a flag a program does not have.
func TestProgramsAcceptRenderedArgs(t *testing.T) {
	h := helmBinary(t)
	bin := t.TempDir()
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin+string(filepath.Separator), "./cmd/exporter", "./cmd/tuner", "./cmd/plugin")
	build.Dir = repoRoot(t)
	build.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/...: %v\n%s", err, out)
	}
	// go build names each binary after its directory.
	for _, name := range []string{"exporter", "tuner", "plugin"} {
		if err := os.Rename(filepath.Join(bin, name), filepath.Join(bin, "gpuslice-"+name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("an unknown flag fails", func(t *testing.T) {
		for _, command := range [][]string{{"gpuslice-exporter"}, {"gpuslice-plugin"}, {"gpuslice-tuner", "run"}} {
			out, err := exec.CommandContext(t.Context(), filepath.Join(bin, command[0]), append(command[1:], "--no-such-flag", "-h")...).CombinedOutput()
			if err == nil {
				t.Errorf("%v --no-such-flag -h succeeded; the check below would pass anything\n%s", command, out)
			}
		}
	})
	for _, vs := range valueSets() {
		for _, o := range render(t, h, vs) {
			if o.GetKind() != "DaemonSet" && o.GetKind() != "Deployment" || isMPSDaemon(o) {
				continue
			}
			t.Run(vs.name+"/"+o.GetName(), func(t *testing.T) {
				c := container(t, o)
				command := strs(c["command"])
				args := append(strs(c["args"]), "-h")
				cmd := exec.CommandContext(t.Context(), filepath.Join(bin, command[0]), append(command[1:], args...)...)
				cmd.Env = []string{"NODE_NAME=n1", "NODE_IP=10.0.0.1"}
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Errorf("%s %v: %v\n%s", command[0], args, err, out)
				}
			})
		}
	}
}

// mdLink is a markdown inline link's target; repoPath a code span naming a
// file of the repository from its root (`alerts/...`, `dashboards/*.json`).
var (
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	repoPath = regexp.MustCompile("`((?:alerts|cmd|dashboards|deploy|docs|hack|internal|test)/[^`\\s]*)`")
)

// staleRefs returns every relative link of the markdown doc (in directory
// docDir) and every repository path it names in a code span (from root)
// that matches no file.
func staleRefs(doc, docDir, root string) []string {
	var stale []string
	for _, m := range mdLink.FindAllStringSubmatch(doc, -1) {
		target, _, _ := strings.Cut(m[1], "#")
		if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		if _, err := os.Stat(filepath.Join(docDir, filepath.FromSlash(target))); err != nil {
			stale = append(stale, "link "+m[1])
		}
	}
	for _, m := range repoPath.FindAllStringSubmatch(doc, -1) {
		if found, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(m[1]))); err != nil || len(found) == 0 {
			stale = append(stale, "path "+m[1])
		}
	}
	return stale
}

// TestChartREADMELinks checks that the chart README's relative links and the
// repository files it names exist, so a moved file (the runbook went from
// alerts/RUNBOOK.md to docs/runbook.md) breaks the test, not the reader.
func TestChartREADMELinks(t *testing.T) {
	root := repoRoot(t)
	t.Run("a missing target is reported", func(t *testing.T) {
		doc := "see [runbook](../../../alerts/RUNBOOK.md), `alerts/RUNBOOK.md`, [site](https://example.com/x.md) and [values](values.yaml#L3)"
		want := []string{"link ../../../alerts/RUNBOOK.md", "path alerts/RUNBOOK.md"}
		if diff := cmp.Diff(want, staleRefs(doc, chartPath(t), root)); diff != "" {
			t.Errorf("staleRefs (-want +got):\n%s", diff)
		}
	})
	readme := filepath.Join(chartPath(t), "README.md")
	data, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(mdLink.FindAllString(string(data), -1)); n == 0 {
		t.Errorf("%s has no relative links; the check would pass anything", readme)
	}
	for _, s := range staleRefs(string(data), chartPath(t), root) {
		t.Errorf("%s: %s points at no file", readme, s)
	}
}

// underMount reports whether path lies in a directory the workload's
// container mounts.
func underMount(t *testing.T, o Object, path string) bool {
	t.Helper()
	mounts, _ := mountsOf(t, o)
	for dir := range mounts {
		if strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/") {
			return true
		}
	}
	return false
}

// TestScrapersMatchWebConfig renders the exporter behind TLS and basic auth
// (exporter.webConfig) and checks that both of its scrapers follow: the
// exporter's monitor scrapes over https with the TLS and auth settings given,
// the tuner's tuner.yaml (read by the tuner's own parser) says https with
// the CA and password, and every file either side names is mounted.
func TestScrapersMatchWebConfig(t *testing.T) {
	h := helmBinary(t)
	for _, tc := range []struct{ set, kind, endpoints string }{
		{"exporter-tls-servicemonitor", "ServiceMonitor", "endpoints"},
		{"exporter-tls-podmonitor", "PodMonitor", "podMetricsEndpoints"},
	} {
		t.Run(tc.set, func(t *testing.T) {
			i := slices.IndexFunc(valueSets(), func(vs valueSet) bool { return vs.name == tc.set })
			vs := valueSets()[i]
			objs := render(t, h, vs)

			ds := find(t, objs, "DaemonSet", vs.fullname()+"-exporter")
			if args := strs(container(t, ds)["args"]); !slices.Contains(args, "--web.config.file=/etc/gpuslice/web/web-config.yaml") {
				t.Errorf("%s: args %v lack --web.config.file", ds, args)
			}
			for _, f := range []string{"/etc/gpuslice/tls/tls.crt", "/etc/gpuslice/tls/tls.key"} {
				if !underMount(t, ds, f) {
					t.Errorf("%s: %s of the web config is in no mounted directory", ds, f)
				}
			}

			monitors := kinds(objs, tc.kind)
			if len(monitors) == 0 {
				t.Fatalf("no %s rendered", tc.kind)
			}
			for _, m := range monitors {
				ep := nested[[]any](t, m, "spec", tc.endpoints)[0].(map[string]any)
				if !strings.HasSuffix(m.GetName(), "-exporter") {
					// The tuner and plugin serve plain http here.
					if ep["scheme"] != nil || ep["tlsConfig"] != nil || ep["basicAuth"] != nil {
						t.Errorf("%s: endpoint %v has the exporter's scrape settings", m, ep)
					}
					continue
				}
				if ep["scheme"] != "https" {
					t.Errorf("%s: scheme %v, want https", m, ep["scheme"])
				}
				wantTLS := map[string]any{"ca": map[string]any{"secret": map[string]any{"name": "exporter-tls", "key": "ca.crt"}}, "serverName": "gpuslice-exporter"}
				if diff := cmp.Diff(wantTLS, ep["tlsConfig"]); diff != "" {
					t.Errorf("%s: tlsConfig (-want +got):\n%s", m, diff)
				}
				if ba, _ := ep["basicAuth"].(map[string]any); ba["username"] == nil || ba["password"] == nil {
					t.Errorf("%s: basicAuth %v, want username and password", m, ep["basicAuth"])
				}
				if ep["port"] != "metrics" || ep["relabelings"] == nil {
					t.Errorf("%s: endpoint %v lost the chart's port or relabelings", m, ep)
				}
			}

			c := tunerConfig(t, objs, vs)
			ex := c.Signals.Exporters
			if ex.Scheme != "https" {
				t.Errorf("tuner.yaml signals.exporters.scheme %q, want https", ex.Scheme)
			}
			tlsc := ex.HTTPClient.TLSConfig
			if tlsc.CAFile != "/etc/gpuslice-client/ca.crt" || tlsc.ServerName != "gpuslice-exporter" {
				t.Errorf("tuner.yaml signals.exporters.httpClient.tls_config %+v, want the CA file and server name", tlsc)
			}
			ba := ex.HTTPClient.BasicAuth
			if ba == nil || ba.Username != "prometheus" || ba.PasswordFile != "/etc/gpuslice-client/password" {
				t.Errorf("tuner.yaml signals.exporters.httpClient.basic_auth %+v, want prometheus and the password file", ba)
			}
			d := find(t, objs, "Deployment", vs.fullname()+"-tuner")
			for _, f := range []string{tlsc.CAFile, ba.PasswordFile} {
				if !underMount(t, d, f) {
					t.Errorf("%s: %s of tuner.yaml's httpClient is in no mounted directory", d, f)
				}
			}
		})
	}

	// With Prometheus as the tuner's source, the tuner does not scrape the
	// exporters and needs nothing.
	t.Run("tuner reading prometheus", func(t *testing.T) {
		args := []string{
			"--set", "exporter.webConfig.tls_server_config.cert_file=/c", "--set", "exporter.webConfig.tls_server_config.key_file=/k",
			"--set", "tuner.config.signals.source=prometheus", "--set", "tuner.config.signals.prometheus.url=http://prometheus:9090",
		}
		vs := valueSet{name: "prometheus-source", release: "gpuslice", namespace: "gpuslice", args: args}
		if c := tunerConfig(t, render(t, h, vs), vs); c.Signals.Source != config.SourcePrometheus {
			t.Errorf("signals.source %q, want prometheus", c.Signals.Source)
		}
	})
}

// dockerStage is one FROM of a Dockerfile with its instructions, each
// instruction (upper case) and the rest of its line.
type dockerStage struct {
	image, name string
	instrs      [][2]string
}

// parseDockerfile splits a Dockerfile into stages, joining continued lines,
// dropping comments, and putting the global ARG defaults into FROM.
func parseDockerfile(data string) ([]dockerStage, error) {
	var lines []string
	var cur strings.Builder
	for line := range strings.SplitSeq(data, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	if cur.Len() > 0 {
		return nil, errors.New("the last instruction ends in a line continuation")
	}
	args := map[string]string{}
	var stages []dockerStage
	for i, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		instr, rest = strings.ToUpper(instr), strings.TrimSpace(rest)
		switch {
		case instr == "FROM":
			f := strings.Fields(os.Expand(rest, func(k string) string { return args[k] }))
			s := dockerStage{image: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			stages = append(stages, s)
		case len(stages) == 0 && instr == "ARG":
			k, v, _ := strings.Cut(rest, "=")
			args[k] = v
		case len(stages) == 0:
			return nil, fmt.Errorf("instruction %d (%s) comes before the first FROM", i+1, instr)
		default:
			s := &stages[len(stages)-1]
			s.instrs = append(s.instrs, [2]string{instr, rest})
		}
	}
	return stages, nil
}

// all returns the arguments of every instr of s.
func (s dockerStage) all(instr string) []string {
	var out []string
	for _, in := range s.instrs {
		if in[0] == instr {
			out = append(out, in[1])
		}
	}
	return out
}

// vars returns the KEY=value pairs of the stage's ENV, ARG or LABEL
// instructions (values unquoted, ${ARG} expanded with the stage's ARG
// defaults).
func (s dockerStage) vars(instr string) map[string]string {
	args := map[string]string{}
	pair := regexp.MustCompile(`([^\s=]+)=("[^"]*"|\S*)`)
	collect := func(in string, into map[string]string) {
		for _, line := range s.all(in) {
			for _, m := range pair.FindAllStringSubmatch(line, -1) {
				into[m[1]] = os.Expand(strings.Trim(m[2], `"`), func(k string) string { return args[k] })
			}
		}
	}
	collect("ARG", args)
	if instr == "ARG" {
		return args
	}
	out := map[string]string{}
	collect(instr, out)
	return out
}

// imageLayout is what the final stage of a Dockerfile installs: installed
// path → the ./cmd package built there, the PATH, and the user.
type imageLayout struct {
	binaries map[string]string
	path     []string
	user     string
}

// layoutOf follows each `go build -o OUT ./cmd/X` of the stage named build
// through the final stage's COPY --from=build.
func layoutOf(stages []dockerStage) (imageLayout, error) {
	if len(stages) < 2 {
		return imageLayout{}, fmt.Errorf("%d stages, want a build stage and a runtime stage", len(stages))
	}
	built := map[string]string{}
	goBuild := regexp.MustCompile(`go build [^&;]*?-o (\S+) (\./cmd/\S+)`)
	for _, run := range stages[0].all("RUN") {
		for _, m := range goBuild.FindAllStringSubmatch(run, -1) {
			built[m[1]] = m[2]
		}
	}
	final := stages[len(stages)-1]
	l := imageLayout{binaries: map[string]string{}}
	for _, c := range final.all("COPY") {
		f := strings.Fields(c)
		if len(f) != 3 || f[0] != "--from="+stages[0].name {
			continue
		}
		src, dst := f[1], f[2]
		for out, pkg := range built {
			switch {
			case out == src:
				l.binaries[dst] = pkg
			case strings.HasSuffix(src, "/") && path.Dir(out)+"/" == src:
				l.binaries[path.Join(dst, path.Base(out))] = pkg
			}
		}
	}
	if p, ok := final.vars("ENV")["PATH"]; ok {
		l.path = strings.Split(p, ":")
	}
	if u := final.all("USER"); len(u) > 0 {
		l.user = u[len(u)-1]
	}
	return l, nil
}

// resolve finds the binary a container command runs, as the runtime does:
// an absolute path as is, a bare name through PATH.
func (l imageLayout) resolve(command string) (string, bool) {
	if path.IsAbs(command) {
		_, ok := l.binaries[command]
		return command, ok
	}
	for _, dir := range l.path {
		if _, ok := l.binaries[path.Join(dir, command)]; ok {
			return path.Join(dir, command), true
		}
	}
	return "", false
}

// glibcImage reports whether a runtime image has the glibc the cgo-built
// programs link, and the Debian release it is built on.
var glibcImage = regexp.MustCompile(`^(?:gcr\.io/distroless/(?:base|cc)-debian(\d+)|debian:(\d+|bookworm|trixie)(?:-slim)?)(?:[:@].*)?$`)

func debianRelease(image string) string {
	for name, n := range map[string]string{"bookworm": "12", "trixie": "13", "bullseye": "11"} {
		if strings.Contains(image, name) {
			return n
		}
	}
	if m := glibcImage.FindStringSubmatch(image); m != nil {
		return m[1] + m[2]
	}
	return ""
}

// TestDockerfile checks the Dockerfile, which cannot be built here (no
// container engine), against the chart that runs its image: every command
// the chart's containers run is a binary the image installs, built from the
// ./cmd package of that name with cgo, on a glibc runtime image of the build
// image's Debian release; the image's user agrees with the pods'
// securityContexts; the build copies every package the programs import; the
// version label is the chart's appVersion; and .dockerignore keeps what git
// ignores out of the build context.
func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	stages, layout := readDockerfile(t, root)
	build, final := stages[0], stages[len(stages)-1]

	t.Run("a wrong layout is caught", func(t *testing.T) {
		bad, err := parseDockerfile("FROM golang:1.26-bookworm AS build\nRUN go build -o /out/x ./cmd/x\nFROM scratch\nCOPY --from=build /out/x /bin/x\n")
		if err != nil {
			t.Fatal(err)
		}
		l, err := layoutOf(bad)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := l.resolve("x"); ok {
			t.Errorf("x resolved to %s without a PATH", got)
		}
		if _, ok := l.resolve("/bin/x"); !ok {
			t.Errorf("/bin/x not found in %v", l.binaries)
		}
		if glibcImage.MatchString("gcr.io/distroless/static-debian12:nonroot") || glibcImage.MatchString("alpine:3") {
			t.Error("a runtime image without glibc passes the glibc check")
		}
	})

	t.Run("build", func(t *testing.T) {
		if env := build.vars("ENV"); env["CGO_ENABLED"] != "1" {
			t.Errorf("build stage ENV %v: go-nvml needs CGO_ENABLED=1", env)
		}
		gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
		if goVersion == nil || !strings.HasPrefix(build.image, "golang:"+string(goVersion[1])+"-") {
			t.Errorf("build image %s, want golang:<go.mod's go %s>-<debian>", build.image, goVersion)
		}
		if rb, rf := debianRelease(build.image), debianRelease(final.image); rb == "" || rb != rf {
			t.Errorf("build image %s (Debian %q) and runtime image %s (Debian %q): the programs link the build image's glibc", build.image, rb, final.image, rf)
		}
		if !glibcImage.MatchString(final.image) {
			t.Errorf("runtime image %s: the cgo-built programs need glibc (distroless base or cc, or debian)", final.image)
		}
		// Every ./cmd directory is built once, into gpuslice-<dir>.
		dirs, err := filepath.Glob(filepath.Join(root, "cmd", "*", "main.go"))
		if err != nil || len(dirs) == 0 {
			t.Fatalf("no cmd/*/main.go (%v)", err)
		}
		var want, got []string
		for _, d := range dirs {
			want = append(want, "./cmd/"+filepath.Base(filepath.Dir(d)))
		}
		for bin, pkg := range layout.binaries {
			got = append(got, pkg)
			if path.Base(bin) != "gpuslice-"+path.Base(pkg) {
				t.Errorf("%s is installed as %s, want gpuslice-%s", pkg, bin, path.Base(pkg))
			}
		}
		slices.Sort(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("packages the image installs (-cmd/ +Dockerfile):\n%s", diff)
		}
	})

	t.Run("sources copied", func(t *testing.T) {
		copied := map[string]bool{}
		for _, c := range build.all("COPY") {
			f := strings.Fields(c)
			for _, src := range f[:len(f)-1] {
				if !strings.HasPrefix(src, "--") {
					copied[strings.TrimSuffix(src, "/")] = true
				}
			}
		}
		list := exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.ImportPath}}{{end}}{{end}}", "./cmd/...")
		list.Dir = root
		out, err := list.Output()
		if err != nil {
			t.Fatalf("go list: %v", err)
		}
		for _, f := range []string{"go.mod", "go.sum"} {
			if !copied[f] {
				t.Errorf("the build stage does not copy %s", f)
			}
		}
		for imp := range strings.FieldsSeq(string(out)) {
			rel, ok := strings.CutPrefix(imp, "github.com/gpuslice/gpuslice/")
			if !ok {
				continue
			}
			top, _, _ := strings.Cut(rel, "/")
			if !copied[top] {
				t.Errorf("the programs import %s, but the build stage copies only %v", imp, slices.Sorted(maps.Keys(copied)))
			}
		}
	})

	t.Run("labels", func(t *testing.T) {
		labels := final.vars("LABEL")
		if got := labels["org.opencontainers.image.version"]; got != appVersion(t) {
			t.Errorf("label org.opencontainers.image.version %q, want the chart's appVersion %s", got, appVersion(t))
		}
		for _, k := range []string{"org.opencontainers.image.source", "org.opencontainers.image.title", "org.opencontainers.image.description"} {
			if labels[k] == "" {
				t.Errorf("no label %s (labels %v)", k, labels)
			}
		}
	})

	h := helmBinary(t)
	uid, _, _ := strings.Cut(layout.user, ":")
	imageUID, err := strconv.Atoi(uid)
	if err != nil {
		t.Fatalf("Dockerfile USER %q: want a numeric uid, which the kubelet can check against runAsNonRoot", layout.user)
	}
	commands := map[string]bool{}
	for _, vs := range valueSets() {
		objs := render(t, h, vs)
		for _, o := range slices.Concat(kinds(objs, "DaemonSet"), kinds(objs, "Deployment")) {
			if isMPSDaemon(o) {
				continue // NVIDIA's driver tools in a CUDA image, not ours
			}
			t.Run("workload/"+vs.name+"/"+o.GetName(), func(t *testing.T) {
				command := strs(container(t, o)["command"])
				bin, ok := layout.resolve(command[0])
				if !ok {
					t.Fatalf("command %v: the image installs %v with PATH %v", command, slices.Sorted(maps.Keys(layout.binaries)), layout.path)
				}
				commands[path.Base(bin)] = true
				sc := nested[map[string]any](t, o, "spec", "template", "spec", "securityContext")
				runAs, ok := sc["runAsUser"].(int64)
				if !ok {
					t.Fatalf("pod securityContext %v sets no runAsUser: the image's USER %s would decide who reads the kubelet's files", sc, layout.user)
				}
				if sc["runAsNonRoot"] == true && runAs == 0 {
					t.Errorf("runAsNonRoot with runAsUser 0: the kubelet refuses to start it")
				}
				if strings.HasSuffix(o.GetName(), "-tuner") && runAs != int64(imageUID) {
					t.Errorf("the tuner runs as %d, the image's user is %d", runAs, imageUID)
				}
			})
		}
	}
	for _, c := range []string{"gpuslice-exporter", "gpuslice-tuner", "gpuslice-plugin"} {
		if !commands[c] {
			t.Errorf("no value set runs %s; the check above did not cover it", c)
		}
	}

	t.Run("dockerignore", func(t *testing.T) {
		ignore, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
		if err != nil {
			t.Fatal(err)
		}
		excluded := map[string]bool{}
		for l := range strings.SplitSeq(string(ignore), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				excluded[strings.TrimPrefix(strings.Trim(l, "/"), "**/")] = true
			}
		}
		gitignore, err := os.ReadFile(filepath.Join(root, ".gitignore"))
		if err != nil {
			t.Fatal(err)
		}
		want := []string{".git"}
		for l := range strings.SplitSeq(string(gitignore), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, "!") {
				want = append(want, strings.Trim(l, "/"))
			}
		}
		for _, w := range want {
			if !excluded[w] {
				t.Errorf(".dockerignore does not exclude %s (git ignores it; it has no place in the build context)", w)
			}
		}
	})
}

// checkMPSScriptStarts runs the MPS control daemon's script with stand-ins
// for nvidia-cuda-mps-control and nvidia-smi: .started, which the plugin
// takes for a daemon that runs, is written only when the daemon started,
// and one left by an earlier run goes even when a step before the start
// fails.
func checkMPSScriptStarts(t *testing.T, script string) {
	t.Helper()
	for _, tc := range []struct {
		name               string
		mpsControl, smi    int // exit codes
		exclusive, started bool
	}{
		{"the daemon starts", 0, 0, true, true},
		{"the daemon does not start", 1, 0, false, false},
		{"the compute mode cannot be set", 0, 1, true, false},
	} {
		t.Run("script: "+tc.name, func(t *testing.T) {
			root, bin := t.TempDir(), t.TempDir()
			for name, code := range map[string]int{"nvidia-cuda-mps-control": tc.mpsControl, "nvidia-smi": tc.smi} {
				if err := os.WriteFile(filepath.Join(bin, name), fmt.Appendf(nil, "#!/bin/sh\nexit %d\n", code), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			started := filepath.Join(root, "nvidia.com/gpu", ".started")
			if err := os.MkdirAll(filepath.Dir(started), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(started, nil, 0o644); err != nil { // an earlier run's
				t.Fatal(err)
			}
			cmd := exec.Command("sh", "-c", strings.ReplaceAll(script, "/mps/", root+"/"))
			cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "MPS_RESOURCES=nvidia.com/gpu",
				"MPS_EXCLUSIVE="+strconv.FormatBool(tc.exclusive))
			out := &lockedBuffer{}
			cmd.Stdout, cmd.Stderr = out, out
			// Its own process group, killed whole at the end: the script's
			// sleep would otherwise outlive it, holding the output open.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			cmd.WaitDelay = time.Second
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			defer func() {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				select {
				case <-done:
				case <-time.After(5 * time.Second):
				}
			}()
			if tc.started {
				testproc.Eventually(t, 10*time.Second, 10*time.Millisecond, func() string {
					if _, err := os.Stat(started); err != nil {
						return "no .started yet: " + out.String()
					}
					return ""
				})
				return
			}
			var exited bool
			select {
			case err := <-done:
				done <- err // for the deferred kill's wait
				exited = err != nil
			case <-time.After(10 * time.Second):
			}
			if !exited {
				t.Errorf("the script did not fail:\n%s", out.String())
			}
			if _, err := os.Stat(started); err == nil {
				t.Errorf("%s is there though the daemon did not start:\n%s", started, out.String())
			}
		})
	}
}

// lockedBuffer is a bytes.Buffer a test reads while a process writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestListenAddressOverride: a component's extraArgs that give
// --web.listen-address replace the chart's: the flag adds an address each
// time it is given, and the same port twice would fail to bind.
func TestListenAddressOverride(t *testing.T) {
	h := helmBinary(t)
	objs := render(t, h, valueSet{name: "listen", release: "gpuslice", namespace: "gpuslice", args: []string{
		"--set", "plugin.enabled=true",
		"--set", "exporter.extraArgs={--web.listen-address=[::]:9846}",
		"--set", "plugin.extraArgs={--web.listen-address,0.0.0.0:9848}",
	}})
	for _, tc := range []struct {
		kind, name string
		want       []string
	}{
		{"DaemonSet", "gpuslice-exporter", []string{"--web.listen-address=[::]:9846"}},
		{"DaemonSet", "gpuslice-plugin", []string{"--web.listen-address"}},
		{"Deployment", "gpuslice-tuner", []string{"--web.listen-address=:9847"}},
	} {
		var got []string
		for _, a := range strs(container(t, find(t, objs, tc.kind, tc.name))["args"]) {
			if strings.HasPrefix(a, "--web.listen-address") {
				got = append(got, a)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: listen arguments %q, want %q", tc.kind, tc.name, got, tc.want)
		}
	}
}

package realnode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/internal/testproc"
	"github.com/gpuslice/gpuslice/test/realnode"
)

// prometheus is a real Prometheus scraping the exporter every second and
// evaluating the shipped rules.
type prometheus struct{ url string }

func startPrometheus(t *testing.T, exporter, node string) *prometheus {
	t.Helper()
	return runPrometheus(t, fmt.Sprintf(`
  - job_name: gpuslice-exporter
    static_configs:
      - targets: [%q]
        labels: {node: %q}
`, exporter, node), fmt.Sprintf(`up{job="gpuslice-exporter",node=%q}`, node), "")
}

// runPrometheus runs Prometheus with the shipped rules, a 1 s scrape and
// evaluation interval and scrapeConfigs (YAML list items), sending its
// alerts to the Alertmanager at alertmanager (host:port; "": none), and
// waits until upQuery is 1.
func runPrometheus(t *testing.T, scrapeConfigs, upQuery, alertmanager string) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not in PATH (Debian: apt-get install prometheus; .ci/run installs it): %v", err)
	}
	dir := t.TempDir()
	rules := filepath.Join(realnode.Repo(), "alerts", "gpuslice-rules.yaml")
	cfg := filepath.Join(dir, "prometheus.yml")
	alerting := ""
	if alertmanager != "" {
		alerting = fmt.Sprintf(`
alerting:
  alertmanagers:
    - static_configs:
        - targets: [%q]
`, alertmanager)
	}
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:%s%s`, rules, scrapeConfigs, alerting)), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := testproc.FreeAddr(t)
	testproc.Start(t, "prometheus", nil, bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+addr, "--log.level=warn")
	p := &prometheus{url: "http://" + addr}
	testproc.Eventually(t, 60*time.Second, 200*time.Millisecond, func() string {
		v, msg := p.query(upQuery)
		if msg != "" || v != 1 {
			return fmt.Sprintf("not scraped yet (%s = %v %s)", upQuery, v, msg)
		}
		return ""
	})
	return p
}

func getJSON(u string, v any) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func (p *prometheus) query(q string) (float64, string) {
	var resp struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := getJSON(p.url+"/api/v1/query?query="+url.QueryEscape(q), &resp); err != nil {
		return 0, err.Error()
	}
	if len(resp.Data.Result) == 0 {
		return 0, "no result for " + q
	}
	var v float64
	s, _ := resp.Data.Result[0].Value[1].(string)
	if _, err := fmt.Sscan(s, &v); err != nil {
		return 0, fmt.Sprintf("%s: value %q", q, s)
	}
	return v, ""
}

// series reads a series as a metricReader.
func (p *prometheus) series(name string, labels map[string]string) (float64, string) {
	var m []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		m = append(m, fmt.Sprintf("%s=%q", k, labels[k]))
	}
	return p.query(name + "{" + strings.Join(m, ",") + "}")
}

type alert struct {
	Labels   map[string]string `json:"labels"`
	State    string            `json:"state"`
	ActiveAt time.Time         `json:"activeAt"`
}

// firing returns the firing alert name whose labels include labels, or why
// there is none.
func (p *prometheus) firing(name string, labels map[string]string) (*alert, string) {
	var resp struct {
		Data struct {
			Alerts []alert `json:"alerts"`
		} `json:"data"`
	}
	if err := getJSON(p.url+"/api/v1/alerts", &resp); err != nil {
		return nil, err.Error()
	}
	var seen []string
	for i, a := range resp.Data.Alerts {
		seen = append(seen, a.Labels["alertname"]+"/"+a.State+fmt.Sprint(a.Labels))
		if a.Labels["alertname"] != name || a.State != "firing" {
			continue
		}
		ok := true
		for k, v := range labels {
			ok = ok && a.Labels[k] == v
		}
		if ok {
			return &resp.Data.Alerts[i], ""
		}
	}
	sort.Strings(seen)
	return nil, fmt.Sprintf("no firing %s%v; alerts: %v", name, labels, seen)
}

// nodeEvent says why no Event with reason on the node mentions every word.
func nodeEvent(t *testing.T, reason string, words ...string) string {
	n := world.node
	evs, err := n.Client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + n.Name + ",reason=" + reason})
	if err != nil {
		return err.Error()
	}
	var seen []string
	for _, e := range evs.Items {
		ok := true
		for _, w := range words {
			ok = ok && strings.Contains(e.Message, w)
		}
		if ok {
			return ""
		}
		seen = append(seen, e.Message)
	}
	return fmt.Sprintf("no %s event on the node mentioning %q; have %q", reason, words, seen)
}

func ensureNamespace(t *testing.T, name string) {
	t.Helper()
	_, err := world.node.Client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// untuneNode removes what a tuner leaves on the node (its config label and
// its decision record): a tuner started later reads a recorded change as
// recent and waits out its cooldown from it, as it should in a cluster, so a
// test that expects a first raise starts from a node no tuner has touched.
func untuneNode(t *testing.T) {
	t.Helper()
	patch := []byte(`{"metadata":{"labels":{"nvidia.com/device-plugin.config":null},` +
		`"annotations":{"gpuslice.io/last-decision":null,"gpuslice.io/replicas":null}}}`)
	if _, err := world.node.Client.CoreV1().Nodes().Patch(context.Background(), world.node.Name,
		types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("clearing the tuner's label and annotations from the node: %v", err)
	}
}

// lastDecision is the tuner's gpuslice.io/last-decision annotation on the
// node: why it did or did not change the count.
func lastDecision(t *testing.T) string {
	t.Helper()
	node, err := world.node.Client.CoreV1().Nodes().Get(context.Background(), world.node.Name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	return node.Annotations["gpuslice.io/last-decision"]
}

// configLabel is the node's nvidia.com/device-plugin.config label.
func configLabel(t *testing.T) string {
	t.Helper()
	node, err := world.node.Client.CoreV1().Nodes().Get(context.Background(), world.node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return node.Labels["nvidia.com/device-plugin.config"]
}

// tunerPolicy is the tuner's policy for the real-node tests: windows of
// seconds instead of minutes, one raise per run (a long cooldown), so what a
// test sees after the raise is the OOM's doing alone.
func tunerPolicy(maxReplicas int) string {
	return fmt.Sprintf(`policy:
  minReplicas: 2
  maxReplicas: %d
  maxStepUp: 1
  window: 8s
  cooldown: 10m
  pressureWindow: 2s
  sampleInterval: 1s
  targetUtilization: 0.9
  pressureThreshold: 0.95
`, maxReplicas)
}

// TestClosedLoop runs the product on the real node: gpuslice-plugin reading
// its config from a ConfigMap, the exporter, Prometheus with the shipped
// rules and the tuner in plugin mode. Sustained headroom with every replica
// taken raises the count and lets a pending pod in; that pod then grows
// until the real contention on the GPU makes its allocation fail, its
// PyTorch OOM reaches the exporter through the real CRI log, GPUSliceOOM
// fires, the tuner lowers, the kubelet advertises the lower count and
// admits no more pods than it.
func TestClosedLoop(t *testing.T) {
	n := need(t)
	untuneNode(t)
	began := time.Now()
	ctx := context.Background()
	const cmNS, cmName = "gpuslice", "gpuslice-plugin-config"
	ensureNamespace(t, cmNS)
	_, err := n.Client.CoreV1().ConfigMaps(cmNS).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: cmNS, Name: cmName},
		Data:       map[string]string{"default": sharedConfig(2)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.Client.CoreV1().ConfigMaps(cmNS).Delete(ctx, cmName, metav1.DeleteOptions{})
		untuneNode(t)
	})

	settleDevices(t)
	testproc.Start(t, "gpuslice-plugin", gpuEnv(t), testproc.Build(t, "cmd/plugin"),
		append(gpuArgs(t),
			"--web.listen-address="+testproc.FreeAddr(t),
			"--device-plugin.path="+n.DevicePluginDir,
			"--kubelet.pod-resources-socket="+n.PodResourcesSock, "--kubelet.pod-resources-interval=1s",
			"--config.source=kubernetes", "--config.configmap="+cmNS+"/"+cmName, "--config.default=default",
			"--kubeconfig="+n.Kubeconfig, "--node-name="+n.Name, "--health.interval=1s")...)
	waitAllocatable(t, gpuRes, 2, 60*time.Second)
	_, exporter := startExporter(t)
	prom := startPrometheus(t, exporter, n.Name)

	// Two small pods take both replicas; a third waits.
	for _, name := range []string{"loop-a1", "loop-a2"} {
		createPod(t, fakeCUDAPod(name, podOpts{args: []string{"-memory", "0s=4Gi", "-sm", "0.2"}}))
	}
	for _, name := range []string{"loop-a1", "loop-a2"} {
		waitRunning(t, name, 60*time.Second)
	}
	// a3 starts at 6 GiB, reaches 40 GiB (4 + 4 + 40 = the GPU's 48), and
	// its next 2 GiB do not fit: PyTorch's OOM, exit 1, like a batch job.
	createPod(t, fakeCUDAPod("loop-a3", podOpts{restart: corev1.RestartPolicyNever,
		args: []string{"-memory", "0s=6Gi,6s=40Gi,9s=42Gi", "-sm", "0.4", "-framework", "pytorch"}}))
	testproc.Eventually(t, 30*time.Second, 200*time.Millisecond, func() string {
		p := getPod(t, "loop-a3")
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable {
				return ""
			}
		}
		return "loop-a3 not unschedulable: " + podWhy(p)
	})

	tunerCfg := filepath.Join(t.TempDir(), "tuner.yaml")
	if err := os.WriteFile(tunerCfg, []byte(fmt.Sprintf(`interval: 1s
leaderElection: {namespace: %s, name: realnode-tuner}
workloadMemory: {configMap: {namespace: %s, name: realnode-tuner-memory}}
signals:
  source: prometheus
  prometheus:
    url: %s
    selector: job="gpuslice-exporter"
    timeout: 5s
apply:
  mode: plugin
  configMap: {namespace: %s, name: %s}
  key: default
  verifyTimeout: 60s
`+tunerPolicy(4), cmNS, cmNS, prom.url, cmNS, cmName)), 0o644); err != nil {
		t.Fatal(err)
	}
	testproc.Start(t, "gpuslice-tuner", nil, testproc.Build(t, "cmd/tuner"), "run", "--config="+tunerCfg,
		"--kubeconfig="+n.Kubeconfig, "--web.listen-address="+testproc.FreeAddr(t))

	testproc.Eventually(t, 120*time.Second, 500*time.Millisecond, func() string {
		if l := configLabel(t); l != "gpuslice-3" {
			return fmt.Sprintf("node label %q, want gpuslice-3; the tuner's last decision: %s", l, lastDecision(t))
		}
		return ""
	})
	raisedAt := time.Now()
	d := waitAllocatable(t, gpuRes, 3, 60*time.Second)
	t.Logf("tuner raised 2→3 %v after start; Node.status.allocatable 3 %v after the label", raisedAt.Sub(began).Round(time.Second), d.Round(100*time.Millisecond))
	waitRunning(t, "loop-a3", 60*time.Second)

	// The OOM: read its time from the real CRI log line.
	var oomAt time.Time
	testproc.Eventually(t, 60*time.Second, 200*time.Millisecond, func() string {
		log := containerLog(t, getPod(t, "loop-a3"), "cuda")
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "CUDA out of memory") {
				ts, _, _ := strings.Cut(line, " ")
				if oomAt, err = time.Parse(time.RFC3339Nano, ts); err != nil {
					t.Fatalf("CRI log line without a timestamp: %q", line)
				}
				return ""
			}
		}
		return "no OOM in loop-a3's log yet:\n" + log
	})
	var fired *alert
	testproc.Eventually(t, 60*time.Second, 200*time.Millisecond, func() string {
		var msg string
		fired, msg = prom.firing("GPUSliceOOM", map[string]string{"node": n.Name, "pod": "loop-a3", "container": "cuda"})
		return msg
	})
	testproc.Eventually(t, 60*time.Second, 200*time.Millisecond, func() string {
		if l := configLabel(t); l != "gpuslice-2" {
			return fmt.Sprintf("node label %q, want gpuslice-2 after the OOM", l)
		}
		return ""
	})
	loweredAt := time.Now()
	// The OOM lowers to 2 from 3, or from 4 when a spare was given after
	// loop-a3 took the third replica.
	testproc.Eventually(t, 30*time.Second, 200*time.Millisecond, func() string { return nodeEvent(t, "ReplicasLowered", " -> 2 (") })
	waitAllocatable(t, gpuRes, 2, 60*time.Second)
	allocAt := time.Now()
	t.Logf("OOM line %s → GPUSliceOOM active +%v → label gpuslice-2 +%v → Node.status.allocatable 2 +%v",
		oomAt.Format(time.RFC3339Nano), fired.ActiveAt.Sub(oomAt).Round(time.Millisecond),
		loweredAt.Sub(oomAt).Round(100*time.Millisecond), allocAt.Sub(oomAt).Round(100*time.Millisecond))

	// The kubelet admits no more pods than the lowered count: a1 and a2
	// hold both replicas, a4 stays pending.
	createPod(t, fakeCUDAPod("loop-a4", podOpts{args: []string{"-memory", "0s=4Gi"}}))
	time.Sleep(5 * time.Second)
	if p := getPod(t, "loop-a4"); p.Status.Phase == corev1.PodRunning {
		t.Fatalf("a4 runs although the lowered count of 2 is held by a1 and a2")
	}
	for _, name := range []string{"loop-a1", "loop-a2"} {
		if p := getPod(t, name); p.Status.Phase != corev1.PodRunning {
			t.Errorf("the lowering disturbed %s: %s", name, podWhy(p))
		}
	}
	if p := getPod(t, "loop-a3"); p.Status.Phase != corev1.PodFailed {
		t.Errorf("a3 after its OOM: %s, want Failed", p.Status.Phase)
	}
	t.Logf("whole loop on the real node: %v", time.Since(began).Round(time.Second))
}

package e2e

import (
	"context"
	"fmt"
	"github.com/gpuslice/gpuslice/internal/testproc"
	"log/slog"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/test/e2e/fakekubelet"
	"github.com/gpuslice/gpuslice/test/simnode"
)

// gpuResource is what the plugin (and a static node) advertises.
const gpuResource = "nvidia.com/gpu"

// modeLabel tells the two tuners' nodes apart (apply.nodeSelector).
const modeLabel = "e2e.gpuslice.io/mode"

// baseConfig is the device-plugin config both ConfigMaps start with, under
// the key "default": every GPU shared two ways.
const baseConfig = `version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 2
`

// world is the control plane and the processes around it.
type world struct {
	t          *testing.T
	ctx        context.Context
	env        *testenv.Env
	client     kubernetes.Interface
	kubeconfig string
	dir        string
	bins       struct{ exporter, plugin, tuner string }
	procs      []*process
	promURL    string
}

// gpuNode is one simulated GPU node with its fake kubelet and exporter.
type gpuNode struct {
	name      string
	uuid      string
	sim       *simnode.Node
	kubelet   *fakekubelet.Kubelet
	exporter  string // host:port
	pluginDir string
}

// startWorld builds the commands and starts kube-apiserver, etcd,
// kube-scheduler and kube-controller-manager.
func startWorld(t *testing.T) *world {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &world{t: t, ctx: ctx, dir: t.TempDir()}

	built := make(chan error, 1)
	dir := t.TempDir()
	go func() { built <- buildInto(dir) }()
	w.env = testenv.Start(t)
	w.client = w.env.Client
	// Registered after the control plane's cleanup, so it runs before it:
	// the fake kubelets' watches end before the API server stops.
	t.Cleanup(cancel)
	w.kubeconfig = w.env.Kubeconfig(t, w.dir)
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	w.bins.exporter, w.bins.plugin, w.bins.tuner = filepath.Join(dir, "exporter"), filepath.Join(dir, "plugin"), filepath.Join(dir, "tuner")

	sched := writeFile(t, filepath.Join(w.dir, "scheduler.yaml"), fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
leaderElection:
  leaderElect: false
# A pod that did not fit is tried again within a second of a node change.
podInitialBackoffSeconds: 1
podMaxBackoffSeconds: 1
`, w.kubeconfig))
	w.procs = append(w.procs,
		start(t, "kube-scheduler", controlPlaneBinary(t, "kube-scheduler"), "--config="+sched, "--secure-port=0", "-v=2"),
		// The node lifecycle controller is what a real cluster relies on to
		// lift the not-ready taint the API server puts on a new Node, and to
		// taint and evict when a kubelet stops heart-beating; pod GC removes
		// pods of deleted nodes. Nothing else here needs a controller.
		start(t, "kube-controller-manager", controlPlaneBinary(t, "kube-controller-manager"),
			"--kubeconfig="+w.kubeconfig, "--leader-elect=false", "--secure-port=0",
			"--controllers=node-lifecycle-controller,taint-eviction-controller,pod-garbage-collector-controller",
			"--node-monitor-period=1s", "--use-service-account-credentials=false", "-v=2"),
	)
	for _, ns := range []string{"gpuslice", "nvidia-device-plugin", "ml"} {
		w.env.CreateNamespace(t, ns)
	}
	return w
}

// buildInto builds the three commands into dir with one go build.
func buildInto(dir string) error {
	cmd := execCommand("go", "build", "-o", dir+"/", "github.com/gpuslice/gpuslice/cmd/exporter",
		"github.com/gpuslice/gpuslice/cmd/plugin", "github.com/gpuslice/gpuslice/cmd/tuner")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the commands: %w\n%s", err, out)
	}
	return nil
}

// configMap creates a ConfigMap holding the base config under "default".
func (w *world) configMap(ns, name string) {
	w.t.Helper()
	_, err := w.client.CoreV1().ConfigMaps(ns).Create(w.ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Data:       map[string]string{"default": baseConfig},
	}, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
}

// logSink collects a component's output for the test log on failure.
type logSink = testproc.Output

// addNode starts a simulated GPU node with one RTX A6000: its fake kubelet
// with a device-plugin directory (withPlugin) or two static replicas, and
// its exporter.
func (w *world) addNode(name, mode string, withPlugin bool) *gpuNode {
	t := w.t
	t.Helper()
	sim, err := simnode.New(name, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n := &gpuNode{name: name, uuid: simnode.GPUUUID(name, 0), sim: sim}
	sim.GPUs = []*simnode.GPU{{UUID: n.uuid, MemoryBytes: simnode.A6000Bytes, Utilization: 0.3, Temperature: 55, PowerWatts: 120}}
	if err := sim.Start(w.ctx); err != nil {
		t.Fatal(err)
	}
	sink := &logSink{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- fake kubelet %s (last 60 lines) ---\n%s", name, tail(sink.String(), 60))
		}
	})
	o := fakekubelet.Options{Client: w.client, Sim: sim, Labels: map[string]string{modeLabel: mode},
		Logger: slog.New(slog.NewTextHandler(sink, nil))}
	if withPlugin {
		n.pluginDir = shortDir(t, "gsdp")
		o.DevicePluginDir = n.pluginDir
	} else {
		o.StaticDevices = map[string][]string{gpuResource: {n.uuid + "::0", n.uuid + "::1"}}
	}
	if n.kubelet, err = fakekubelet.New(o); err != nil {
		t.Fatal(err)
	}
	if err := n.kubelet.Run(w.ctx); err != nil {
		t.Fatal(err)
	}
	n.exporter = freeAddr(t)
	w.procs = append(w.procs, start(t, "gpuslice-exporter "+name, w.bins.exporter,
		"--web.listen-address="+n.exporter,
		"--gpu.backend=sim", "--sim.file="+sim.SimFile(),
		"--path.procfs="+sim.Procfs(), "--path.pod-logs="+sim.PodLogs(),
		"--kubelet.pod-resources-socket="+sim.PodResourcesSocket(),
		"--pods.source=apiserver", "--kubeconfig="+w.kubeconfig, "--node-name="+name))
	return n
}

// startPlugin runs gpuslice-plugin on a node, reading its config through
// the API from configMap (<ns>/<name>) and the node's label.
func (w *world) startPlugin(n *gpuNode, configMap string) {
	w.t.Helper()
	w.procs = append(w.procs, start(w.t, "gpuslice-plugin "+n.name, w.bins.plugin,
		"--web.listen-address="+freeAddr(w.t),
		"--gpu.backend=sim", "--sim.file="+n.sim.SimFile(),
		"--device-plugin.path="+n.pluginDir,
		"--kubelet.pod-resources-socket="+n.sim.PodResourcesSocket(), "--kubelet.pod-resources-interval=1s",
		"--config.source=kubernetes", "--config.configmap="+configMap, "--config.default=default",
		"--kubeconfig="+w.kubeconfig, "--node-name="+n.name, "--health.interval=1s"))
}

// startPrometheus scrapes every node's exporter each second as job
// gpuslice-exporter with a static node label, and evaluates the alert rules
// each second.
func (w *world) startPrometheus(nodes ...*gpuNode) {
	t := w.t
	t.Helper()
	rules, err := filepath.Abs(filepath.Join("..", "..", "alerts", "gpuslice-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var targets strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&targets, "      - targets: [%q]\n        labels: {node: %q}\n", n.exporter, n.name)
	}
	cfg := writeFile(t, filepath.Join(w.dir, "prometheus.yml"), fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: gpuslice-exporter
    static_configs:
%s`, rules, targets.String()))
	addr := freeAddr(t)
	w.promURL = "http://" + addr
	w.procs = append(w.procs, start(t, "prometheus", lookPrometheus(t),
		"--config.file="+cfg, "--storage.tsdb.path="+t.TempDir(), "--web.listen-address="+addr,
		"--log.level=warn"))
}

// scraped says why Prometheus has not yet scraped every node's exporter
// successfully ("" when it has).
func (w *world) scraped(nodes ...*gpuNode) string {
	for _, n := range nodes {
		v, msg := w.query(fmt.Sprintf(`up{job="gpuslice-exporter",node=%q}`, n.name))
		if msg != "" || v != 1 {
			return fmt.Sprintf("exporter of %s not scraped yet (up=%v %s)", n.name, v, msg)
		}
	}
	return ""
}

// alert is one entry of Prometheus's /api/v1/alerts.
type alert struct {
	Labels   map[string]string `json:"labels"`
	State    string            `json:"state"`
	ActiveAt time.Time         `json:"activeAt"`
}

// alerts returns the alerts Prometheus holds now.
func (w *world) alerts() ([]alert, error) {
	var resp struct {
		Status string `json:"status"`
		Data   struct {
			Alerts []alert `json:"alerts"`
		} `json:"data"`
	}
	if err := getJSON(w.ctx, w.promURL+"/api/v1/alerts", &resp); err != nil {
		return nil, err
	}
	return resp.Data.Alerts, nil
}

// firing finds a firing alert with the given name and labels.
func (w *world) firing(name string, labels map[string]string) (*alert, string) {
	as, err := w.alerts()
	if err != nil {
		return nil, err.Error()
	}
	var seen []string
	for i, a := range as {
		seen = append(seen, a.Labels["alertname"]+"/"+a.State+fmt.Sprint(a.Labels))
		if a.Labels["alertname"] != name || a.State != "firing" {
			continue
		}
		ok := true
		for k, v := range labels {
			ok = ok && a.Labels[k] == v
		}
		if ok {
			return &as[i], ""
		}
	}
	sort.Strings(seen)
	return nil, fmt.Sprintf("no firing %s%v; alerts: %v", name, labels, seen)
}

// query runs an instant PromQL query and returns the first value.
func (w *world) query(q string) (float64, string) {
	var resp struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := getJSON(w.ctx, w.promURL+"/api/v1/query?query="+url.QueryEscape(q), &resp); err != nil {
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

// gpuPod is a pod asking for one GPU replica on a node, with workload
// annotations for the fake kubelet.
func gpuPod(name, node string, restart corev1.RestartPolicy, ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, Annotations: ann, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeSelector:  map[string]string{"kubernetes.io/hostname": node},
			RestartPolicy: restart,
			Containers: []corev1.Container{{Name: "train", Image: "example.com/train:1",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpuResource: resource.MustParse("1")}}}},
		},
	}
}

func (w *world) createPod(p *corev1.Pod) {
	w.t.Helper()
	if _, err := w.client.CoreV1().Pods(p.Namespace).Create(w.ctx, p, metav1.CreateOptions{}); err != nil {
		w.t.Fatalf("creating pod %s: %v", p.Name, err)
	}
}

func (w *world) pod(name string) (*corev1.Pod, error) {
	return w.client.CoreV1().Pods("ml").Get(w.ctx, name, metav1.GetOptions{})
}

// running says why a pod is not running on node with its container started
// ("" when it is).
func (w *world) running(name, node string) string {
	p, err := w.pod(name)
	if err != nil {
		return err.Error()
	}
	if p.Spec.NodeName != node || p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 ||
		p.Status.ContainerStatuses[0].State.Running == nil || p.Status.ContainerStatuses[0].ContainerID == "" {
		return fmt.Sprintf("pod %s: node %q, phase %s, %s", name, p.Spec.NodeName, p.Status.Phase, conditions(p))
	}
	return ""
}

// unschedulable says why a pod is not Pending with the scheduler's verdict
// that it does not fit ("" when it is).
func (w *world) unschedulable(name string) string {
	p, err := w.pod(name)
	if err != nil {
		return err.Error()
	}
	if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
		return fmt.Sprintf("pod %s is on node %q, phase %s", name, p.Spec.NodeName, p.Status.Phase)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable &&
			strings.Contains(c.Message, "Insufficient "+gpuResource) {
			return ""
		}
	}
	return fmt.Sprintf("pod %s has no Unschedulable verdict for %s yet: %s", name, gpuResource, conditions(p))
}

func conditions(p *corev1.Pod) string {
	var out []string
	for _, c := range p.Status.Conditions {
		out = append(out, fmt.Sprintf("%s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(out, ", ")
}

// node returns a node's allocatable GPUs, its config label and whether it
// still has a taint.
func (w *world) node(name string) (alloc int64, label string, taints []corev1.Taint, err error) {
	n, err := w.client.CoreV1().Nodes().Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, "", nil, err
	}
	q := n.Status.Allocatable[gpuResource]
	return q.Value(), n.Labels["nvidia.com/device-plugin.config"], n.Spec.Taints, nil
}

// schedulable says why a node is not Ready for GPU pods with want GPUs
// allocatable ("" when it is).
func (w *world) schedulable(name string, want int64) string {
	alloc, _, taints, err := w.node(name)
	if err != nil {
		return err.Error()
	}
	if len(taints) > 0 || alloc != want {
		return fmt.Sprintf("node %s: allocatable %s %d (want %d), taints %v", name, gpuResource, alloc, want, taints)
	}
	return ""
}

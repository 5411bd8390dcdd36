package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/test/e2e/fakekubelet"
)

// Names of the two ConfigMaps: gpuslice-plugin's (plugin mode) and NVIDIA's
// chart's (config-manager mode).
const (
	pluginConfigNS, pluginConfigName = "gpuslice", "gpuslice-plugin-config"
	nvidiaConfigNS, nvidiaConfigName = "nvidia-device-plugin", "nvidia-device-plugin-configs"
)

// policy is the tuner's policy section for both tuners: seconds instead of
// minutes. minReplicas 2 keeps every config shared (NVIDIA's configs need
// replicas >= 2 for sharing); the long cooldown allows one raise per run, so
// what the test sees after it is the OOM's doing alone.
const policy = `policy:
  minReplicas: 2
  maxReplicas: 4
  maxStepUp: 1
  window: 8s
  cooldown: 10m
  pressureWindow: 2s
  sampleInterval: 1s
  targetUtilization: 0.9
  pressureThreshold: 0.95
`

// TestClosedLoop runs the whole loop twice over, side by side in one
// cluster: node gpu-node-1 with gpuslice-plugin and a tuner in plugin mode
// that reads its signals from Prometheus, and node gpu-node-2 with static
// devices (NVIDIA's plugin, as far as the kubelet can tell) and a tuner in
// config-manager mode that scrapes the exporter itself.
func TestClosedLoop(t *testing.T) {
	began := time.Now()
	w := startWorld(t)
	w.configMap(pluginConfigNS, pluginConfigName)
	w.configMap(nvidiaConfigNS, nvidiaConfigName)
	n1 := w.addNode("gpu-node-1", "plugin", true)
	n2 := w.addNode("gpu-node-2", "config-manager", false)
	w.startPlugin(n1, pluginConfigNS+"/"+pluginConfigName)
	w.startPrometheus(n1, n2)
	for _, n := range []*gpuNode{n1, n2} {
		// The node lifecycle controller lifts the not-ready taint; the
		// plugin's first ListAndWatch answer (base config: 2 replicas)
		// becomes the allocatable.
		eventually(t, 60*time.Second, "node "+n.name+" schedulable", w.procs, func() string { return w.schedulable(n.name, 2) })
	}
	eventually(t, 30*time.Second, "Prometheus scraping the exporters", w.procs, func() string { return w.scraped(n1, n2) })

	// Two small pods fill each node's two replicas; a third waits on
	// gpu-node-1. Its trace: 30 GiB, a CUDA OOM 4 s after it starts, exit 1 s
	// later (restartPolicy Never, like a batch job). 4 + 4 + 30 GiB leave
	// less free than the 30 GiB pod (the tuner lowers only for an OOM on a
	// full GPU) and stay under the 95% that would lower for pressure first.
	small := map[string]string{fakekubelet.AnnotationMemory: "4Gi", fakekubelet.AnnotationSM: "0.2"}
	for _, p := range []struct{ name, node string }{{"a1", n1.name}, {"a2", n1.name}, {"c1", n2.name}, {"c2", n2.name}} {
		w.createPod(gpuPod(p.name, p.node, corev1.RestartPolicyAlways, small))
	}
	w.createPod(gpuPod("a3", n1.name, corev1.RestartPolicyNever, map[string]string{
		fakekubelet.AnnotationMemory: "30Gi", fakekubelet.AnnotationSM: "0.4",
		fakekubelet.AnnotationOOMAfter: "4s", fakekubelet.AnnotationExitAfter: "5s"}))
	for _, p := range []struct{ name, node string }{{"a1", n1.name}, {"a2", n1.name}, {"c1", n2.name}, {"c2", n2.name}} {
		eventually(t, 30*time.Second, p.name+" running", w.procs, func() string { return w.running(p.name, p.node) })
	}
	eventually(t, 30*time.Second, "a3 pending", w.procs, func() string { return w.unschedulable("a3") })

	w.startTuner("plugin", fmt.Sprintf(`interval: 1s
leaderElection: {namespace: gpuslice, name: e2e-tuner-plugin}
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
  nodeSelector: %s=plugin
  verifyTimeout: 60s
%s`, w.promURL, pluginConfigNS, pluginConfigName, modeLabel, policy))
	w.startTuner("config-manager", fmt.Sprintf(`interval: 1s
leaderElection: {namespace: gpuslice, name: e2e-tuner-config-manager}
signals:
  source: exporters
  exporters:
    targets: [{node: %s, url: "http://%s/metrics"}]
    timeout: 2s
apply:
  mode: config-manager
  configMap: {namespace: %s, name: %s}
  key: default
  nodeSelector: %s=config-manager
  # Nothing here plays NVIDIA's config-manager, so the raise is never
  # verified; the long timeout keeps the node from being held meanwhile.
  verifyTimeout: 10m
  # No ConfigMap volume to wait for (the default, 90 s, is the kubelet's).
  propagationDelay: 2s
%s`, n2.name, n2.exporter, nvidiaConfigNS, nvidiaConfigName, modeLabel, policy))
	t.Logf("cluster, nodes, pods and tuners up after %v", time.Since(began).Round(time.Millisecond))

	raised := t.Run("plugin: sustained headroom raises replicas and the pending pod is scheduled", func(t *testing.T) {
		eventually(t, 90*time.Second, "the tuner raising gpu-node-1", w.procs, func() string { return w.labelIs(n1.name, "gpuslice-3") })
		w.namedConfig(t, pluginConfigNS, pluginConfigName, "gpuslice-3", 3)
		eventually(t, 30*time.Second, "gpuslice-plugin re-advertising", w.procs, func() string { return w.allocatableIs(n1.name, 3) })
		eventually(t, 30*time.Second, "a3 scheduled and started", w.procs, func() string { return w.started("a3", n1.name) })
		t.Logf("raised and a3 started after %v", time.Since(began).Round(time.Millisecond))
	})

	// The OOM scenario needs the third pod the raise let in.
	if raised {
		t.Run("plugin: a CUDA OOM fires GPUSliceOOM, lowers replicas, the next pod stays pending", func(t *testing.T) {
			var oomAt time.Time
			eventually(t, 30*time.Second, "a3 logging its OOM", w.procs, func() string {
				for _, l := range n1.kubelet.OOMLines() {
					if l.Pod == "a3" {
						oomAt = l.Time
						return ""
					}
				}
				return "no OOM line from a3 yet"
			})
			var fired *alert
			eventually(t, 60*time.Second, "GPUSliceOOM firing for a3", w.procs, func() string {
				var msg string
				fired, msg = w.firing("GPUSliceOOM", map[string]string{"node": n1.name, "namespace": "ml", "pod": "a3", "container": "train", "source": "log"})
				return msg
			})
			eventually(t, 60*time.Second, "the tuner lowering gpu-node-1", w.procs, func() string { return w.labelIs(n1.name, "gpuslice-2") })
			w.namedConfig(t, pluginConfigNS, pluginConfigName, "gpuslice-2", 2)
			eventually(t, 30*time.Second, "the tuner's event for the lowering", w.procs, func() string { return w.event(n1.name, "ReplicasLowered", "3 -> 2", "GPUOOM") })
			rec := w.decision(t, n1.name)
			if rec.LastChange == nil || rec.Replicas != 2 {
				t.Fatalf("gpu-node-1's last decision = %+v, want 2 replicas and the time of the change", rec)
			}
			eventually(t, 30*time.Second, "allocatable lowered to 2", w.procs, func() string { return w.allocatableIs(n1.name, 2) })
			lowered, ok := firstAllocatable(n1.kubelet.Allocatable(), 2, oomAt)
			if !ok {
				t.Fatalf("the fake kubelet wrote no allocatable of 2 after the OOM at %v: %v", oomAt, n1.kubelet.Allocatable())
			}
			t.Logf("OOM line %s → GPUSliceOOM active %v → tuner lowered %v → allocatable 2 written %v",
				oomAt.Format(time.RFC3339Nano), fired.ActiveAt.Sub(oomAt).Round(time.Millisecond),
				rec.LastChange.Sub(oomAt).Round(time.Millisecond), lowered.Sub(oomAt).Round(time.Millisecond))

			w.createPod(gpuPod("a4", n1.name, corev1.RestartPolicyAlways, small))
			eventually(t, 30*time.Second, "a4 pending for want of a replica", w.procs, func() string { return w.unschedulable("a4") })
			for _, p := range []string{"a1", "a2"} {
				if msg := w.running(p, n1.name); msg != "" {
					t.Errorf("a running pod was disturbed: %s", msg)
				}
			}
			if p, err := w.pod("a3"); err != nil || p.Status.Phase != corev1.PodFailed {
				t.Errorf("a3 after its OOM and exit: %v, want phase Failed", phaseOf(p, err))
			}
		})
	}

	t.Run("config-manager: headroom raises and an OOM lowers the node's config label", func(t *testing.T) {
		eventually(t, 90*time.Second, "the tuner raising gpu-node-2", w.procs, func() string { return w.labelIs(n2.name, "gpuslice-3") })
		w.namedConfig(t, nvidiaConfigNS, nvidiaConfigName, "gpuslice-3", 3)
		// c2 grows to 30 GiB and runs out: an OOM on a full GPU.
		w.annotate(t, "c2", fakekubelet.AnnotationMemory, "30Gi")
		w.annotate(t, "c2", fakekubelet.AnnotationOOMAfter, "0s")
		eventually(t, 60*time.Second, "GPUSliceOOM firing for c2", w.procs, func() string {
			_, msg := w.firing("GPUSliceOOM", map[string]string{"node": n2.name, "pod": "c2"})
			return msg
		})
		eventually(t, 60*time.Second, "the tuner lowering gpu-node-2", w.procs, func() string { return w.labelIs(n2.name, "gpuslice-2") })
		w.namedConfig(t, nvidiaConfigNS, nvidiaConfigName, "gpuslice-2", 2)
		eventually(t, 30*time.Second, "the tuner's events", w.procs, func() string {
			if msg := w.event(n2.name, "ReplicasRaised", "2 -> 3", "SustainedHeadroom"); msg != "" {
				return msg
			}
			return w.event(n2.name, "ReplicasLowered", "3 -> 2", "GPUOOM")
		})
		for _, p := range []string{"c1", "c2"} {
			if msg := w.running(p, n2.name); msg != "" {
				t.Errorf("a running pod was disturbed: %s", msg)
			}
		}
	})
	t.Logf("whole loop took %v", time.Since(began).Round(time.Millisecond))
}

// startTuner runs gpuslice-tuner with a tuner.yaml.
func (w *world) startTuner(name, cfg string) {
	w.t.Helper()
	path := writeFile(w.t, filepath.Join(w.dir, "tuner-"+name+".yaml"), cfg)
	w.procs = append(w.procs, start(w.t, "gpuslice-tuner "+name, w.bins.tuner, "run", "--config="+path,
		"--kubeconfig="+w.kubeconfig, "--web.listen-address="+freeAddr(w.t)))
}

// labelIs says why a node's config label is not want.
func (w *world) labelIs(node, want string) string {
	_, label, _, err := w.node(node)
	if err != nil {
		return err.Error()
	}
	if label != want {
		return fmt.Sprintf("node %s: label nvidia.com/device-plugin.config=%q, want %q", node, label, want)
	}
	return ""
}

// allocatableIs says why a node's allocatable GPUs are not want.
func (w *world) allocatableIs(node string, want int64) string {
	alloc, _, _, err := w.node(node)
	if err != nil {
		return err.Error()
	}
	if alloc != want {
		return fmt.Sprintf("node %s: allocatable %s %d, want %d", node, gpuResource, alloc, want)
	}
	return ""
}

// started says why a pod was not bound to node and started by its kubelet
// (it may have ended since).
func (w *world) started(name, node string) string {
	p, err := w.pod(name)
	if err != nil {
		return err.Error()
	}
	if p.Spec.NodeName != node || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].ContainerID == "" {
		return fmt.Sprintf("pod %s: node %q, phase %s, %s", name, p.Spec.NodeName, p.Status.Phase, conditions(p))
	}
	return ""
}

// namedConfig checks that the tuner wrote key into the ConfigMap as the base
// config with want replicas.
func (w *world) namedConfig(t *testing.T, ns, name, key string, want int) {
	t.Helper()
	cm, err := w.client.CoreV1().ConfigMaps(ns).Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data, ok := cm.Data[key]
	if !ok {
		t.Fatalf("ConfigMap %s/%s has no key %q (keys: %v)", ns, name, key, keys(cm.Data))
	}
	f, err := dpconfig.Parse([]byte(data))
	if err != nil {
		t.Fatalf("ConfigMap %s/%s key %q does not parse: %v\n%s", ns, name, key, err, data)
	}
	if got := f.Replicas(); got != want {
		t.Errorf("ConfigMap %s/%s key %q has %d replicas, want %d:\n%s", ns, name, key, got, want, data)
	}
}

// decisionRecord is the part of the tuner's gpuslice.io/last-decision
// annotation the test reads.
type decisionRecord struct {
	Replicas   int        `json:"replicas"`
	LastChange *time.Time `json:"lastChange"`
}

// event says why the tuner has not recorded an Event with this reason on a
// node whose message holds every one of words ("" when it has).
func (w *world) event(node, reason string, words ...string) string {
	evs, err := w.client.CoreV1().Events("").List(w.ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node + ",reason=" + reason})
	if err != nil {
		return err.Error()
	}
	var seen []string
	for _, e := range evs.Items {
		ok := true
		for _, wd := range words {
			ok = ok && strings.Contains(e.Message, wd)
		}
		if ok {
			return ""
		}
		seen = append(seen, e.Message)
	}
	return fmt.Sprintf("node %s: no %s event mentioning %q; have %q", node, reason, words, seen)
}

func (w *world) decision(t *testing.T, node string) decisionRecord {
	t.Helper()
	n, err := w.client.CoreV1().Nodes().Get(w.ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var rec decisionRecord
	if err := json.Unmarshal([]byte(n.Annotations["gpuslice.io/last-decision"]), &rec); err != nil {
		t.Fatalf("node %s: gpuslice.io/last-decision %q: %v", node, n.Annotations["gpuslice.io/last-decision"], err)
	}
	return rec
}

// annotate sets an annotation on a pod of namespace ml.
func (w *world) annotate(t *testing.T, pod, key, value string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if _, err := w.client.CoreV1().Pods("ml").Patch(w.ctx, pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("annotating pod %s: %v", pod, err)
	}
}

// firstAllocatable finds when the kubelet first wrote count after since.
func firstAllocatable(h []fakekubelet.AllocatableChange, count int64, since time.Time) (time.Time, bool) {
	for _, c := range h {
		if c.Resource == gpuResource && c.Count == count && c.Time.After(since) {
			return c.Time, true
		}
	}
	return time.Time{}, false
}

func phaseOf(p *corev1.Pod, err error) string {
	if err != nil {
		return err.Error()
	}
	return string(p.Status.Phase)
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

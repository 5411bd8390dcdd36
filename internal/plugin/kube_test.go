package plugin

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuslice/gpuslice/internal/testenv"
)

// TestKubeSource runs the plugin against a real kube-apiserver: the config
// comes from a ConfigMap key chosen by the node's label, and every change of
// either reaches the kubelet on the open stream.
func TestKubeSource(t *testing.T) {
	env := testenv.Start(t)
	cs := env.Client
	ctx := t.Context()
	env.CreateNamespace(t, "gpu-system")
	cm, err := cs.CoreV1().ConfigMaps("gpu-system").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "device-plugin"},
		Data:       map[string]string{"two": config(2), "four": config(4)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: "gpu-node-1", Labels: map[string]string{ConfigLabel: "two"},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	h := start(t, setup{gpus: twoSpecs(), source: &KubeSource{
		Client: cs, Namespace: "gpu-system", Name: "device-plugin", NodeName: "gpu-node-1", DefaultKey: "four",
	}})
	e := h.kubelet.endpoint(gpuRes)
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))

	// The tuner edits the key this node uses.
	cm.Data["two"] = config(3)
	if cm, err = cs.CoreV1().ConfigMaps("gpu-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 3), ids(uuid1, 0, 3)))

	// The tuner (config-manager style) moves the node's label.
	node.Labels[ConfigLabel] = "four"
	if node, err = cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))

	// A broken config: kept out, counted, and reported on the Node.
	cm.Data["four"] = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n"
	if cm, err = cs.CoreV1().ConfigMaps("gpu-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitMetric("reload failures", h.plugin.metrics.reloadFailures, 1)
	waitEvent(t, h, cs, "gpu-node-1", "replicas: must be >= 2, got 1")

	// A label naming a key that does not exist: kept out too.
	node.Labels[ConfigLabel] = "eight"
	if node, err = cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitMetric("reload failures", h.plugin.metrics.reloadFailures, 2)

	// No label: the default key, now fixed.
	cm.Data["four"] = config(5)
	if _, err = cs.CoreV1().ConfigMaps("gpu-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	delete(node.Labels, ConfigLabel)
	if _, err = cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 5), ids(uuid1, 0, 5)))

	if h.kubelet.endpoint(gpuRes) != e || h.kubelet.registrationCount(gpuRes) != 1 {
		t.Errorf("config changes restarted the plugin: %s", h.kubelet.describe())
	}
}

func waitEvent(t *testing.T, h *harness, cs kubernetes.Interface, node, text string) {
	t.Helper()
	h.kubelet.waitFor("a Warning event on node "+node+" containing "+text, func() bool {
		evs, err := cs.CoreV1().Events("").List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Kind == "Node" && ev.InvolvedObject.Name == node && ev.Type == corev1.EventTypeWarning &&
				ev.Reason == ReasonConfigInvalid && strings.Contains(ev.Message, text) {
				return true
			}
		}
		return false
	})
}

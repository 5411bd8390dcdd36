package plugin

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
	"github.com/gpuslice/gpuslice/internal/testenv"
)

// BenchmarkAllocate measures one Allocate call of one replica over the
// plugin's unix socket, as the kubelet makes it, on an 8-GPU node.
func BenchmarkAllocate(b *testing.B) {
	h := start(b, setup{config: config(8), gpus: gputest.Node(8, 0), quiet: true})
	e := h.kubelet.endpoint(gpuRes)
	h.kubelet.waitFor("64 devices", func() bool { return len(strings.Fields(h.kubelet.latest(gpuRes))) == 64 })
	id := rid(gputest.UUID(3), 5)
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{id}}}}
	for b.Loop() {
		if _, err := e.client.Allocate(b.Context(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConfigChangeToList measures the time from writing a new config
// file to the kubelet receiving the new device list on its open
// ListAndWatch stream (fsnotify, read, parse, PodResources not configured).
func BenchmarkConfigChangeToList(b *testing.B) {
	h := start(b, setup{config: config(2), gpus: twoSpecs(), quiet: true})
	lists := map[int]string{2: want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)), 3: want(ids(uuid0, 0, 3), ids(uuid1, 0, 3))}
	h.kubelet.waitList(gpuRes, lists[2])
	n := 2
	for b.Loop() {
		n = 5 - n
		h.writeConfig(config(n))
		h.kubelet.waitList(gpuRes, lists[n])
	}
}

// BenchmarkConfigChangeToListAPI is the same through the API server: a
// ConfigMap update seen by the plugin's informer.
func BenchmarkConfigChangeToListAPI(b *testing.B) {
	env := testenv.Start(b)
	cs := env.Client
	env.CreateNamespace(b, "gpu-system")
	cm, err := cs.CoreV1().ConfigMaps("gpu-system").Create(b.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "device-plugin"}, Data: map[string]string{"any": config(2)},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := cs.CoreV1().Nodes().Create(b.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	h := start(b, setup{gpus: twoSpecs(), source: &KubeSource{Client: cs, Namespace: "gpu-system", Name: "device-plugin", NodeName: "n1"}, quiet: true})
	lists := map[int]string{2: want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)), 3: want(ids(uuid0, 0, 3), ids(uuid1, 0, 3))}
	h.kubelet.waitList(gpuRes, lists[2])
	n := 2
	for b.Loop() {
		n = 5 - n
		cm.Data["any"] = config(n)
		if cm, err = cs.CoreV1().ConfigMaps("gpu-system").Update(b.Context(), cm, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		h.kubelet.waitList(gpuRes, lists[n])
	}
}

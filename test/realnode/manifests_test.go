package realnode_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/gpuslice/gpuslice/deploy"
	"github.com/gpuslice/gpuslice/internal/testproc"
	"github.com/gpuslice/gpuslice/test/realnode"
)

// manifestFile is the plain manifest the test applies: the k3s one with
// gpuslice-plugin, so that all three programs run from it.
const manifestFile = "gpuslice-k3s-plugin.yaml"

// The ports the manifests' programs listen on (the chart's defaults).
var manifestPorts = map[string]int{"exporter": 9846, "tuner": 9847, "plugin": 9848}

// TestManifestsInstall applies deploy/manifests/gpuslice-k3s-plugin.yaml, the
// file `kubectl apply -f` users get, on the real node with the image built
// here, after the same node preparation as TestHelmInstall (the NVIDIA
// runtime class, the GPU node label). The objects are created as they are
// in the file, with two changes this node needs and a k3s node does not:
// host networking and the API server's address (no pod network here). The
// kubelet paths are the manifests' defaults: /var/lib/kubelet/pod-resources
// is linked to this kubelet's. It proves what TestHelmInstall does for the
// chart: the three programs run from the image as their ServiceAccounts,
// the exporter and plugin under NVIDIA's runtime; gpuslice-plugin registers;
// the exporter reads the GPU through NVML and attributes a fake-CUDA pod; the
// tuner, under the file's RBAC, holds its Lease, reads the plugin's config
// and decides from the exporter's metrics; nothing is refused by the API
// server. Deleting the objects takes the devices away again.
func TestManifestsInstall(t *testing.T) {
	n := need(t)
	ctx := context.Background()
	image := gpusliceImage(t)
	for comp, port := range manifestPorts {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("the manifests' %s listens on port %d of the node's network, which is taken on this machine: %v", comp, port, err)
		}
		l.Close()
	}
	prepareGPUNode(t)
	linkPodResources(t)

	// As the file's header says: the namespace first, then the file. Other
	// tests use the namespace too (the tuner's Lease, a plugin ConfigMap):
	// this install starts from none.
	removeInstallNamespace(t)
	if _, err := n.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: installNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	objs := applyManifest(t, filepath.Join(realnode.Repo(), "deploy", "manifests", manifestFile), func(spec *corev1.PodSpec) {
		spec.HostNetwork = true
		spec.DNSPolicy = corev1.DNSClusterFirstWithHostNet
		for i := range spec.Containers {
			spec.Containers[i].Env = append(spec.Containers[i].Env, apiServerEnv(n)...)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			logInstalledPods(t)
		}
		deleteManifest(t, objs)
		removeInstallNamespace(t)
		untuneNode(t)
		waitAllocatable(t, gpuRes, 0, 60*time.Second)
	})

	pods := checkInstalled(t, image)
	waitAllocatable(t, gpuRes, 4, 90*time.Second)

	// The exporter's own page has no node label: that comes from the
	// scrape configuration.
	exporter := fmt.Sprintf("127.0.0.1:%d", manifestPorts["exporter"])
	runAttributed(t, "mf-a1", func(name string, labels map[string]string) (float64, string) {
		var want []string
		for k, v := range labels {
			if k != "node" {
				want = append(want, fmt.Sprintf("%s=%q", k, v))
			}
		}
		return scrapeValue(exporter, name, want...)
	})

	// The tuner: leader (its Lease, under the Role), the node's configured
	// replicas (the plugin's ConfigMap and the Node, under its Role and
	// ClusterRole) and a decision from the exporter's metrics (the exporter
	// pods it lists): dry run, so it holds at 4.
	tuner := fmt.Sprintf("127.0.0.1:%d", manifestPorts["tuner"])
	testproc.Eventually(t, 90*time.Second, time.Second, func() string {
		for _, c := range []struct {
			name   string
			labels []string
		}{
			{"gpuslice_tuner_leader", nil},
			{"gpuslice_tuner_replicas", []string{`node="` + n.Name + `"`, `resource="` + string(gpuRes) + `"`}},
			{"gpuslice_tuner_recommended_replicas", []string{`node="` + n.Name + `"`}},
		} {
			want := 4.0
			if c.name == "gpuslice_tuner_leader" {
				want = 1
			}
			if v, msg := scrapeValue(tuner, c.name, c.labels...); msg != "" || v != want {
				return fmt.Sprintf("tuner: %s%v = %v %s, want %v", c.name, c.labels, v, msg, want)
			}
		}
		return ""
	})
	noForbidden(t, pods)
}

// linkPodResources makes the manifests' default path of the kubelet's
// PodResources socket, /var/lib/kubelet/pod-resources, lead to this
// kubelet's (its root dir is elsewhere; the device-plugin directory is the
// default one already), until the end of the test.
func linkPodResources(t *testing.T) {
	t.Helper()
	const link = "/var/lib/kubelet/pod-resources"
	if err := os.Symlink(filepath.Dir(world.node.PodResourcesSock), link); err != nil {
		t.Fatalf("linking %s to this kubelet's: %v", link, err)
	}
	t.Cleanup(func() { os.Remove(link) })
}

// applyManifest creates every object of a plain-manifest file in the file's
// order, as `kubectl apply -f` does on a cluster that has none of them, with
// the strict field validation kubectl asks for; adapt changes the pod spec
// of each workload first. It returns the created objects.
func applyManifest(t *testing.T, file string, adapt func(*corev1.PodSpec)) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.Objects(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var created []*unstructured.Unstructured
	for _, o := range objs {
		u := o.Unstructured
		if spec, ok, _ := unstructured.NestedMap(u.Object, "spec", "template", "spec"); ok {
			var ps corev1.PodSpec
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &ps); err != nil {
				t.Fatalf("%s: %v", o, err)
			}
			adapt(&ps)
			m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&ps)
			if err != nil {
				t.Fatal(err)
			}
			if err := unstructured.SetNestedMap(u.Object, m, "spec", "template", "spec"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := resourceFor(t, u).Create(context.Background(), u, metav1.CreateOptions{FieldValidation: "Strict", FieldManager: "kubectl-client-side-apply"}); err != nil {
			t.Fatalf("creating %s: %v", o, err)
		}
		created = append(created, u)
	}
	return created
}

// deleteManifest deletes what applyManifest created, last first, and waits
// until the install namespace has no pods left.
func deleteManifest(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	bg := metav1.DeletePropagationBackground
	for _, u := range slices.Backward(objs) {
		if err := resourceFor(t, u).Delete(ctx, u.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	testproc.Eventually(t, 2*time.Minute, 500*time.Millisecond, func() string {
		list, err := world.node.Client.CoreV1().Pods(installNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		if len(list.Items) > 0 {
			return fmt.Sprintf("%d pods left in %s", len(list.Items), installNS)
		}
		return ""
	})
}

var apiClients struct {
	once   sync.Once
	mapper meta.RESTMapper
	dyn    dynamic.Interface
	err    error
}

// resourceFor is the dynamic client of an object's resource, in its
// namespace (installNS when the file leaves it out) when it has one.
func resourceFor(t *testing.T, u *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	c := &apiClients
	c.once.Do(func() {
		dc, err := discovery.NewDiscoveryClientForConfig(world.node.Config)
		if err != nil {
			c.err = err
			return
		}
		c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
		c.dyn, c.err = dynamic.NewForConfig(world.node.Config)
	})
	if c.err != nil {
		t.Fatal(c.err)
	}
	gvk := u.GroupVersionKind()
	mapping, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s: %v", gvk, err)
	}
	if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		return c.dyn.Resource(mapping.Resource)
	}
	ns := u.GetNamespace()
	if ns == "" {
		ns = installNS
	}
	return c.dyn.Resource(mapping.Resource).Namespace(ns)
}

// scrapeValue is the value of the series name with labels (`key="value"`
// pairs) on the metrics page at addr, or why there is none.
func scrapeValue(addr, name string, labels ...string) (float64, string) {
	body, err := scrape(addr)
	if err != nil {
		return 0, err.Error()
	}
	s, ok := sample(body, name, labels...)
	if !ok {
		return 0, fmt.Sprintf("no series %s%v at %s", name, labels, addr)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Sprintf("%s%v: %v", name, labels, err)
	}
	return v, ""
}

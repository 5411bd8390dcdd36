package realnode_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/gpu/sim"
	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/testproc"
	"github.com/gpuslice/gpuslice/test/realnode"
	"github.com/gpuslice/gpuslice/test/simgpu"
)

const (
	gib        = int64(1) << 30
	gpuUUID    = "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348"
	gpuName    = "NVIDIA RTX A6000"
	gpuTotal   = uint64(48 * gib)
	workImage  = "gpuslice.local/fakecuda:test"
	gpuRes     = corev1.ResourceName("nvidia.com/gpu")
	namespace  = "default"
	simGPUPath = simgpu.DefaultDir
)

// world is the node every test of this package shares: one per machine.
var world struct {
	node   *realnode.Node
	driver *simgpu.Driver
	err    error

	imageOnce sync.Once
	imageErr  error
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // every test skips itself
	}
	// Up may first wait for NVIDIA's runtime to build (cold: minutes).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	world.node, world.err = realnode.Up(ctx, testenv.AssetsDir())
	cancel()
	if world.err == nil {
		world.driver, world.err = simgpu.Start(simGPUPath, sim.File{DriverVersion: "580.95.05", GPUs: []sim.GPU{{
			UUID: gpuUUID, Name: gpuName, MemoryTotalBytes: gpuTotal, TemperatureCelsius: 55, PowerWatts: 120,
		}}})
	}
	code := m.Run()
	if world.driver != nil {
		world.driver.Close()
	}
	if world.node != nil {
		if err := world.node.Down(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// need returns the node, skipping under -short and failing when it could
// not be started.
func need(t *testing.T) *realnode.Node {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: no real node")
	}
	if world.err != nil {
		t.Fatalf("the real node did not start: %v", world.err)
	}
	world.imageOnce.Do(func() {
		bin := testproc.BuildStatic(t, "test/simgpu/fakecuda")
		world.imageErr = world.node.ImportImage(context.Background(), workImage, "/fakecuda", bin+"=/fakecuda")
	})
	if world.imageErr != nil {
		t.Fatal(world.imageErr)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- node conditions ---\n%s", nodeConditions(world.node))
			t.Logf("--- kubelet log (last 40 lines) ---\n%s", testproc.Tail(world.node.KubeletLog(), 40))
		}
	})
	return world.node
}

// podOpts shape a fake-CUDA pod.
type podOpts struct {
	gpus          int64
	args          []string
	restart       corev1.RestartPolicy
	qos           corev1.PodQOSClass
	containerName string
	labels        map[string]string
}

// fakeCUDAPod is a pod running test/simgpu/fakecuda with args on nGPUs
// replicas, mounting the simulated GPU driver the way the NVIDIA container
// toolkit mounts /dev/nvidia*.
func fakeCUDAPod(name string, o podOpts) *corev1.Pod {
	if o.gpus == 0 {
		o.gpus = 1
	}
	if o.restart == "" {
		o.restart = corev1.RestartPolicyAlways
	}
	if o.containerName == "" {
		o.containerName = "cuda"
	}
	res := corev1.ResourceRequirements{Limits: corev1.ResourceList{gpuRes: *resource.NewQuantity(o.gpus, resource.DecimalSI)}}
	switch o.qos {
	case corev1.PodQOSGuaranteed:
		res.Limits[corev1.ResourceCPU] = resource.MustParse("50m")
		res.Limits[corev1.ResourceMemory] = resource.MustParse("64Mi")
		res.Requests = res.Limits.DeepCopy()
	case corev1.PodQOSBurstable:
		res.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
	}
	dirType := corev1.HostPathDirectory
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: o.labels},
		Spec: corev1.PodSpec{
			RestartPolicy:                 o.restart,
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name:            o.containerName,
				Image:           workImage,
				ImagePullPolicy: corev1.PullNever,
				Args:            o.args,
				Resources:       res,
				VolumeMounts:    []corev1.VolumeMount{{Name: "nvidia", MountPath: simGPUPath}},
			}},
			Volumes: []corev1.Volume{{Name: "nvidia", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: simGPUPath, Type: &dirType},
			}}},
		},
	}
}

func createPod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	n := need(t)
	ctx := context.Background()
	p, err := n.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", pod.Name, err)
	}
	t.Cleanup(func() { deletePod(t, pod.Name) })
	return p
}

// deletePod deletes a pod at once and waits until the kubelet has removed
// it (its replica IDs are free again then).
func deletePod(t *testing.T, name string) {
	t.Helper()
	n := world.node
	ctx := context.Background()
	zero := int64(0)
	err := n.Client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("deleting pod %s: %v", name, err)
		return
	}
	testproc.Eventually(t, 60*time.Second, 200*time.Millisecond, func() string {
		_, err := n.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return ""
		}
		return fmt.Sprintf("pod %s not gone (%v)", name, err)
	})
}

func getPod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := world.node.Client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting pod %s: %v", name, err)
	}
	return p
}

// waitRunning waits for every container of the pod to be running.
func waitRunning(t *testing.T, name string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	testproc.Eventually(t, timeout, 200*time.Millisecond, func() string {
		pod = getPod(t, name)
		if pod.Status.Phase != corev1.PodRunning {
			return fmt.Sprintf("pod %s is %s (%s)", name, pod.Status.Phase, podWhy(pod))
		}
		for _, c := range pod.Status.ContainerStatuses {
			if c.State.Running == nil {
				return fmt.Sprintf("pod %s container %s not running (%s)", name, c.Name, podWhy(pod))
			}
		}
		return ""
	})
	return pod
}

func podWhy(p *corev1.Pod) string {
	var why []string
	if p.Status.Reason != "" {
		why = append(why, p.Status.Reason+": "+p.Status.Message)
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			why = append(why, string(c.Type)+": "+c.Message)
		}
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Waiting != nil {
			why = append(why, c.Name+" waiting: "+c.State.Waiting.Reason+" "+c.State.Waiting.Message)
		}
		if c.State.Terminated != nil {
			why = append(why, fmt.Sprintf("%s terminated: %s exit %d", c.Name, c.State.Terminated.Reason, c.State.Terminated.ExitCode))
		}
	}
	return strings.Join(why, "; ")
}

// allocatable is the node's allocatable count of the GPU resource as the
// kubelet last reported it in Node.status.
func allocatable(t *testing.T, res corev1.ResourceName) int64 {
	t.Helper()
	a, _ := nodeDevices(t, res)
	return a
}

// nodeDevices reads res from the Node's status: allocatable (the healthy
// devices) and capacity (healthy and unhealthy).
func nodeDevices(t *testing.T, res corev1.ResourceName) (allocatable, capacity int64) {
	t.Helper()
	node, err := world.node.Client.CoreV1().Nodes().Get(context.Background(), world.node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, c := node.Status.Allocatable[res], node.Status.Capacity[res]
	return a.Value(), c.Value()
}

func waitAllocatable(t *testing.T, res corev1.ResourceName, want int64, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	testproc.Eventually(t, timeout, 100*time.Millisecond, func() string {
		if got := allocatable(t, res); got != want {
			return fmt.Sprintf("Node.status.allocatable[%s] = %d, want %d", res, got, want)
		}
		return ""
	})
	return time.Since(start)
}

// writeConfig writes an NVIDIA-format device-plugin config with replicas
// time-slicing replicas of nvidia.com/gpu (1: no sharing section).
func writeConfig(t *testing.T, path string, replicas int) {
	t.Helper()
	cfg := "version: v1\nflags:\n  migStrategy: none\n"
	if replicas > 1 {
		cfg += fmt.Sprintf("sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: %d\n", replicas)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startPlugin runs gpuslice-plugin on the node with a config file of
// replicas, reading the simulated GPU.
func startPlugin(t *testing.T, configFile string, extra ...string) (*testproc.Process, string) {
	t.Helper()
	n := need(t)
	settleDevices(t)
	addr := testproc.FreeAddr(t)
	p := testproc.Start(t, "gpuslice-plugin", gpuEnv(t), testproc.Build(t, "cmd/plugin"),
		append(append(gpuArgs(t),
			"--web.listen-address="+addr,
			"--device-plugin.path="+n.DevicePluginDir,
			"--kubelet.pod-resources-socket="+n.PodResourcesSock,
			"--kubelet.pod-resources-interval=1s",
			"--health.interval=1s",
			"--config-file="+configFile,
			"--node-name="+n.Name), extra...)...)
	return p, addr
}

// settleDevices waits until Node.status shows no GPU of a device plugin
// that has gone, and registers the same wait for the end of the test. The
// kubelet marks a stopped plugin's devices unhealthy at once, but
// Node.status keeps the old allocatable until its next status update (up to
// nodeStatusUpdateFrequency, 10 s): a plugin started meanwhile looks
// registered at once, and the scheduler binds pods the kubelet then rejects
// with UnexpectedAdmissionError ("no healthy devices present").
func settleDevices(t *testing.T) {
	t.Helper()
	waitAllocatable(t, gpuRes, 0, 60*time.Second)
	t.Cleanup(func() { waitAllocatable(t, gpuRes, 0, 60*time.Second) })
}

// startExporter runs gpuslice-exporter on the node.
func startExporter(t *testing.T, extra ...string) (*testproc.Process, string) {
	t.Helper()
	n := need(t)
	addr := testproc.FreeAddr(t)
	p := testproc.Start(t, "gpuslice-exporter", gpuEnv(t), testproc.Build(t, "cmd/exporter"),
		append(append(gpuArgs(t),
			"--web.listen-address="+addr,
			"--kubelet.pod-resources-socket="+n.PodResourcesSock,
			"--pods.source=apiserver",
			"--kubeconfig="+n.Kubeconfig,
			"--node-name="+n.Name,
			"--path.pod-logs="+n.PodLogsDir), extra...)...)
	testproc.Eventually(t, 30*time.Second, 100*time.Millisecond, func() string {
		if _, err := scrape(addr); err != nil {
			return err.Error()
		}
		return ""
	})
	return p, addr
}

// gpuArgs and gpuEnv put the programs on the GPU path users run: NVML
// through go-nvml's dlopen, here of the libnvidia-ml.so.1 made from the
// simulated driver's file.
func gpuArgs(t *testing.T) []string {
	nvmlLib(t)
	return []string{"--gpu.backend=nvml"}
}

func gpuEnv(t *testing.T) []string {
	return []string{"LD_LIBRARY_PATH=" + filepath.Dir(nvmlLib(t)), "GPUSLICE_SIM_FILE=" + world.driver.SimFile()}
}

// nvmlLib is the simulated libnvidia-ml.so.1, built by hack/libnvml.sh
// when missing or stale.
func nvmlLib(t *testing.T) string { return testproc.Hack(t, "libnvml.sh") }

func scrape(addr string) (string, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	return string(b), nil
}

// nodeConditions is the node's conditions and taints, one per line: the
// first thing to read when every pod stays Pending (a DiskPressure taint on a
// full test machine, say).
func nodeConditions(n *realnode.Node) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	node, err := n.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("getting node %s: %v", n.Name, err)
	}
	var b strings.Builder
	for _, c := range node.Status.Conditions {
		fmt.Fprintf(&b, "%s=%s %s: %s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, taint := range node.Spec.Taints {
		fmt.Fprintf(&b, "taint %s:%s\n", taint.Key, taint.Effect)
	}
	return b.String()
}

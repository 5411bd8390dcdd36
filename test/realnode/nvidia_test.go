package realnode_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/internal/testproc"
	"github.com/gpuslice/gpuslice/test/realnode"
)

const (
	nvidiaImage = "gpuslice.local/nvidia-device-plugin:v0.19.0"
	nvidiaNS    = "nvidia-device-plugin"
	nvidiaCM    = "nvidia-device-plugin-configs"
	nvidiaDS    = "nvidia-device-plugin"
	configLbl   = "nvidia.com/device-plugin.config"
	// driverRoot is the host directory mounted at /driver-root, where
	// NVIDIA's plugin looks for libnvidia-ml.so.1 (its --driver-root-ctr-path
	// default), as NVIDIA's chart mounts the host's driver root.
	driverRoot = simGPUPath + "/driver-root"
)

func sharedConfig(replicas int) string {
	return fmt.Sprintf(`version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: %d
`, replicas)
}

// nvidiaImageOnce builds the image of NVIDIA's plugin and config-manager
// (v0.19.0, built by hack/nvidia-bins.sh) with the libraries they link, and
// lays the simulated libnvidia-ml.so.1 out under the driver root.
func nvidiaSetup(t *testing.T) {
	t.Helper()
	n := need(t)
	lib := nvmlLib(t)
	bins := testproc.Hack(t, "nvidia-bins.sh")
	var files []string
	for _, b := range []string{"nvidia-device-plugin", "config-manager"} {
		files = append(files, filepath.Join(bins, b)+"=/usr/bin/"+b)
	}
	// The library's own needs go into the image: it is loaded into the
	// plugin's process, which sees the image's libc.
	files = append(files, lib+"=/usr/lib/gpuslice-sim/libnvidia-ml.so.1")
	if err := n.ImportImageWithLibs(context.Background(), nvidiaImage, "/usr/bin/nvidia-device-plugin", files...); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(driverRoot, "usr", "lib", "x86_64-linux-gnu", "libnvidia-ml.so.1")
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, lib, dst)
	ensureNamespace(t, nvidiaNS)
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// nvidiaDaemonSet is NVIDIA's chart's DaemonSet in config-manager form:
// config-manager as init container (oneshot) and sidecar (signals the
// plugin through the shared PID namespace), the configs from a real
// ConfigMap volume. With withConfigManager false it is the plain form that
// restart mode drives: the plugin reads one key of the ConfigMap.
// hostNetwork and a mounted kubeconfig stand in for the pod network and
// service-account tokens this node does not have.
func nvidiaDaemonSet(n *realnode.Node, withConfigManager bool, plainKey string) *appsv1.DaemonSet {
	hostDir := corev1.HostPathDirectory
	env := func(kv ...string) []corev1.EnvVar {
		out := []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "KUBECONFIG", Value: n.Kubeconfig}}
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, corev1.EnvVar{Name: kv[i], Value: kv[i+1]})
		}
		return out
	}
	cmEnv := func(oneshot, signal string) []corev1.EnvVar {
		return env("ONESHOT", oneshot, "NODE_LABEL", configLbl, "CONFIG_FILE_SRCDIR", "/available-configs",
			"CONFIG_FILE_DST", "/config/config.yaml", "DEFAULT_CONFIG", "", "FALLBACK_STRATEGIES", "named,single",
			"SEND_SIGNAL", signal, "SIGNAL", "1", "PROCESS_TO_SIGNAL", "nvidia-device-plugin")
	}
	mounts := []corev1.VolumeMount{
		{Name: "device-plugin", MountPath: "/var/lib/kubelet/device-plugins"},
		{Name: "driver-root", MountPath: "/driver-root", ReadOnly: true},
		{Name: "sim", MountPath: simGPUPath, ReadOnly: true},
		{Name: "kubeconfig", MountPath: filepath.Dir(filepath.Dir(n.Kubeconfig)), ReadOnly: true},
		{Name: "available-configs", MountPath: "/available-configs"},
		{Name: "config", MountPath: "/config"},
	}
	configFile := "/config/config.yaml"
	if !withConfigManager {
		configFile = "/available-configs/" + plainKey
	}
	plugin := corev1.Container{
		Name: "nvidia-device-plugin-ctr", Image: nvidiaImage, ImagePullPolicy: corev1.PullNever,
		Command: []string{"nvidia-device-plugin"},
		Env: env("CONFIG_FILE", configFile, "FAIL_ON_INIT_ERROR", "true",
			"GPUSLICE_SIM_FILE", simGPUPath+"/gpus.yaml", "NVIDIA_MIG_MONITOR_DEVICES", "all"),
		VolumeMounts: mounts,
	}
	spec := corev1.PodSpec{
		HostNetwork:           true,
		ShareProcessNamespace: ptr(true),
		NodeSelector:          map[string]string{"kubernetes.io/hostname": n.Name},
		Containers:            []corev1.Container{plugin},
		Volumes: []corev1.Volume{
			{Name: "device-plugin", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: n.DevicePluginDir}}},
			{Name: "driver-root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: driverRoot, Type: &hostDir}}},
			{Name: "sim", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: simGPUPath, Type: &hostDir}}},
			{Name: "kubeconfig", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: filepath.Dir(filepath.Dir(n.Kubeconfig)), Type: &hostDir}}},
			{Name: "available-configs", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: nvidiaCM}}}},
			{Name: "config", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		},
	}
	if withConfigManager {
		cm := corev1.Container{Name: "config-manager", Image: nvidiaImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"config-manager"}, VolumeMounts: mounts}
		initC := cm
		initC.Name = "config-manager-init"
		initC.Env = cmEnv("true", "false")
		cm.Env = cmEnv("false", "true")
		spec.InitContainers = []corev1.Container{initC}
		spec.Containers = append(spec.Containers, cm)
	}
	labels := map[string]string{"app": nvidiaDS}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: nvidiaNS, Name: nvidiaDS},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}
}

func ptr[T any](v T) *T { return &v }

// runNVIDIA creates the ConfigMap and DaemonSet and removes them (and the
// node's label) when the test ends.
func runNVIDIA(t *testing.T, configs map[string]string, ds *appsv1.DaemonSet) {
	t.Helper()
	n := world.node
	ctx := context.Background()
	if _, err := n.Client.CoreV1().ConfigMaps(nvidiaNS).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: nvidiaNS, Name: nvidiaCM}, Data: configs}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Client.AppsV1().DaemonSets(nvidiaNS).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logNVIDIAPods(t)
		}
		fg := metav1.DeletePropagationForeground
		_ = n.Client.AppsV1().DaemonSets(nvidiaNS).Delete(ctx, nvidiaDS, metav1.DeleteOptions{PropagationPolicy: &fg})
		_ = n.Client.CoreV1().ConfigMaps(nvidiaNS).Delete(ctx, nvidiaCM, metav1.DeleteOptions{})
		testproc.Eventually(t, 60*time.Second, 200*time.Millisecond, func() string {
			pods, _ := n.Client.CoreV1().Pods(nvidiaNS).List(ctx, metav1.ListOptions{})
			if len(pods.Items) > 0 {
				zero := int64(0)
				for _, p := range pods.Items {
					_ = n.Client.CoreV1().Pods(nvidiaNS).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
				}
				return fmt.Sprintf("%d NVIDIA plugin pods left", len(pods.Items))
			}
			return ""
		})
		setLabel(t, "")
		// NVIDIA's plugin leaves nvidia.com/gpu devices that the kubelet keeps
		// (unhealthy) until its next registration: wait for allocatable 0.
		resetAllocatable(t, n, gpuRes)
	})
}

// resetAllocatable waits for the kubelet to count none of res allocatable
// once the plugins serving it are gone, as every later test starts from.
// Once (a CI run of 2026-11-27, after TestTunerDrivesNVIDIAConfigManager)
// the kubelet still counted the last NVIDIA plugin's 2 devices a minute
// after its pod was gone, and each later test that starts from 0 failed on
// it. Then what the device-plugin directory holds is logged and the kubelet
// restarted, which leaves it no plugin registered; a count that is still
// not 0 after that fails the test.
func resetAllocatable(t *testing.T, n *realnode.Node, res corev1.ResourceName) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got := allocatable(t, res)
		if got == 0 {
			return
		}
		if time.Now().After(deadline) {
			var names []string
			entries, err := os.ReadDir(n.DevicePluginDir)
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Logf("allocatable[%s] = %d a minute after its plugins' pods were gone (%s holds %v, %v); restarting the kubelet", res, got, n.DevicePluginDir, names, err)
			break
		}
	}
	if err := n.RestartKubelet(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitAllocatable(t, res, 0, 60*time.Second)
}

func logNVIDIAPods(t *testing.T) {
	pods, err := world.node.Client.CoreV1().Pods(nvidiaNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		t.Logf("NVIDIA pod %s: %s (%s)", p.Name, p.Status.Phase, podWhy(p))
		for _, c := range []string{"config-manager-init", "nvidia-device-plugin-ctr", "config-manager"} {
			if l := containerLog(t, p, c); l != "" {
				t.Logf("--- %s/%s (last 25 lines) ---\n%s", p.Name, c, testproc.Tail(l, 25))
			}
		}
	}
}

func setLabel(t *testing.T, value string) {
	t.Helper()
	labelNode(t, configLbl, value)
}

// TestNVIDIAConfigManagerLabelFlip: NVIDIA's own plugin and config-manager
// on the real node, against the simulated libnvidia-ml. An unlabelled node
// starts on the single config; flipping the node's label to another key
// makes config-manager switch the file and signal the plugin, which
// re-registers with the new count.
func TestNVIDIAConfigManagerLabelFlip(t *testing.T) {
	nvidiaSetup(t)
	runNVIDIA(t, map[string]string{"shared-2": sharedConfig(2)}, nvidiaDaemonSet(world.node, true, ""))
	d := waitAllocatable(t, gpuRes, 2, 120*time.Second)
	t.Logf("NVIDIA's plugin, unlabelled node, single config: allocatable 2 after %v", d.Round(100*time.Millisecond))

	// A second key: the `single` fallback no longer applies to an
	// unlabelled node, so the label must name the key.
	ctx := context.Background()
	cm, err := world.node.Client.CoreV1().ConfigMaps(nvidiaNS).Get(ctx, nvidiaCM, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["shared-4"] = sharedConfig(4)
	if _, err := world.node.Client.CoreV1().ConfigMaps(nvidiaNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The kubelet refreshes ConfigMap volumes on its sync period (up to a
	// minute and more): flipping the label before the key is in the volume
	// makes config-manager fail ("specified config … does not exist").
	keyInVolume := func() string {
		pods, _ := world.node.Client.CoreV1().Pods(nvidiaNS).List(ctx, metav1.ListOptions{})
		for _, p := range pods.Items {
			m, _ := filepath.Glob(filepath.Join(world.node.KubeletRootDir, "pods", string(p.UID), "volumes", "kubernetes.io~configmap", "available-configs", "shared-4"))
			if len(m) == 1 {
				return ""
			}
		}
		return "key shared-4 not yet in the pod's ConfigMap volume"
	}
	start := time.Now()
	testproc.Eventually(t, 180*time.Second, 500*time.Millisecond, keyInVolume)
	t.Logf("ConfigMap update reached the pod's volume after %v", time.Since(start).Round(100*time.Millisecond))
	start = time.Now()
	setLabel(t, "shared-4")
	d = waitAllocatable(t, gpuRes, 4, 120*time.Second)
	t.Logf("label flip → NVIDIA's plugin advertising 4 in Node.status after %v", time.Since(start).Round(100*time.Millisecond))
	_ = d
	// Pods get NVIDIA's allocation (NVIDIA_VISIBLE_DEVICES = the GPU's UUID)
	// and run on the simulated GPU.
	p := createPod(t, fakeCUDAPod("nv-a", podOpts{args: []string{"-memory", "0s=1Gi", "-print-env"}}))
	p = waitRunning(t, p.Name, 60*time.Second)
	testproc.Eventually(t, 20*time.Second, 200*time.Millisecond, func() string {
		if l := containerLog(t, p, "cuda"); !strings.Contains(l, "env NVIDIA_VISIBLE_DEVICES="+gpuUUID) {
			return "container log lacks NVIDIA_VISIBLE_DEVICES=" + gpuUUID + ":\n" + l
		}
		return ""
	})
}

// TestNVIDIARestartMode: the plain DaemonSet reads one key; restart mode
// rewrites that key and restarts the DaemonSet the way `kubectl rollout
// restart` does, and the new pod advertises the new count.
func TestNVIDIARestartMode(t *testing.T) {
	nvidiaSetup(t)
	runNVIDIA(t, map[string]string{"config.yaml": sharedConfig(2)}, nvidiaDaemonSet(world.node, false, "config.yaml"))
	waitAllocatable(t, gpuRes, 2, 120*time.Second)
	ctx := context.Background()
	cm, err := world.node.Client.CoreV1().ConfigMaps(nvidiaNS).Get(ctx, nvidiaCM, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["config.yaml"] = sharedConfig(3)
	if _, err := world.node.Client.CoreV1().ConfigMaps(nvidiaNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
	if _, err := world.node.Client.AppsV1().DaemonSets(nvidiaNS).Patch(ctx, nvidiaDS, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			t.Fatal("DaemonSet gone")
		}
		t.Fatal(err)
	}
	waitAllocatable(t, gpuRes, 3, 180*time.Second)
	t.Logf("restart mode: key rewritten + rollout restart → allocatable 3 after %v", time.Since(start).Round(100*time.Millisecond))
}

// TestTunerDrivesNVIDIAConfigManager: gpuslice-tuner in config-manager mode
// against NVIDIA's own DaemonSet (config-manager init + sidecar, plugin)
// on the real node. The user's ConfigMap holds one key, which NVIDIA's
// `single` fallback gives the unlabelled node. With every replica taken
// and headroom to spare, the tuner writes its named config and a `default`
// copy of the user's key, waits its propagation delay for the kubelet to
// refresh the ConfigMap volume, then moves the node's label; NVIDIA's
// config-manager switches the file and signals the plugin, which
// advertises the raised count. Removing the label (a node the tuner never
// labelled) and restarting NVIDIA's pod still starts the plugin, on the
// `default` key, although the ConfigMap now has several keys.
func TestTunerDrivesNVIDIAConfigManager(t *testing.T) {
	nvidiaSetup(t)
	untuneNode(t)
	t.Cleanup(func() { untuneNode(t) })
	n := world.node
	ctx := context.Background()
	runNVIDIA(t, map[string]string{"default": sharedConfig(2)}, nvidiaDaemonSet(n, true, ""))
	waitAllocatable(t, gpuRes, 2, 120*time.Second)
	for _, name := range []string{"cm-a1", "cm-a2"} {
		createPod(t, fakeCUDAPod(name, podOpts{args: []string{"-memory", "0s=4Gi", "-sm", "0.2"}}))
	}
	for _, name := range []string{"cm-a1", "cm-a2"} {
		waitRunning(t, name, 60*time.Second)
	}
	_, exporter := startExporter(t)
	ensureNamespace(t, "gpuslice")
	cfg := filepath.Join(t.TempDir(), "tuner.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`interval: 1s
leaderElection: {namespace: gpuslice, name: realnode-tuner-cm}
signals:
  source: exporters
  exporters:
    targets: [{node: %s, url: "http://%s/metrics"}]
    timeout: 2s
apply:
  mode: config-manager
  configMap: {namespace: %s, name: %s}
  key: default
  daemonSet: {namespace: %s, name: %s}
  verifyTimeout: 120s
`+tunerPolicy(3), n.Name, exporter, nvidiaNS, nvidiaCM, nvidiaNS, nvidiaDS)), 0o644); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	tuner := testproc.Start(t, "gpuslice-tuner", nil, testproc.Build(t, "cmd/tuner"), "run", "--config="+cfg,
		"--kubeconfig="+n.Kubeconfig, "--web.listen-address="+testproc.FreeAddr(t))
	testproc.Eventually(t, 240*time.Second, time.Second, func() string {
		if l := configLabel(t); l != "gpuslice-3" {
			return fmt.Sprintf("node label %q, want gpuslice-3", l)
		}
		return ""
	})
	labelled := time.Since(began)
	waitAllocatable(t, gpuRes, 3, 120*time.Second)
	t.Logf("tuner start → label gpuslice-3 after %v (its propagation delay included) → NVIDIA's plugin advertising 3 in Node.status after %v",
		labelled.Round(time.Second), (time.Since(began) - labelled).Round(100*time.Millisecond))
	cm, err := n.Client.CoreV1().ConfigMaps(nvidiaNS).Get(ctx, nvidiaCM, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cm.Data) < 2 || cm.Data["default"] == "" {
		t.Fatalf("ConfigMap keys after the raise: %v, want the user's default and gpuslice-3", keysOf(cm.Data))
	}

	// A node the tuner never labelled: NVIDIA's pod restarted without the
	// label must still find its config among several keys. The tuner is
	// stopped first: it would give the unlabelled node, every replica of
	// its 2 taken, a spare again.
	if err := tuner.Stop(); err != nil {
		t.Logf("stopping the tuner: %v", err)
	}
	setLabel(t, "")
	zero := int64(0)
	pods, err := n.Client.CoreV1().Pods(nvidiaNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if err := n.Client.CoreV1().Pods(nvidiaNS).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
	// The old pod's devices go (allocatable 3 → 0 at the kubelet's next
	// status), the new one advertises the default key's 2.
	waitAllocatable(t, gpuRes, 2, 180*time.Second)
}

func keysOf(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

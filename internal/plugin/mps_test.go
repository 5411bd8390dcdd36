package plugin

import (
	"fmt"
	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
	"github.com/gpuslice/gpuslice/internal/mps"
)

func mpsConfig(replicas int, extra ...string) string {
	return fmt.Sprintf("version: v1\nsharing:\n  mps:\n%s    resources:\n    - name: nvidia.com/gpu\n      replicas: %d\n",
		strings.Join(extra, ""), replicas)
}

// startMPSDaemon lays out what a started control daemon for resource
// leaves under root, as NVIDIA's mps-control-daemon does.
func startMPSDaemon(t *testing.T, root, resource string) {
	t.Helper()
	for _, d := range []string{mps.PipeDir(root, resource), mps.LogDir(root, resource), mps.ShmDir(root)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(mps.StartedFile(root, resource), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func allocate(t *testing.T, e *endpoint, devs ...string) (*pluginapi.ContainerAllocateResponse, error) {
	t.Helper()
	resp, err := e.client.Allocate(t.Context(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: devs}}})
	if err != nil {
		return nil, err
	}
	return resp.ContainerResponses[0], nil
}

func TestMPSAllocate(t *testing.T) {
	root := t.TempDir()
	startMPSDaemon(t, root, gpuRes)
	h := start(t, setup{config: mpsConfig(4), gpus: []gputest.GPUSpec{gputest.GPU(uuid0, 48<<30), gputest.GPU(uuid1, 24<<30)}, mpsRoot: root})
	e := h.kubelet.endpoint(gpuRes)
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))

	r, err := allocate(t, e, rid(uuid0, 1))
	if err != nil {
		t.Fatal(err)
	}
	pipe := "/mps/nvidia.com/gpu/pipe"
	for k, v := range map[string]string{
		EnvVisibleDevices: uuid0, mps.EnvPipeDirectory: pipe, mps.EnvPinnedMemLimit: "0=12288M", mps.EnvThreadPercentage: "25",
	} {
		if r.Envs[k] != v {
			t.Errorf("%s = %q, want %q", k, r.Envs[k], v)
		}
	}
	var mounts []string
	for _, m := range r.Mounts {
		mounts = append(mounts, m.HostPath+" -> "+m.ContainerPath)
	}
	wantMounts := []string{filepath.Join(root, "nvidia.com/gpu/pipe") + " -> " + pipe, filepath.Join(root, "shm") + " -> /dev/shm"}
	if diff := cmp.Diff(wantMounts, mounts); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}

	// NVIDIA's MPS default: a container gets one replica.
	if _, err := allocate(t, e, rid(uuid0, 2), rid(uuid1, 0)); err == nil || !strings.Contains(err.Error(), "maximum request size for shared resources is 1; found 2") {
		t.Errorf("two replicas under MPS's default failRequestsGreaterThanOne: %v", err)
	}

	// Fewer replicas: containers started now get more, the running one
	// keeps its 12 GiB and is counted as holding an older limit.
	h.writeConfig(mpsConfig(2, "    failRequestsGreaterThanOne: false\n"))
	h.waitMetric("reloads", h.plugin.metrics.reloads, 2)
	r, err = allocate(t, e, rid(uuid0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if got, wantLimit := r.Envs[mps.EnvPinnedMemLimit], "0=24576M"; got != wantLimit {
		t.Errorf("after the change: limit %q, want %q", got, wantLimit)
	}
	err = testutil.GatherAndCompare(h.reg, strings.NewReader(fmt.Sprintf(`
# HELP gpuslice_plugin_mps_memory_limit_bytes Pinned device-memory limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) a container allocated now gets on a GPU shared through MPS: the GPU's memory / replicas, in whole MiB.
# TYPE gpuslice_plugin_mps_memory_limit_bytes gauge
gpuslice_plugin_mps_memory_limit_bytes{resource="nvidia.com/gpu",uuid="%[1]s"} %[3]d
gpuslice_plugin_mps_memory_limit_bytes{resource="nvidia.com/gpu",uuid="%[2]s"} %[4]d
# HELP gpuslice_plugin_mps_stale_limit_devices Device IDs in use on a GPU shared through MPS whose container started with another limit than gpuslice_plugin_mps_memory_limit_bytes (the replica count changed since): an MPS client keeps the limit it started with. Counts the allocations this plugin process made.
# TYPE gpuslice_plugin_mps_stale_limit_devices gauge
gpuslice_plugin_mps_stale_limit_devices{resource="nvidia.com/gpu",uuid="%[1]s"} 1
gpuslice_plugin_mps_stale_limit_devices{resource="nvidia.com/gpu",uuid="%[2]s"} 0
`, uuid0, uuid1, 24<<30, 12<<30)), "gpuslice_plugin_mps_memory_limit_bytes", "gpuslice_plugin_mps_stale_limit_devices")
	if err != nil {
		t.Error(err)
	}

	// A container on two GPUs gets the smaller share on both: which of
	// its CUDA ordinals is which GPU is not the plugin's to know.
	r, err = allocate(t, e, rid(uuid0, 1), rid(uuid1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if got, wantLimit := r.Envs[mps.EnvPinnedMemLimit], "0=12288M,1=12288M"; got != wantLimit {
		t.Errorf("two GPUs of 48 and 24 GiB at 2 replicas: limit %q, want %q", got, wantLimit)
	}
	if got := r.Envs[mps.EnvThreadPercentage]; got != "50" {
		t.Errorf("thread percentage %q, want 50", got)
	}
}

func TestMPSDaemonMissing(t *testing.T) {
	root := t.TempDir()
	h := start(t, setup{config: mpsConfig(2), gpus: twoSpecs(), mpsRoot: root})
	e := h.kubelet.endpoint(gpuRes)
	// No daemon: every replica unhealthy, and Allocate names what is
	// missing.
	unhealthy := strings.ReplaceAll(want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)), " ", "! ") + "!"
	h.kubelet.waitFor("unhealthy replicas", func() bool { return h.kubelet.latest(gpuRes) == unhealthy })
	_, err := allocate(t, e, rid(uuid0, 0))
	if err == nil || !strings.Contains(err.Error(), mps.StartedFile(root, gpuRes)) {
		t.Errorf("Allocate without a daemon: %v, want an error naming %s", err, mps.StartedFile(root, gpuRes))
	}
	startMPSDaemon(t, root, gpuRes)
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))
	if _, err := allocate(t, e, rid(uuid0, 0)); err != nil {
		t.Errorf("Allocate with the daemon up: %v", err)
	}
}

func TestMPSWithoutRootRefused(t *testing.T) {
	h := start(t, setup{config: config(2), gpus: twoSpecs()})
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))
	h.writeConfig(mpsConfig(2))
	h.waitMetric("reload failures", h.plugin.metrics.reloadFailures, 1)
}

// TestMPSBudgetIsTheLimit: under MPS the memory budget a container is told
// is its pinned limit, rounded down to MiB as the limit is, not the
// unrounded share above it.
func TestMPSBudgetIsTheLimit(t *testing.T) {
	f, err := dpconfig.Parse([]byte(mpsConfig(3)))
	if err != nil {
		t.Fatal(err)
	}
	const total = 48<<30 + 5<<20 + 7 // no whole MiB in a third of it
	gpus := []gpuInfo{{UUID: uuid0, Index: 0, MemoryTotalBytes: total, Healthy: true}}
	r, err := containerResponse(computePlan(f.Config(), gpus, nil), "nvidia.com/gpu", []string{rid(uuid0, 0)}, false, "req1")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Envs[EnvMemoryBudget], strconv.FormatUint(mps.MemoryLimit(total, 3), 10); got != want {
		t.Errorf("budget %s, want the pinned limit %s (the unrounded share is %d)", got, want, uint64(total)/3)
	}
}

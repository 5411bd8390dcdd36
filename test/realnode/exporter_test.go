package realnode_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/testproc"
	"github.com/gpuslice/gpuslice/test/simgpu"
)

// sample is the value of the series in a scrape whose name and labels
// contain all of want ("name{" prefix and `label="value"` pairs), and
// whether one was found.
func sample(scrape, name string, want ...string) (string, bool) {
	for _, line := range strings.Split(scrape, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, w := range want {
			if !strings.Contains(line, w) {
				ok = false
				break
			}
		}
		if ok {
			return line[strings.LastIndexByte(line, ' ')+1:], true
		}
	}
	return "", false
}

// TestExporterAttributesRealContainers: three pods of the three QoS classes
// (so the three cgroup layouts of the kubelet's cgroupfs driver) hold
// memory on the simulated GPU under the real PIDs of their containers; the
// exporter finds each through the real PodResources API, the real
// /proc/<pid>/cgroup and the pod informer, and a process outside any pod
// counts as unattributed.
func TestExporterAttributesRealContainers(t *testing.T) {
	need(t)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, cfg, 4)
	startPlugin(t, cfg)
	waitAllocatable(t, gpuRes, 4, 60*time.Second)

	pods := map[corev1.PodQOSClass]struct {
		name string
		gib  int64
	}{
		corev1.PodQOSGuaranteed: {"attr-guaranteed", 3},
		corev1.PodQOSBurstable:  {"attr-burstable", 5},
		corev1.PodQOSBestEffort: {"attr-besteffort", 7},
	}
	for qos, p := range pods {
		pod := createPod(t, fakeCUDAPod(p.name, podOpts{qos: qos, args: []string{"-memory", fmt.Sprintf("0s=%dGi", p.gib), "-sm", "0.2"}}))
		got := waitRunning(t, pod.Name, 60*time.Second)
		if got.Status.QOSClass != qos {
			t.Fatalf("pod %s has QoS %s, want %s", p.name, got.Status.QOSClass, qos)
		}
	}
	// A host process on the GPU, outside every pod.
	host, err := simgpu.Open(world.driver.Dir(), gpuUUID)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	if err := host.Alloc(uint64(2 * gib)); err != nil {
		t.Fatal(err)
	}

	_, addr := startExporter(t)
	testproc.Eventually(t, 60*time.Second, 500*time.Millisecond, func() string {
		s, err := scrape(addr)
		if err != nil {
			return err.Error()
		}
		for qos, p := range pods {
			labels := []string{`namespace="default"`, `pod="` + p.name + `"`, `container="cuda"`, `uuid="` + gpuUUID + `"`}
			v, ok := sample(s, "gpuslice_container_gpu_memory_used_bytes", labels...)
			if !ok || !sameFloat(v, p.gib*gib) {
				return fmt.Sprintf("%s pod %s: memory %q (found %v), want %d GiB\n%s", qos, p.name, v, ok, p.gib, grep(s, "gpuslice_container_gpu_memory_used_bytes"))
			}
			if v, ok := sample(s, "gpuslice_container_gpu_allocation", labels...); !ok || v != "1" {
				return fmt.Sprintf("%s pod %s: allocation %q (found %v), want 1\n%s", qos, p.name, v, ok, grep(s, "gpuslice_container_gpu_allocation"))
			}
		}
		if v, ok := sample(s, "gpuslice_unattributed_gpu_memory_used_bytes", `uuid="`+gpuUUID+`"`); !ok || !sameFloat(v, 2*gib) {
			return fmt.Sprintf("unattributed memory %q (found %v), want 2 GiB", v, ok)
		}
		if v, ok := sample(s, "gpuslice_gpu_replicas_allocated", `uuid="`+gpuUUID+`"`); !ok || v != "3" {
			return fmt.Sprintf("replicas allocated %q (found %v), want 3\n%s", v, ok, grep(s, "gpuslice_gpu_replicas"))
		}
		return ""
	})
}

func sameFloat(v string, want int64) bool {
	var f float64
	if _, err := fmt.Sscan(v, &f); err != nil {
		return false
	}
	return f == float64(want)
}

func grep(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// TestNVIDIAIgnoresRenameAndDevices: the tuner's NVIDIA modes expect a
// node's allocatable as NVIDIA's plugin (v0.19.0) reads the config: `rename`
// and `devices` in sharing.timeSlicing are ignored with a warning, every GPU
// is time-sliced, under <name>.shared with renameByDefault and under the
// name otherwise (internal/tuner/controller semantics, TestExpectedAllocatable).
// Expecting gpuslice-plugin's reading there failed verification and held
// the node for an hour.
func TestNVIDIAIgnoresRenameAndDevices(t *testing.T) {
	f := libnvmlScenario()
	f.GPUs = f.GPUs[:2]
	f.GPUs[0].XidEvents = nil
	uuids := []string{f.GPUs[0].UUID, f.GPUs[1].UUID}
	for _, tc := range []struct {
		name, timeSlicing, resource string
	}{
		{"rename and devices ignored", "    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: ['0']\n        replicas: 3\n",
			"nvidia.com/gpu"},
		{"renameByDefault honoured, devices ignored", "    renameByDefault: true\n    resources:\n      - name: nvidia.com/gpu\n        devices: 1\n        replicas: 3\n",
			"nvidia.com/gpu.shared"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			simFile := filepath.Join(t.TempDir(), "gpus.yaml")
			writeSim(t, simFile, f)
			config := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(config, []byte("version: v1\nsharing:\n  timeSlicing:\n"+tc.timeSlicing), 0o644); err != nil {
				t.Fatal(err)
			}
			dir, reqs, p := nvidiaPlugin(t, simFile, "--config-file="+config)
			_, lists := listAndWatchAs(t, dir, register(t, reqs, p), tc.resource)
			var want []string
			for _, u := range uuids {
				for n := range 3 {
					want = append(want, fmt.Sprintf("%s::%d Healthy", u, n))
				}
			}
			slices.Sort(want)
			nextList(t, lists, p, "3 replicas on both GPUs", func(got []string) bool { return slices.Equal(got, want) })
			if out := p.Output(); !strings.Contains(out, "not yet supported in the config. Ignoring") {
				t.Errorf("no warning about the ignored fields in NVIDIA's log:\n%s", out)
			}
		})
	}
}

// TestNVIDIAFailRequestsGreaterThanOneWording: gpuslice-plugin words a
// request over failRequestsGreaterThanOne as NVIDIA's plugin does
// (internal/plugin tooLargeError), so users find NVIDIA's documentation.
func TestNVIDIAFailRequestsGreaterThanOneWording(t *testing.T) {
	f := libnvmlScenario()
	f.GPUs = f.GPUs[:1]
	f.GPUs[0].XidEvents = nil
	simFile := filepath.Join(t.TempDir(), "gpus.yaml")
	writeSim(t, simFile, f)
	config := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(config, []byte("version: v1\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, reqs, p := nvidiaPlugin(t, simFile, "--config-file="+config)
	client, _ := listAndWatch(t, dir, register(t, reqs, p))
	ids := []string{f.GPUs[0].UUID + "::0", f.GPUs[0].UUID + "::1"}
	_, err := client.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	const want = "invalid request: maximum request size for shared resources is 1; found 2"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("NVIDIA's Allocate of two replicas: %v, want %q", err, want)
	}
}

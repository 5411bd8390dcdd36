package plugin

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
	"github.com/gpuslice/gpuslice/internal/podresources"
)

var (
	uuid0 = gputest.UUID(0)
	uuid1 = gputest.UUID(1)
)

func rid(uuid string, n int) string { return podresources.FormatDeviceID(uuid, n) }

func twoGPUs() []gpuInfo {
	return []gpuInfo{
		{UUID: uuid1, Index: 1, MemoryTotalBytes: 24 << 30, Healthy: true},
		{UUID: uuid0, Index: 0, MemoryTotalBytes: 48 << 30, Healthy: true},
	}
}

func shared(replicas int, mod ...func(*dpconfig.Config)) dpconfig.Config {
	c := dpconfig.Config{Version: "v1", MigStrategy: "none", Resources: []dpconfig.Resource{
		{Name: dpconfig.GPUResource, Devices: dpconfig.Devices{All: true}, Replicas: replicas}}}
	for _, m := range mod {
		m(&c)
	}
	return c
}

// listing renders a plan as "resource: id[!unhealthy][~draining] ..." lines.
func listing(p plan) string {
	var lines []string
	for _, name := range slices.Sorted(maps.Keys(p.Resources)) {
		var ids []string
		for _, d := range p.Resources[name] {
			s := d.ID
			if !d.Healthy {
				s += "!"
			}
			if d.Draining {
				s += "~"
			}
			ids = append(ids, s)
		}
		lines = append(lines, name+": "+strings.Join(ids, " "))
	}
	return strings.Join(lines, "\n")
}

func ids(uuid string, from, to int) string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, rid(uuid, i))
	}
	return strings.Join(out, " ")
}

func TestComputePlan(t *testing.T) {
	tests := []struct {
		name string
		cfg  dpconfig.Config
		gpus []gpuInfo
		held []held
		want string
	}{
		{"no sharing: one ID per GPU", dpconfig.Config{Version: "v1"}, twoGPUs(), nil,
			"nvidia.com/gpu: " + uuid0 + " " + uuid1},
		{"four replicas, GPUs in index order", shared(4), twoGPUs(), nil,
			"nvidia.com/gpu: " + ids(uuid0, 0, 4) + " " + ids(uuid1, 0, 4)},
		{"renameByDefault", shared(2, func(c *dpconfig.Config) { c.RenameByDefault = true }), twoGPUs(), nil,
			"nvidia.com/gpu.shared: " + ids(uuid0, 0, 2) + " " + ids(uuid1, 0, 2)},
		{"rename", shared(2, func(c *dpconfig.Config) { c.Resources[0].Rename = "nvidia.com/gpu-small" }), twoGPUs(), nil,
			"nvidia.com/gpu-small: " + ids(uuid0, 0, 2) + " " + ids(uuid1, 0, 2)},
		{"devices by index: the other GPU stays exclusive", shared(3, func(c *dpconfig.Config) {
			c.Resources[0].Devices = dpconfig.Devices{List: []string{"1"}}
			c.RenameByDefault = true
		}), twoGPUs(), nil,
			"nvidia.com/gpu: " + uuid0 + "\nnvidia.com/gpu.shared: " + ids(uuid1, 0, 3)},
		{"devices by UUID", shared(2, func(c *dpconfig.Config) { c.Resources[0].Devices = dpconfig.Devices{List: []string{uuid0}} }), twoGPUs(), nil,
			"nvidia.com/gpu: " + ids(uuid0, 0, 2) + " " + uuid1},
		{"devices count", shared(2, func(c *dpconfig.Config) { c.Resources[0].Devices = dpconfig.Devices{Count: 1} }), twoGPUs(), nil,
			"nvidia.com/gpu: " + ids(uuid0, 0, 2) + " " + uuid1},
		{"MIG entries are ignored", shared(2, func(c *dpconfig.Config) {
			c.Resources = append(c.Resources, dpconfig.Resource{Name: "nvidia.com/mig-1g.5gb", Devices: dpconfig.Devices{All: true}, Replicas: 4})
		}), twoGPUs(), nil,
			"nvidia.com/gpu: " + ids(uuid0, 0, 2) + " " + ids(uuid1, 0, 2)},
		{"unhealthy GPU", shared(2), []gpuInfo{{UUID: uuid0, Index: 0, Healthy: false}}, nil,
			"nvidia.com/gpu: " + rid(uuid0, 0) + "! " + rid(uuid0, 1) + "!"},
		{"shrink: a held high ID takes a free low one's place", shared(2), twoGPUs(),
			[]held{{rid(uuid0, 3), "nvidia.com/gpu"}, {rid(uuid1, 1), "nvidia.com/gpu"}},
			"nvidia.com/gpu: " + rid(uuid0, 0) + " " + rid(uuid0, 3) + "~ " + ids(uuid1, 0, 2)},
		{"shrink below what is held: everything held stays", shared(2), twoGPUs()[1:],
			[]held{{rid(uuid0, 1), "nvidia.com/gpu"}, {rid(uuid0, 2), "nvidia.com/gpu"}, {rid(uuid0, 3), "nvidia.com/gpu"}},
			"nvidia.com/gpu: " + rid(uuid0, 1) + " " + rid(uuid0, 2) + "~ " + rid(uuid0, 3) + "~"},
		{"to exclusive with a replica held: the bare UUID waits", dpconfig.Config{Version: "v1"}, twoGPUs()[1:],
			[]held{{rid(uuid0, 2), "nvidia.com/gpu"}},
			"nvidia.com/gpu: " + rid(uuid0, 2) + "~"},
		{"rename with IDs held under the old name", shared(2, func(c *dpconfig.Config) { c.RenameByDefault = true }), twoGPUs()[1:],
			[]held{{rid(uuid0, 0), "nvidia.com/gpu"}},
			"nvidia.com/gpu: " + rid(uuid0, 0) + "~\nnvidia.com/gpu.shared: " + rid(uuid0, 0)},
		{"held IDs of unknown GPUs and non-GPU IDs are ignored", shared(2), twoGPUs()[1:],
			[]held{{rid(gputest.UUID(7), 0), "nvidia.com/gpu"}, {"MIG-abc", "nvidia.com/mig-1g.5gb"}},
			"nvidia.com/gpu: " + ids(uuid0, 0, 2)},
		{"no GPUs", shared(4), nil, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := listing(computePlan(tc.cfg, tc.gpus, tc.held))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// Every device strategy of NVIDIA's is followed; only an annotation prefix
// no runtime would read is worth a warning.
func TestComputePlanDeviceStrategies(t *testing.T) {
	cfg := shared(2, func(c *dpconfig.Config) {
		c.DeviceListStrategy, c.DeviceIDStrategy = []string{"envvar", "cdi-cri"}, "index"
	})
	p := computePlan(cfg, twoGPUs(), nil)
	if len(p.Warnings) != 0 {
		t.Errorf("warnings %q, want none", p.Warnings)
	}
	if want := (injection{EnvVar: true, CDICRI: true, ByIndex: true, AnnotationPrefix: DefaultCDIAnnotationPrefix}); p.Inject != want {
		t.Errorf("injection = %+v, want %+v", p.Inject, want)
	}
	p = computePlan(shared(2, func(c *dpconfig.Config) {
		c.DeviceListStrategy, c.CDIAnnotationPrefix = []string{"cdi-annotations"}, "cdi.example.com"
	}), twoGPUs(), nil)
	if joined := strings.Join(p.Warnings, "\n"); !strings.Contains(joined, `cdiAnnotationPrefix "cdi.example.com" does not end in "/"`) {
		t.Errorf("warnings %q lack the prefix warning", p.Warnings)
	}
}

func TestComputePlanWarnings(t *testing.T) {
	tests := []struct {
		name    string
		devices dpconfig.Devices
		want    string
	}{
		{"count above the GPUs", dpconfig.Devices{Count: 5}, "5 requested but this node has 2 GPUs"},
		{"unknown UUID", dpconfig.Devices{List: []string{gputest.UUID(9)}}, fmt.Sprintf("%q matches no whole GPU", gputest.UUID(9))},
		{"MIG index", dpconfig.Devices{List: []string{"0:1"}}, `"0:1" matches no whole GPU`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := computePlan(shared(2, func(c *dpconfig.Config) { c.Resources[0].Devices = tc.devices }), twoGPUs(), nil)
			if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], tc.want) {
				t.Errorf("warnings = %q, want one containing %q", p.Warnings, tc.want)
			}
		})
	}
}

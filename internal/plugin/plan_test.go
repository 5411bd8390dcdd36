package plugin

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

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

// nGPUs returns n healthy GPUs, indexes 0 … n-1.
func nGPUs(n int) []gpuInfo {
	out := make([]gpuInfo, n)
	for i := range out {
		out[i] = gpuInfo{UUID: gputest.UUID(i), Index: i, MemoryTotalBytes: 80 << 30, Healthy: true}
	}
	return out
}

// Replica counts that crashed the plugin (make panics), ran it out of
// memory, or made a list longer than the kubelet can receive are refused,
// naming the field and the resource.
func TestCheckSize(t *testing.T) {
	tests := []struct {
		name string
		cfg  dpconfig.Config
		gpus int
		want string // "" for accepted
	}{
		{"2^63-1", shared(math.MaxInt64), 8, `sharing.timeSlicing.resources[0].replicas: 9223372036854775807 for resource "nvidia.com/gpu" is above gpuslice-plugin's limit of 1024 per GPU`},
		{"a million on 8 GPUs", shared(1_000_000), 8, `replicas: 1000000 for resource "nvidia.com/gpu" is above`},
		{"10000 on 8 GPUs", shared(10_000), 8, `replicas: 10000 for resource "nvidia.com/gpu" is above`},
		{"renamed", shared(2000, func(c *dpconfig.Config) { c.RenameByDefault = true }), 1, `for resource "nvidia.com/gpu.shared" is above`},
		{"MPS", dpconfig.Config{Version: "v1", MPS: true, MPSSharing: dpconfig.MPSSharing{Resources: []dpconfig.Resource{
			{Name: dpconfig.GPUResource, Devices: dpconfig.Devices{All: true}, Replicas: 5000}}}}, 1,
			`sharing.mps.resources[0].replicas: 5000 for resource "nvidia.com/gpu"`},
		{"the cap on 16 GPUs", shared(1024), 16, ""},
		{"the cap on 17 GPUs", shared(1024), 17, `sharing.timeSlicing.resources[0].replicas: 1024 on this node's 17 GPUs gives resource "nvidia.com/gpu" 17408 device IDs, above gpuslice-plugin's limit of 16384`},
		{"the cap on 17 GPUs, 16 of them shared under their own name", shared(1024, func(c *dpconfig.Config) {
			c.Resources[0].Devices, c.RenameByDefault = dpconfig.Devices{Count: 16}, true
		}), 17, ""},
		{"the cap on 17 GPUs, 16 of them shared, one exclusive under the same name", shared(1024, func(c *dpconfig.Config) {
			c.Resources[0].Devices = dpconfig.Devices{Count: 16}
		}), 17, `gives resource "nvidia.com/gpu" 16385 device IDs`},
		{"no GPUs known yet", shared(1024), 0, ""},
		{"ignored MIG entries are not checked", shared(2, func(c *dpconfig.Config) {
			c.Resources = append(c.Resources, dpconfig.Resource{Name: "nvidia.com/mig-1g.5gb", Devices: dpconfig.Devices{All: true}, Replicas: math.MaxInt64})
		}), 8, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkSize(tc.cfg, nGPUs(tc.gpus))
			if tc.want == "" {
				if err != nil {
					t.Errorf("checkSize = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrTooManyDevices) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("checkSize = %v, want ErrTooManyDevices containing %q", err, tc.want)
			}
		})
	}
}

// computePlan on its own ignores an entry above the cap rather than
// allocating its IDs (applyConfig refuses such a config before).
func TestComputePlanIgnoresOversizedEntry(t *testing.T) {
	p := computePlan(shared(math.MaxInt64), twoGPUs(), nil)
	if got, want := listing(p), "nvidia.com/gpu: "+uuid0+" "+uuid1; got != want {
		t.Errorf("plan %q, want %q", got, want)
	}
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "above the limit of 1024") {
		t.Errorf("warnings %q", p.Warnings)
	}
}

// The bounds' reason, measured: the longest list a resource can hold stays
// well under the 4 MiB a kubelet's ListAndWatch client receives.
func TestDeviceListFitsOneMessage(t *testing.T) {
	const kubeletLimit = 4 << 20
	worst := func(n int) int {
		r := &pluginapi.ListAndWatchResponse{}
		for range n {
			// The longest ID below the cap, in the longest health.
			r.Devices = append(r.Devices, &pluginapi.Device{ID: rid(gputest.UUID(0), maxReplicas-1), Health: pluginapi.Unhealthy})
		}
		return proto.Size(r)
	}
	if per := worst(1); per > 61 {
		t.Errorf("one device takes %d bytes, the bounds' comment says 61", per)
	}
	if size := worst(maxDevices); size > 1<<20 {
		t.Errorf("maxDevices IDs take %d bytes, over 1 MiB", size)
	}
	// A new list at the cap with the IDs of the one before still retiring.
	if size := worst(2 * maxDevices); size > kubeletLimit/2 {
		t.Errorf("two lists at the cap take %d bytes, over half the kubelet's limit", size)
	}
	// Every ID of 16 GPUs at the per-GPU cap.
	if size := worst(16 * (maxReplicas + 1)); size > 1<<20+1<<10 {
		t.Errorf("16 GPUs at the per-GPU cap take %d bytes", size)
	}
}

// A MIG-enabled GPU is advertised whole only under migStrategy none, and a
// strategy that asks for MIG devices is not followed silently.
func TestComputePlanMIG(t *testing.T) {
	mig := func(gs []gpuInfo, i int) []gpuInfo {
		gs[i].MIGEnabled = true
		return gs
	}
	strategy := func(s string) func(*dpconfig.Config) { return func(c *dpconfig.Config) { c.MigStrategy = s } }
	tests := []struct {
		name     string
		cfg      dpconfig.Config
		gpus     []gpuInfo
		held     []held
		want     string
		warnings []string
	}{
		{"none: shared whole, with a warning", shared(2), mig(twoGPUs(), 1), nil,
			"nvidia.com/gpu: " + ids(uuid0, 0, 2) + " " + ids(uuid1, 0, 2),
			[]string{"GPU " + uuid0 + " has MIG enabled: advertised whole"}},
		{"single: the MIG-enabled GPU is left out", shared(2, strategy("single")), mig(twoGPUs(), 1), nil,
			"nvidia.com/gpu: " + ids(uuid1, 0, 2),
			[]string{`flags.migStrategy "single": gpuslice-plugin advertises no MIG devices`, "GPU " + uuid0 + ` has MIG enabled: not advertised under migStrategy "single"`}},
		{"mixed without MIG-enabled GPUs: a warning, GPUs shared", shared(2, strategy("mixed")), twoGPUs(), nil,
			"nvidia.com/gpu: " + ids(uuid0, 0, 2) + " " + ids(uuid1, 0, 2),
			[]string{`flags.migStrategy "mixed"`}},
		{"mixed, not shared: the MIG-enabled GPU is left out", dpconfig.Config{Version: "v1", MigStrategy: "mixed"}, mig(twoGPUs(), 1), nil,
			"nvidia.com/gpu: " + uuid1,
			[]string{`flags.migStrategy "mixed"`, "GPU " + uuid0 + " has MIG enabled: not advertised"}},
		{"mixed: an ID held on the MIG-enabled GPU stays until released", shared(2, strategy("mixed")), mig(twoGPUs(), 1),
			[]held{{rid(uuid0, 1), "nvidia.com/gpu"}},
			"nvidia.com/gpu: " + rid(uuid0, 1) + "~ " + ids(uuid1, 0, 2),
			[]string{`flags.migStrategy "mixed"`}},
		{"mixed: a count selects among whole GPUs", shared(2, strategy("mixed"), func(c *dpconfig.Config) { c.Resources[0].Devices = dpconfig.Devices{Count: 1} }),
			mig(twoGPUs(), 1), nil,
			"nvidia.com/gpu: " + ids(uuid1, 0, 2),
			[]string{`flags.migStrategy "mixed"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := computePlan(tc.cfg, tc.gpus, tc.held)
			if diff := cmp.Diff(tc.want, listing(p)); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			joined := strings.Join(p.Warnings, "\n")
			for _, w := range tc.warnings {
				if !strings.Contains(joined, w) {
					t.Errorf("warnings %q lack %q", p.Warnings, w)
				}
			}
		})
	}
}

package plugin

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
)

func TestContainerEnv(t *testing.T) {
	p := computePlan(shared(4, func(c *dpconfig.Config) { c.Resources[0].Devices = dpconfig.Devices{List: []string{"0"}} }), twoGPUs(), nil)
	tests := []struct {
		name    string
		ids     []string
		fail    bool
		want    map[string]string
		wantErr string
	}{
		{"one replica: a quarter of the GPU", []string{rid(uuid0, 2)}, false,
			map[string]string{EnvVisibleDevices: uuid0, EnvMemoryBudget: strconv.FormatUint(12<<30, 10)}, ""},
		{"two replicas of one GPU: its UUID once", []string{rid(uuid0, 2), rid(uuid0, 0)}, false,
			map[string]string{EnvVisibleDevices: uuid0, EnvMemoryBudget: strconv.FormatUint(12<<30, 10)}, ""},
		{"an exclusive GPU: all its memory", []string{uuid1}, false,
			map[string]string{EnvVisibleDevices: uuid1, EnvMemoryBudget: strconv.FormatUint(24<<30, 10)}, ""},
		{"two GPUs: the smaller share", []string{uuid1, rid(uuid0, 1)}, false,
			map[string]string{EnvVisibleDevices: uuid1 + "," + uuid0, EnvMemoryBudget: strconv.FormatUint(12<<30, 10)}, ""},
		{"failRequestsGreaterThanOne: NVIDIA's message", []string{rid(uuid0, 0), rid(uuid0, 1)}, true, nil,
			"invalid request: maximum request size for shared resources is 1; found 2"},
		{"failRequestsGreaterThanOne allows one replica", []string{rid(uuid0, 3)}, true,
			map[string]string{EnvVisibleDevices: uuid0, EnvMemoryBudget: strconv.FormatUint(12<<30, 10)}, ""},
		{"failRequestsGreaterThanOne leaves exclusive GPUs alone", []string{uuid0, uuid1}, true,
			map[string]string{EnvVisibleDevices: uuid0 + "," + uuid1, EnvMemoryBudget: strconv.FormatUint(12<<30, 10)}, ""},
		{"unknown GPU", []string{rid(gputest.UUID(5), 0)}, false, nil, "invalid allocation request for 'nvidia.com/gpu': unknown device: " + rid(gputest.UUID(5), 0)},
		{"not a GPU ID", []string{"foo"}, false, nil, "unknown device: foo"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := containerResponse(p, "nvidia.com/gpu", tc.ids, tc.fail, "req")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, r.Envs); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			if r.Annotations != nil || r.CdiDevices != nil || r.Mounts != nil {
				t.Errorf("envvar strategy answered %v, want only the environment", r)
			}
		})
	}
	if _, err := containerResponse(p, "nvidia.com/gpu", []string{rid(uuid0, 0), rid(uuid0, 1)}, true, "req"); !errors.Is(err, ErrRequest) {
		t.Errorf("failRequestsGreaterThanOne error %v does not match ErrRequest", err)
	}
	if _, err := containerResponse(p, "nvidia.com/gpu", []string{"x"}, false, "req"); !errors.Is(err, ErrRequest) {
		t.Errorf("unknown device error %v does not wrap ErrRequest", err)
	}
}

func TestPreferred(t *testing.T) {
	three := append(twoGPUs(), gpuInfo{UUID: gputest.UUID(2), Index: 2, MemoryTotalBytes: 48 << 30, Healthy: true})
	uuid2 := gputest.UUID(2)
	p := computePlan(shared(4), three, nil)
	all := func(except ...string) []string {
		var out []string
		for _, d := range p.Resources["nvidia.com/gpu"] {
			skip := false
			for _, e := range except {
				skip = skip || e == d.ID
			}
			if !skip {
				out = append(out, d.ID)
			}
		}
		return out
	}
	tests := []struct {
		name      string
		policy    Policy
		available []string
		must      []string
		size      int
		inUse     map[string]int
		want      []string
	}{
		{"distributed: the least used GPU", Distributed, all(rid(uuid0, 0), rid(uuid1, 0)), nil, 1,
			map[string]int{uuid0: 1, uuid1: 1}, []string{rid(uuid2, 0)}},
		{"distributed: ties by index, lowest replica", Distributed, all(), nil, 1, nil, []string{rid(uuid0, 0)}},
		{"distributed: several replicas on distinct GPUs", Distributed, all(rid(uuid2, 0)), nil, 3,
			map[string]int{uuid2: 1}, []string{rid(uuid0, 0), rid(uuid1, 0), rid(uuid2, 1)}},
		{"distributed: must-include counts as chosen", Distributed, all(), []string{rid(uuid1, 2)}, 2, nil,
			[]string{rid(uuid1, 2), rid(uuid0, 0)}},
		{"packed: the most used GPU", Packed, all(rid(uuid1, 0), rid(uuid1, 1)), nil, 1,
			map[string]int{uuid1: 2}, []string{rid(uuid1, 2)}},
		{"packed: several replicas stay together", Packed, all(), nil, 3, nil,
			[]string{rid(uuid0, 0), rid(uuid0, 1), rid(uuid0, 2)}},
		{"packed: a full GPU is skipped", Packed, all(rid(uuid0, 0), rid(uuid0, 1), rid(uuid0, 2), rid(uuid0, 3)), nil, 1,
			map[string]int{uuid0: 4}, []string{rid(uuid1, 0)}},
		{"size smaller than must-include", Distributed, all(), []string{rid(uuid0, 0), rid(uuid1, 0)}, 1, nil, []string{rid(uuid0, 0)}},
		{"not enough available", Packed, []string{rid(uuid2, 3)}, nil, 2, nil, []string{rid(uuid2, 3)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := preferred(tc.policy, p, "nvidia.com/gpu", tc.available, tc.must, tc.size, tc.inUse)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("preferred (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPreferredNeverDraining(t *testing.T) {
	// Shrunk from 4 to 2 replicas while uuid0::3 and uuid0::0 were in use
	// (uuid0 advertises ::0 and ::3, no free ID) and uuid1::0 too. The pod
	// on uuid0::3 has just ended: the kubelet offers it before the plugin
	// has dropped it. Both policies would pick it on its merits (the lower
	// GPU index for distributed at equal use, the busier GPU for packed).
	p := computePlan(shared(2), twoGPUs(), []held{{rid(uuid0, 3), "nvidia.com/gpu"}, {rid(uuid0, 0), "nvidia.com/gpu"}, {rid(uuid1, 0), "nvidia.com/gpu"}})
	if got, want := listing(p), "nvidia.com/gpu: "+rid(uuid0, 0)+" "+rid(uuid0, 3)+"~ "+ids(uuid1, 0, 2); got != want {
		t.Fatalf("plan %s, want %s", got, want)
	}
	for _, tc := range []struct {
		policy Policy
		inUse  map[string]int
	}{
		{Distributed, map[string]int{uuid0: 1, uuid1: 1}},
		{Packed, map[string]int{uuid0: 2, uuid1: 1}},
	} {
		avail := []string{rid(uuid0, 3), rid(uuid1, 1)}
		got := preferred(tc.policy, p, "nvidia.com/gpu", avail, nil, 1, tc.inUse)
		if diff := cmp.Diff([]string{rid(uuid1, 1)}, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.policy, diff)
		}
		got = preferred(tc.policy, p, "nvidia.com/gpu", avail, nil, 2, tc.inUse)
		if diff := cmp.Diff([]string{rid(uuid1, 1), rid(uuid0, 3)}, got); diff != "" {
			t.Errorf("%s, draining only as the last resort (-want +got):\n%s", tc.policy, diff)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	for _, s := range []string{"distributed", "packed"} {
		if p, err := ParsePolicy(s); err != nil || string(p) != s {
			t.Errorf("ParsePolicy(%q) = %q, %v", s, p, err)
		}
	}
	if _, err := ParsePolicy("random"); err == nil {
		t.Error("ParsePolicy(random) succeeded")
	}
}

// Each of NVIDIA's device list strategies answers as NVIDIA's plugin v0.19
// answers (internal/plugin/server.go getAllocateResponse), plus the memory
// budget.
func TestContainerResponseStrategies(t *testing.T) {
	const budget = "12884901888" // a quarter of GPU 0
	ids := []string{uuid1, rid(uuid0, 1), rid(uuid0, 2)}
	tests := []struct {
		name       string
		strategies []string
		idStrategy string
		prefix     string
		want       *pluginapi.ContainerAllocateResponse
	}{
		{"default is envvar", nil, "", "", &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{EnvVisibleDevices: uuid1 + "," + uuid0, EnvMemoryBudget: budget}}},
		{"envvar by index", []string{"envvar"}, "index", "", &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{EnvVisibleDevices: "1,0", EnvMemoryBudget: budget}}},
		{"volume-mounts", []string{"volume-mounts"}, "", "", &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{EnvVisibleDevices: "/var/run/nvidia-container-devices", EnvMemoryBudget: budget},
			Mounts: []*pluginapi.Mount{
				{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/" + uuid1},
				{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/" + uuid0},
			}}},
		{"cdi-cri only: no NVIDIA_VISIBLE_DEVICES", []string{"cdi-cri"}, "", "", &pluginapi.ContainerAllocateResponse{
			Envs:       map[string]string{EnvMemoryBudget: budget},
			CdiDevices: []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + uuid1}, {Name: "nvidia.com/gpu=" + uuid0}}}},
		{"cdi-cri by index", []string{"cdi-cri"}, "index", "", &pluginapi.ContainerAllocateResponse{
			Envs:       map[string]string{EnvMemoryBudget: budget},
			CdiDevices: []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=1"}, {Name: "nvidia.com/gpu=0"}}}},
		{"cdi-annotations", []string{"cdi-annotations"}, "", "", &pluginapi.ContainerAllocateResponse{
			Envs:        map[string]string{EnvMemoryBudget: budget},
			Annotations: map[string]string{"cdi.k8s.io/gpuslice-plugin_req7": "nvidia.com/gpu=" + uuid1 + ",nvidia.com/gpu=" + uuid0}}},
		{"cdi-annotations with a prefix", []string{"cdi-annotations"}, "index", "cdi.example.com/", &pluginapi.ContainerAllocateResponse{
			Envs:        map[string]string{EnvMemoryBudget: budget},
			Annotations: map[string]string{"cdi.example.com/gpuslice-plugin_req7": "nvidia.com/gpu=1,nvidia.com/gpu=0"}}},
		{"envvar and cdi-cri: both", []string{"envvar", "cdi-cri"}, "", "", &pluginapi.ContainerAllocateResponse{
			Envs:       map[string]string{EnvVisibleDevices: uuid1 + "," + uuid0, EnvMemoryBudget: budget},
			CdiDevices: []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + uuid1}, {Name: "nvidia.com/gpu=" + uuid0}}}},
		{"both CDI strategies", []string{"cdi-annotations", "cdi-cri"}, "", "", &pluginapi.ContainerAllocateResponse{
			Envs:        map[string]string{EnvMemoryBudget: budget},
			Annotations: map[string]string{"cdi.k8s.io/gpuslice-plugin_req7": "nvidia.com/gpu=" + uuid1 + ",nvidia.com/gpu=" + uuid0},
			CdiDevices:  []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + uuid1}, {Name: "nvidia.com/gpu=" + uuid0}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := shared(4, func(c *dpconfig.Config) {
				c.Resources[0].Devices = dpconfig.Devices{List: []string{"0"}}
				c.DeviceListStrategy, c.DeviceIDStrategy, c.CDIAnnotationPrefix = tc.strategies, tc.idStrategy, tc.prefix
			})
			got, err := containerResponse(computePlan(cfg, twoGPUs(), nil), "nvidia.com/gpu", ids, false, "req7")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("response (-want +got):\n%s", diff)
			}
		})
	}
}

// Request IDs keep the annotation key within the CDI specification's rule:
// <plugin>_<ID> at most 63 characters, alphanumeric at both ends.
func TestNewRequestID(t *testing.T) {
	a, b := newRequestID(), newRequestID()
	if a == b {
		t.Fatalf("two request IDs are both %q", a)
	}
	name := cdiAnnotationPlugin + "_" + a
	if len(name) > 63 || !regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*[a-z0-9]$`).MatchString(name) {
		t.Errorf("annotation name %q breaks the CDI rule", name)
	}
}

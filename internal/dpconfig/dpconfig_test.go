package dpconfig

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const gpu0 = "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348"

func TestParseValid(t *testing.T) {
	gpu := func(n int) Resource { return Resource{Name: GPUResource, Devices: Devices{All: true}, Replicas: n} }
	tests := []struct {
		name string
		in   string
		want Config
	}{
		{"empty file: NVIDIA defaults, no sharing", "", Config{Version: "v1", MigStrategy: "none"}},
		{"comments only", "# nothing yet\n", Config{Version: "v1", MigStrategy: "none"}},
		{"version absent reads as v1", "flags: {migStrategy: single}\n", Config{Version: "v1", MigStrategy: "single"}},
		{"the seed's cluster-wide config", `version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: false
    resources:
      - name: nvidia.com/gpu
        replicas: 4
`, Config{Version: "v1", MigStrategy: "none", Resources: []Resource{gpu(4)}}},
		{"MIG resources, mixed strategy", `version: v1
flags: {migStrategy: mixed}
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 8
    - name: nvidia.com/mig-1g.5gb
      replicas: 2
`, Config{Version: "v1", MigStrategy: "mixed", Resources: []Resource{gpu(8),
			{Name: "nvidia.com/mig-1g.5gb", Devices: Devices{All: true}, Replicas: 2}}}},
		{"unqualified names get nvidia.com/ as NVIDIA does", `sharing: {timeSlicing: {resources: [{name: gpu, rename: gpu-shared, replicas: 2}]}}`,
			Config{Version: "v1", MigStrategy: "none", Resources: []Resource{{Name: GPUResource, Rename: "nvidia.com/gpu-shared", Devices: Devices{All: true}, Replicas: 2}}}},
		{"devices: a count", `sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, devices: 2, replicas: 3}]}}`,
			Config{Version: "v1", MigStrategy: "none", Resources: []Resource{{Name: GPUResource, Devices: Devices{Count: 2}, Replicas: 3}}}},
		{"devices: a list of indexes and UUIDs", `sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, devices: [0, "1", "0:1", ` + gpu0 + `, MIG-` + gpu0[4:] + `, MIG-` + gpu0 + `/1/0], replicas: 3}]}}`,
			Config{Version: "v1", MigStrategy: "none", Resources: []Resource{{Name: GPUResource, Devices: Devices{List: []string{"0", "1", "0:1", gpu0, "MIG-" + gpu0[4:], "MIG-" + gpu0 + "/1/0"}}, Replicas: 3}}}},
		{"renameByDefault and failRequestsGreaterThanOne", `sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources: [{name: nvidia.com/gpu, rename: nvidia.com/gpu.shared, replicas: 2}]
`, Config{Version: "v1", MigStrategy: "none", RenameByDefault: true, FailRequestsGreaterThanOne: true,
			Resources: []Resource{{Name: GPUResource, Rename: "nvidia.com/gpu.shared", Devices: Devices{All: true}, Replicas: 2}}}},
		{"JSON", `{"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 10}]}}}`,
			Config{Version: "v1", MigStrategy: "none", Resources: []Resource{gpu(10)}}},
		{"MPS: failRequestsGreaterThanOne true when absent, as NVIDIA", "version: v1\nsharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n",
			Config{Version: "v1", MigStrategy: "none", MPS: true, MPSSharing: MPSSharing{FailRequestsGreaterThanOne: true, Resources: []Resource{gpu(2)}}}},
		{"MPS relaxed, renamed by default", "sharing:\n  mps:\n    renameByDefault: true\n    failRequestsGreaterThanOne: false\n    resources: [{name: gpu, devices: all, replicas: 4}]\n",
			Config{Version: "v1", MigStrategy: "none", MPS: true, MPSSharing: MPSSharing{RenameByDefault: true, Resources: []Resource{gpu(4)}}}},
		{"MPS with the default rename spelled out", "sharing: {mps: {renameByDefault: true, resources: [{name: gpu, rename: gpu.shared, replicas: 3}]}}\n",
			Config{Version: "v1", MigStrategy: "none", MPS: true, MPSSharing: MPSSharing{RenameByDefault: true, FailRequestsGreaterThanOne: true,
				Resources: []Resource{{Name: GPUResource, Rename: "nvidia.com/gpu.shared", Devices: Devices{All: true}, Replicas: 3}}}}},
		{"unknown fields are ignored", "version: v1\nflags: {failOnInitError: true, plugin: {deviceListStrategy: envvar}}\nresources: {gpus: [{pattern: '*', name: gpu}]}\nsharing: {timeSlicing: {strategy: x, resources: [{name: gpu, replicas: 2, extra: 1}]}}\n",
			Config{Version: "v1", MigStrategy: "none", Resources: []Resource{gpu(2)}, DeviceListStrategy: []string{"envvar"}}},
		{"YAML 1.1 booleans, as NVIDIA's sigs.k8s.io/yaml reads them", "sharing:\n  timeSlicing:\n    renameByDefault: yes\n    failRequestsGreaterThanOne: On\n    resources: [{name: gpu, replicas: 2}]\n",
			Config{Version: "v1", MigStrategy: "none", RenameByDefault: true, FailRequestsGreaterThanOne: true, Resources: []Resource{gpu(2)}}},
		{"YAML 1.1 false", "sharing: {timeSlicing: {renameByDefault: no, resources: [{name: gpu, replicas: 2}]}}\n",
			Config{Version: "v1", MigStrategy: "none", Resources: []Resource{gpu(2)}}},
		{"device strategies, a list and a string", "flags: {plugin: {deviceListStrategy: [envvar, cdi-cri], deviceIDStrategy: index}}\n",
			Config{Version: "v1", MigStrategy: "none", DeviceListStrategy: []string{"envvar", "cdi-cri"}, DeviceIDStrategy: "index"}},
		{"CDI annotation prefix", "flags: {plugin: {deviceListStrategy: cdi-annotations, cdiAnnotationPrefix: cdi.example.com/}}\n",
			Config{Version: "v1", MigStrategy: "none", DeviceListStrategy: []string{"cdi-annotations"}, CDIAnnotationPrefix: "cdi.example.com/"}},
		{"null values read as absent", "version:\nflags:\nsharing:\n  mps: null\n  timeSlicing:\n",
			Config{Version: "v1", MigStrategy: "none"}},
		{"anchors and aliases", "x-replicas: &r 3\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: *r}]}}\n",
			Config{Version: "v1", MigStrategy: "none", Resources: []Resource{gpu(3)}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse([]byte(tc.in))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, f.Config()); diff != "" {
				t.Errorf("Config() (-want +got):\n%s", diff)
			}
			if err := Validate(f.Config()); err != nil {
				t.Errorf("Validate(Config()) = %v", err)
			}
			out, err := f.Marshal()
			if err != nil || string(out) != tc.in {
				t.Errorf("Marshal of an unchanged file = %q, %v; want the input bytes", out, err)
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	ts := func(res string) string { return "version: v1\nsharing:\n  timeSlicing:\n    resources:\n" + res }
	tests := []struct {
		name string
		in   string
		want string // substring of the error
	}{
		{"unknown version", "version: v2\n", `version: unknown version "v2", the only version is "v1" (line 1)`},
		{"version not a string", "version: 1\n", `version: must be a string, got int "1"`},
		{"replicas 1", ts("      - name: nvidia.com/gpu\n        replicas: 4\n      - name: nvidia.com/mig-1g.5gb\n        replicas: 1\n"),
			"sharing.timeSlicing.resources[1].replicas: must be >= 2, got 1 (line 8)"},
		{"replicas 0", ts("      - {name: gpu, replicas: 0}\n"), "resources[0].replicas: must be >= 2, got 0"},
		{"replicas missing", ts("      - name: gpu\n"), "resources[0].replicas: no replicas specified"},
		{"replicas a string", ts("      - {name: gpu, replicas: \"4\"}\n"), `replicas: must be an integer, got str "4"`},
		{"replicas overflow", ts("      - {name: gpu, replicas: 99999999999999999999}\n"), "replicas: must be an integer"},
		{"name missing", ts("      - replicas: 4\n"), "resources[0].name: no resource name specified"},
		{"name invalid", ts("      - {name: nvidia.com/GPU, replicas: 4}\n"), `resources[0].name: resource name "nvidia.com/GPU" is not valid`},
		{"name from another vendor", ts("      - {name: amd.com/gpu, replicas: 4}\n"), `resource name "nvidia.com/amd.com/gpu" is not valid`},
		{"name too long", ts("      - {name: gpu-" + strings.Repeat("x", 60) + ", replicas: 4}\n"), "longer than 63 characters"},
		{"rename invalid", ts("      - {name: gpu, rename: Shared_GPU, replicas: 4}\n"), `resources[0].rename: resource name "nvidia.com/Shared_GPU" is not valid`},
		{"rename conflicting with renameByDefault", "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources: [{name: gpu, rename: gpu-small, replicas: 2}]\n",
			`resources[0].rename: "nvidia.com/gpu-small" conflicts with renameByDefault`},
		{"duplicate resource names", ts("      - {name: gpu, replicas: 4}\n      - {name: nvidia.com/gpu, replicas: 2}\n"),
			`resources[1].name: "nvidia.com/gpu" already configured in resources[0] (line 6)`},
		{"two resources renamed alike", ts("      - {name: gpu, rename: shared, replicas: 4}\n      - {name: mig-1g.5gb, rename: shared, replicas: 2}\n"),
			`resources[1].rename: "nvidia.com/shared" is already advertised by resources[0]`},
		{"no resources", "sharing:\n  timeSlicing:\n    renameByDefault: true\n", "sharing.timeSlicing.resources: no resources specified"},
		{"empty resources", ts("      []\n")[:len(ts(""))-1] + " []\n", "no resources specified"},
		{"resources not a list", "sharing: {timeSlicing: {resources: {name: gpu}}}", "sharing.timeSlicing.resources: must be a list, got a mapping"},
		{"devices string", ts("      - {name: gpu, devices: some, replicas: 4}\n"), `devices: devices set as "some" but the only valid string is "all"`},
		{"devices zero count", ts("      - {name: gpu, devices: 0, replicas: 4}\n"), "devices: a count of devices must be > 0, got 0"},
		{"devices empty list", ts("      - {name: gpu, devices: [], replicas: 4}\n"), "devices: an empty list selects no GPU"},
		{"devices bad entry", ts("      - {name: gpu, devices: [0, GPU-nope], replicas: 4}\n"), `devices[1]: "GPU-nope" is not a GPU index`},
		{"devices negative index", ts("      - {name: gpu, devices: [-1], replicas: 4}\n"), `devices[0]: "-1" is not a GPU index`},
		{"devices a mapping", ts("      - {name: gpu, devices: {all: true}, replicas: 4}\n"), "devices: must be \"all\", a count or a list, got a mapping"},
		{"mig strategy", "flags: {migStrategy: sometimes}\n", `flags.migStrategy: unknown MIG strategy "sometimes", want none, single or mixed (line 1)`},
		{"renameByDefault not a bool", "sharing: {timeSlicing: {renameByDefault: maybe, resources: [{name: gpu, replicas: 2}]}}", `renameByDefault: must be true or false, got str "maybe"`},
		{"a quoted yes is a string to NVIDIA too", "sharing: {timeSlicing: {renameByDefault: \"yes\", resources: [{name: gpu, replicas: 2}]}}", `renameByDefault: must be true or false`},
		{"unknown device list strategy", "flags: {plugin: {deviceListStrategy: [envvar, nvml]}}", `flags.plugin.deviceListStrategy[1]: unknown device list strategy "nvml"`},
		{"unknown device ID strategy", "flags: {plugin: {deviceIDStrategy: serial}}", `flags.plugin.deviceIDStrategy: unknown device ID strategy "serial"`},
		{"CDI annotation prefix not a string", "flags: {plugin: {cdiAnnotationPrefix: [a]}}", `flags.plugin.cdiAnnotationPrefix`},
		{"mps and timeSlicing", "sharing:\n  mps: {resources: [{name: gpu, replicas: 2}]}\n  timeSlicing: {resources: [{name: gpu, replicas: 2}]}\n",
			"sharing: mps and timeSlicing are mutually exclusive; set one of them (line 1)"},
		{"mps without resources", "sharing: {mps: {renameByDefault: true}}\n", "sharing.mps.resources: no resources specified (leave out sharing.mps"},
		{"mps empty mapping", "sharing: {mps: {}}\n", "sharing.mps.resources: no resources specified"},
		{"mps one replica", "sharing: {mps: {resources: [{name: gpu, replicas: 1}]}}\n", "sharing.mps.resources[0].replicas: must be >= 2, got 1 (line 1)"},
		{"mps no replicas", "sharing: {mps: {resources: [{name: gpu}]}}\n", "sharing.mps.resources[0].replicas: no replicas specified"},
		{"mps devices a count", "sharing: {mps: {resources: [{name: gpu, devices: 1, replicas: 2}]}}\n", "sharing.mps.resources[0].devices: NVIDIA's plugin shares every GPU"},
		{"mps devices a list", "sharing: {mps: {resources: [{name: gpu, devices: [0], replicas: 2}]}}\n", "ignores devices"},
		{"mps explicit rename", "sharing: {mps: {resources: [{name: gpu, rename: small, replicas: 2}]}}\n", "sharing.mps.resources[0].rename: NVIDIA's plugin ignores rename"},
		{"mps rename against renameByDefault", "sharing: {mps: {renameByDefault: true, resources: [{name: gpu, rename: small, replicas: 2}]}}\n", "conflicts with renameByDefault"},
		{"mps with mixed MIG", "flags: {migStrategy: mixed}\nsharing: {mps: {resources: [{name: gpu, replicas: 2}]}}\n", "flags.migStrategy: MPS sharing does not work with migStrategy mixed"},
		{"mps duplicate names", "sharing: {mps: {resources: [{name: gpu, replicas: 2}, {name: nvidia.com/gpu, replicas: 3}]}}\n", `sharing.mps.resources[1].name: "nvidia.com/gpu" already configured`},
		{"mps not a mapping", "sharing: {mps: [a]}\n", "sharing.mps: must be a mapping, got a list"},
		{"mps failRequestsGreaterThanOne not a bool", "sharing: {mps: {failRequestsGreaterThanOne: 2, resources: [{name: gpu, replicas: 2}]}}\n", "sharing.mps.failRequestsGreaterThanOne: must be true or false"},
		{"duplicate key", "version: v1\nversion: v1\n", `version: key "version" defined twice (line 2)`},
		// NVIDIA's plugin would read these as sharing and replicas.
		{"a field in another case", "version: v1\nSharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}\n",
			`Sharing: "Sharing" is read as "sharing" by NVIDIA's plugin (its keys match in any case) but not here: spell it "sharing" (line 2)`},
		{"a nested field in another case", "sharing: {timeSlicing: {resources: [{name: gpu, Replicas: 4}]}}\n",
			`sharing.timeSlicing.resources[0].Replicas: "Replicas" is read as "replicas"`},
		{"not a mapping", "- a\n- b\n", "must be a mapping, got a list"},
		{"sharing a string", "sharing: yes\n", `sharing: must be a mapping, got str "yes"`},
		{"two documents", "version: v1\n---\nversion: v1\n", "more than one YAML document; a config is one document (line 2)"},
		{"YAML syntax", "version: [v1\n", "yaml:"},
		{"merge keys", "base: &b {replicas: 2}\nsharing: {timeSlicing: {resources: [{<<: *b, name: gpu}]}}\n", "merge keys (<<) are not supported"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse([]byte(tc.in))
			if err == nil {
				t.Fatalf("Parse succeeded with %+v, want an error containing %q", f.Config(), tc.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %q\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	ok := Resource{Name: GPUResource, Devices: Devices{All: true}, Replicas: 2}
	tests := []struct {
		name string
		c    Config
		want string // "" for valid
	}{
		{"zero config", Config{}, ""},
		{"one resource", Config{Version: "v1", Resources: []Resource{ok}}, ""},
		{"bad version", Config{Version: "v0"}, `version: unknown version "v0"`},
		{"no device selection", Config{Resources: []Resource{{Name: GPUResource, Replicas: 2}}}, `devices: must be exactly one of "all", a count or a list`},
		{"two device selections", Config{Resources: []Resource{{Name: GPUResource, Devices: Devices{All: true, Count: 1}, Replicas: 2}}}, "must be exactly one of"},
		{"negative count", Config{Resources: []Resource{{Name: GPUResource, Devices: Devices{Count: -1}, Replicas: 2}}}, "a count of devices must be > 0, got -1"},
		{"unqualified name", Config{Resources: []Resource{{Name: "gpu", Devices: Devices{All: true}, Replicas: 2}}}, `resource name "gpu" must start with "nvidia.com/"`},
		{"renameByDefault collides with a resource", Config{RenameByDefault: true, Resources: []Resource{
			{Name: "nvidia.com/gpu.shared", Rename: "nvidia.com/x", Devices: Devices{All: true}, Replicas: 2}}}, "conflicts with renameByDefault"},
		{"rename equal to the default shared name", Config{RenameByDefault: true, Resources: []Resource{
			{Name: GPUResource, Rename: "nvidia.com/gpu.shared", Devices: Devices{All: true}, Replicas: 2}}}, ""},
		{"mps with resources", Config{MPS: true, Resources: []Resource{ok}}, "mutually exclusive"},
		{"mps", Config{MPS: true, MPSSharing: MPSSharing{Resources: []Resource{ok}}}, ""},
		{"mps without resources", Config{MPS: true}, "no resources specified"},
		{"mps one replica", Config{MPS: true, MPSSharing: MPSSharing{Resources: []Resource{{Name: GPUResource, Devices: Devices{All: true}, Replicas: 1}}}}, "must be >= 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.c)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an ErrInvalid containing %q", err, tc.want)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Path == "" {
				t.Errorf("errors.As(*FieldError) = %v with path %q", fe, fe.Path)
			}
		})
	}
}

func TestAdvertisedNameAndReplicas(t *testing.T) {
	r := Resource{Name: GPUResource, Replicas: 4}
	if got := (Config{}).AdvertisedName(r); got != GPUResource {
		t.Errorf("plain: %q", got)
	}
	if got := (Config{RenameByDefault: true}).AdvertisedName(r); got != "nvidia.com/gpu.shared" {
		t.Errorf("renameByDefault: %q", got)
	}
	r.Rename = "nvidia.com/small"
	if got := (Config{}).AdvertisedName(r); got != "nvidia.com/small" {
		t.Errorf("rename: %q", got)
	}
	mig := Resource{Name: "nvidia.com/mig-1g.5gb", Replicas: 2}
	if got := (Config{Resources: []Resource{mig, {Name: GPUResource, Replicas: 6}}}).Replicas(); got != 6 {
		t.Errorf("Replicas prefers nvidia.com/gpu: got %d", got)
	}
	if got := (Config{Resources: []Resource{mig}}).Replicas(); got != 2 {
		t.Errorf("Replicas of the first entry: got %d", got)
	}
	if got := (Config{}).Replicas(); got != 1 {
		t.Errorf("Replicas without sharing: got %d", got)
	}
	m := MPSSharing{Resources: []Resource{mig, {Name: GPUResource, Replicas: 3}}}
	if got := m.Replicas(); got != 3 {
		t.Errorf("MPS Replicas prefers nvidia.com/gpu: got %d", got)
	}
	if got := (MPSSharing{RenameByDefault: true}).AdvertisedName(r); got != "nvidia.com/small" {
		t.Errorf("MPS explicit rename: %q", got)
	}
	if got := (MPSSharing{RenameByDefault: true}).AdvertisedName(Resource{Name: GPUResource}); got != "nvidia.com/gpu.shared" {
		t.Errorf("MPS renameByDefault: %q", got)
	}
}

package plugin

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
)

func TestParseGuardrails(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    map[string]bool
		wantErr string
	}{
		{"", map[string]bool{}, ""},
		{"nvidia.com/gpu", map[string]bool{"nvidia.com/gpu": true}, ""},
		{" nvidia.com/gpu , nvidia.com/gpu.shared", map[string]bool{"nvidia.com/gpu": true, "nvidia.com/gpu.shared": true}, ""},
		{"gpu", nil, `"gpu" is not a resource name`},
		{"nvidia.com/gpu,", nil, `"" is not a resource name`},
		{"a/b/c", nil, `"a/b/c" is not a resource name`},
	} {
		got, err := ParseGuardrails(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseGuardrails(%q) = %v, want an error containing %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !cmp.Equal(got, tc.want) {
			t.Errorf("ParseGuardrails(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestGuardrailFraction(t *testing.T) {
	// uuid0 has 4 replicas, uuid1 is exclusive.
	p := computePlan(shared(4, func(c *dpconfig.Config) { c.Resources[0].Devices = dpconfig.Devices{List: []string{"0"}} }), twoGPUs(), nil)
	three := computePlan(shared(3), twoGPUs(), nil)
	for _, tc := range []struct {
		name string
		p    plan
		ids  []string
		want string
	}{
		{"a quarter less the headroom", p, []string{rid(uuid0, 1)}, "0.225"},
		{"a third, rounded down", three, []string{rid(uuid0, 1)}, "0.300"},
		{"exclusive: JAX's own default, not more", p, []string{uuid1}, "0.750"},
		{"several GPUs: the most shared one's", p, []string{uuid1, rid(uuid0, 0)}, "0.225"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			addGuardrails(env, tc.p, tc.ids)
			want := map[string]string{
				EnvMemoryFraction: tc.want, EnvXLAMemFraction: tc.want, EnvXLAMemFractionOld: tc.want,
				EnvXLAPreallocate: "false", EnvTFAllowGrowth: "true",
			}
			if diff := cmp.Diff(want, env); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAllocateGuardrails: over the kubelet's gRPC API, the guardrails reach
// the containers of the resources named, and only those.
func TestAllocateGuardrails(t *testing.T) {
	// GPU 0 is shared under the renamed resource, GPU 1 stays exclusive.
	h := start(t, setup{config: config(2, "    renameByDefault: true\n") + "      devices: [\"0\"]\n", gpus: twoSpecs(),
		guardrails: map[string]bool{gpuRes + ".shared": true}})
	h.kubelet.waitList(gpuRes+".shared", want(ids(uuid0, 0, 2)))
	h.kubelet.waitList(gpuRes, want(uuid1))
	allocate := func(resource, id string) map[string]string {
		t.Helper()
		resp, err := h.kubelet.endpoint(resource).client.Allocate(t.Context(), &pluginapi.AllocateRequest{
			ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{id}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.ContainerResponses[0].Envs
	}
	env := allocate(gpuRes+".shared", rid(uuid0, 1))
	for k, v := range map[string]string{EnvXLAPreallocate: "false", EnvXLAMemFraction: "0.450", EnvTFAllowGrowth: "true", EnvMemoryBudget: "25769803776"} {
		if env[k] != v {
			t.Errorf("%s = %q, want %q (env %v)", k, env[k], v, env)
		}
	}
	if env := allocate(gpuRes, uuid1); env[EnvXLAPreallocate] != "" || env[EnvTFAllowGrowth] != "" {
		t.Errorf("guardrails on %s, which the option does not name: %v", gpuRes, env)
	}
}

package plugin

import (
	"fmt"
	"strconv"
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
				EnvMemoryFraction: tc.want, EnvXLAPreallocate: "false", EnvTFAllowGrowth: "true",
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
	for k, v := range map[string]string{EnvXLAPreallocate: "false", EnvMemoryFraction: "0.450", EnvTFAllowGrowth: "true", EnvMemoryBudget: "25769803776"} {
		if env[k] != v {
			t.Errorf("%s = %q, want %q (env %v)", k, env[k], v, env)
		}
	}
	if env := allocate(gpuRes, uuid1); env[EnvXLAPreallocate] != "" || env[EnvTFAllowGrowth] != "" {
		t.Errorf("guardrails on %s, which the option does not name: %v", gpuRes, env)
	}
}

// jaxlib is what a jaxlib version does with the fraction variables of its
// environment (jaxlib/xla_client.py generate_pjrt_gpu_plugin_options, and
// before 2025 the same function in openxla/xla xla/python/xla_client.py).
// An empty value is unset: jaxlib tests the strings' truth.
type jaxlib struct {
	name string
	// readsNew: XLA_CLIENT_MEM_FRACTION is read, and both names set is a
	// ValueError that sends JAX to the CPU (jaxlib 0.4.32 on, XLA from
	// openxla/xla 8ad80bd, August 2024).
	readsNew bool
}

var jaxlibs = []jaxlib{{"jaxlib < 0.4.32", false}, {"jaxlib >= 0.4.32", true}}

// outcome is where JAX runs and under which fraction: "gpu", "gpu at F" or
// "cpu (ValueError)".
func (j jaxlib) outcome(env map[string]string) string {
	old, cur := env[EnvXLAMemFractionOld], env[EnvXLAMemFraction]
	if !j.readsNew {
		cur = ""
	}
	switch {
	case old != "" && cur != "":
		return "cpu (ValueError)"
	case cur != "":
		return "gpu at " + cur
	case old != "":
		return "gpu at " + old
	}
	return "gpu"
}

// kubeletMerge is the container's environment as the kubelet builds it:
// the device plugin's Allocate envs first, then the pod spec's env (and
// envFrom), and the runtime keeps the last value of a name
// (pkg/kubelet/kubelet_pods.go GenerateRunContainerOptions appends
// makeEnvironmentVariables after the container manager's device options;
// measured with containerd by test/realnode TestPluginMemoryGuardrails).
func kubeletMerge(plugin, pod map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range plugin {
		out[k] = v
	}
	for k, v := range pod {
		out[k] = v
	}
	return out
}

// TestGuardrailsNeverBothFractionNames is the proof issue 22 asks for: for
// every environment a pod can bring (neither fraction name, either one,
// either one empty; both set is a pod that fails without the plugin too,
// checked to fail no differently), with the guardrails on and off, on
// resources whose replicas give different memory shares, through the
// kubelet's gRPC Allocate: no container is given both fraction names,
// every jaxlib runs where and as it would without the plugin, and JAX's
// preallocation is off unless the pod says otherwise.
func TestGuardrailsNeverBothFractionNames(t *testing.T) {
	podEnvs := []map[string]string{
		{},
		{EnvXLAMemFractionOld: "0.3"},
		{EnvXLAMemFraction: "0.3"},
		{EnvXLAMemFractionOld: ""},
		{EnvXLAMemFraction: ""},
		{EnvXLAMemFractionOld: "0.3", EnvXLAPreallocate: "true"},
		{EnvXLAMemFraction: "0.3", EnvXLAPreallocate: "true"},
		{EnvXLAMemFractionOld: "0.3", EnvXLAMemFraction: "0.3"},
	}
	for _, replicas := range []int{1, 2, 3, 4} {
		for _, on := range []bool{false, true} {
			t.Run(fmt.Sprintf("replicas=%d guardrails=%v", replicas, on), func(t *testing.T) {
				var guard map[string]bool
				if on {
					guard = map[string]bool{gpuRes: true}
				}
				h := start(t, setup{config: config(replicas), gpus: twoSpecs(), guardrails: guard})
				id := uuid0
				if replicas > 1 {
					id = rid(uuid0, 1)
					h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, replicas), ids(uuid1, 0, replicas)))
				} else {
					h.kubelet.waitList(gpuRes, want(uuid0, uuid1))
				}
				resp, err := h.kubelet.endpoint(gpuRes).client.Allocate(t.Context(), &pluginapi.AllocateRequest{
					ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{id}}}})
				if err != nil {
					t.Fatal(err)
				}
				plugin := resp.ContainerResponses[0].Envs
				for _, name := range []string{EnvXLAMemFraction, EnvXLAMemFractionOld} {
					if _, ok := plugin[name]; ok {
						t.Errorf("Allocate sets %s: a program that sets the other name would leave the GPU (env %v)", name, plugin)
					}
				}
				if on {
					share := (1 - GuardrailHeadroom) / float64(replicas)
					if f, err := strconv.ParseFloat(plugin[EnvMemoryFraction], 64); err != nil || f > share || f > xlaDefaultFraction || f <= 0 {
						t.Errorf("%s = %q, want a fraction in (0, min(%.3f, %.2f)]", EnvMemoryFraction, plugin[EnvMemoryFraction], share, xlaDefaultFraction)
					}
				}
				for _, pod := range podEnvs {
					got := kubeletMerge(plugin, pod)
					if got[EnvXLAMemFraction] != "" && got[EnvXLAMemFractionOld] != "" &&
						(pod[EnvXLAMemFraction] == "" || pod[EnvXLAMemFractionOld] == "") {
						t.Errorf("pod env %v: the container gets both fraction names: %v", pod, got)
					}
					for _, j := range jaxlibs {
						if g, w := j.outcome(got), j.outcome(pod); g != w {
							t.Errorf("pod env %v, %s: JAX runs %s, without the plugin %s", pod, j.name, g, w)
						}
					}
					wantPre := pod[EnvXLAPreallocate]
					if _, set := pod[EnvXLAPreallocate]; !set && on {
						wantPre = "false"
					}
					if got[EnvXLAPreallocate] != wantPre {
						t.Errorf("pod env %v: %s = %q, want %q", pod, EnvXLAPreallocate, got[EnvXLAPreallocate], wantPre)
					}
				}
			})
		}
	}
}

// The model of jaxlib above must say what jaxlib does, or the proof proves
// nothing: both names send 0.4.32 and later to the CPU, the new name alone
// is ignored before 0.4.32, an empty value is no value.
func TestJaxlibModel(t *testing.T) {
	old, cur := jaxlibs[0], jaxlibs[1]
	for _, tc := range []struct {
		j    jaxlib
		env  map[string]string
		want string
	}{
		{cur, map[string]string{EnvXLAMemFractionOld: "0.4", EnvXLAMemFraction: "0.4"}, "cpu (ValueError)"},
		{old, map[string]string{EnvXLAMemFractionOld: "0.4", EnvXLAMemFraction: "0.5"}, "gpu at 0.4"},
		{old, map[string]string{EnvXLAMemFraction: "0.5"}, "gpu"},
		{cur, map[string]string{EnvXLAMemFraction: "0.5"}, "gpu at 0.5"},
		{cur, map[string]string{EnvXLAMemFractionOld: "0.4", EnvXLAMemFraction: ""}, "gpu at 0.4"},
	} {
		if got := tc.j.outcome(tc.env); got != tc.want {
			t.Errorf("%s with %v: %s, want %s", tc.j.name, tc.env, got, tc.want)
		}
	}
}

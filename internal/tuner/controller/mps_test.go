package controller

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
)

const mpsBase = `# MPS, a hard limit per pod
version: v1
sharing:
  mps:
    resources:
      - name: nvidia.com/gpu
        replicas: 4 # 12 GiB each on 48 GiB
`

// An MPS config is tuned through its sharing.mps replicas, against a real
// API server: named configs from 2 (never 1, never timeSlicing), the
// comments kept, the label moved, and an Event that the running container
// keeps the limit it started with.
func TestMPSAgainstAPIServer(t *testing.T) {
	env := testenv.Start(t)
	h := newHarness(t, env, testConfig(config.ModePlugin, "mps-ns"), nil)
	h.namespace()
	h.configMap(map[string]string{"default": mpsBase})
	h.node("mps-node", nil, 4) // 1 GPU × 4
	h.src.set("mps-node", headroom(1))
	h.round()

	cm := h.getConfigMap()
	if cm.Data["default"] != mpsBase {
		t.Errorf("the base changed:\n%s", cm.Data["default"])
	}
	if _, ok := cm.Data["gpuslice-1"]; ok {
		t.Errorf("gpuslice-1 written for an MPS base:\n%s", cm.Data["gpuslice-1"])
	}
	for n := 2; n <= 8; n++ {
		data := cm.Data[fmt.Sprintf("gpuslice-%d", n)]
		f, err := dpconfig.Parse([]byte(data))
		if err != nil {
			t.Fatalf("gpuslice-%d: %v\n%s", n, err, data)
		}
		if !f.MPS() || f.SharedReplicas() != n || strings.Contains(data, "timeSlicing") || !strings.Contains(data, "# MPS, a hard limit per pod") {
			t.Errorf("gpuslice-%d:\n%s", n, data)
		}
	}
	key, data := pluginReads(h, "mps-node")
	f, _ := dpconfig.Parse([]byte(data))
	if key != "gpuslice-5" || f.SharedReplicas() != 5 {
		t.Fatalf("the plugin reads %q with %d MPS replicas, want gpuslice-5; last decision %+v", key, f.SharedReplicas(), h.record("mps-node"))
	}
	kept := withReason(h.events(), ReasonMPSLimitsKept)
	if len(kept) != 1 || !strings.Contains(kept[0], "Warning") || !strings.Contains(kept[0], "ml/a/main (12.0 GiB)") ||
		!strings.Contains(kept[0], "keep the limit they started with") || !strings.Contains(kept[0], "9.6 GiB each") {
		t.Errorf("MPSLimitsKept events: %q", kept)
	}
}

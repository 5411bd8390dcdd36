package plugin

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
)

func specs(n int) []gputest.GPUSpec {
	out := make([]gputest.GPUSpec, n)
	for i := range out {
		out[i] = gputest.GPU(gputest.UUID(i), 80<<30)
	}
	return out
}

func allIDs(gpus, replicas int) string {
	var parts []string
	for i := range gpus {
		parts = append(parts, ids(gputest.UUID(i), 0, replicas))
	}
	return want(parts...)
}

// A replica count whose list would crash the plugin, exhaust its memory or
// pass the kubelet's message limit is a rejected config: the last good one
// stays, and the log names the field and the resource.
func TestOversizedConfigKeptOut(t *testing.T) {
	rec := &records{}
	h := start(t, setup{config: config(4), gpus: specs(8), logs: rec})
	good := allIDs(8, 4)
	n := h.kubelet.waitList(gpuRes, good)
	for i, replicas := range []int{10_000, 1_000_000, math.MaxInt64} {
		h.writeConfig(config(replicas))
		h.waitMetric("reload failures", h.plugin.metrics.reloadFailures, float64(i+1))
		if v := testutil.ToFloat64(h.plugin.metrics.configValid); v != 0 {
			t.Errorf("replicas %d: config valid = %v, want 0", replicas, v)
		}
		msgs := strings.Join(rec.messages(slog.LevelError, "device-plugin config rejected"), "\n")
		if want := fmt.Sprintf(`sharing.timeSlicing.resources[0].replicas: %d for resource "nvidia.com/gpu" is above`, replicas); !strings.Contains(msgs, want) {
			t.Errorf("replicas %d: log %q lacks %q", replicas, msgs, want)
		}
	}
	if got := h.kubelet.waitList(gpuRes, good); got != n {
		t.Errorf("rejected configs changed the list: %d lists, want %d", got, n)
	}
	if got := testutil.ToFloat64(h.plugin.metrics.reloads); got != 1 {
		t.Errorf("reloads = %v, want 1", got)
	}
}

// A config applied before every GPU was read can pass the per-node limit
// only once more GPUs are found: the lists then stay as they were sent.
func TestConfigTooLargeForGPUsFoundLater(t *testing.T) {
	rec := &records{}
	gpus := specs(17)
	h := start(t, setup{config: config(maxReplicas), gpus: gpus[:16], logs: rec})
	list := allIDs(16, maxReplicas)
	n := h.kubelet.waitList(gpuRes, list)

	h.gpus.Set(gpus...)
	h.waitMetric("config valid", h.plugin.metrics.configValid, 0)
	msgs := strings.Join(rec.messages(slog.LevelError, "device-plugin config in use is too large"), "\n")
	if want := `17 GPUs gives resource "nvidia.com/gpu" 17408 device IDs`; !strings.Contains(msgs, want) {
		t.Errorf("log %q lacks %q", msgs, want)
	}
	if got := h.kubelet.waitList(gpuRes, list); got != n {
		t.Errorf("the list changed: %d lists, want %d", got, n)
	}

	// A config that fits is applied.
	h.writeConfig(config(4))
	h.kubelet.waitList(gpuRes, allIDs(17, 4))
	h.waitMetric("config valid", h.plugin.metrics.configValid, 1)
}

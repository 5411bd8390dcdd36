package controller

import (
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// TestObservationCarriesApplyCostAndLastDirection: the policy is told what
// a change costs in the cluster's apply mode and which way the last one
// went, as stored beside its time, so that it does not undo a change before
// it has settled.
func TestObservationCarriesApplyCostAndLastDirection(t *testing.T) {
	at := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	later := at.Add(time.Minute)
	for _, tc := range []struct {
		name string
		mode string
		rec  *Record
		want string
	}{
		{"no record", config.ModePlugin, nil, ""},
		{"stored direction", config.ModeConfigManager, &Record{Time: later, Direction: "", LastChange: &at, LastChangeDirection: policy.DirectionUp}, policy.DirectionUp},
		{"a record written by the change, before the field", config.ModeRestart, &Record{Time: at, Direction: policy.DirectionDown, LastChange: &at}, policy.DirectionDown},
		{"a later record without it: unknown", config.ModePlugin, &Record{Time: later, Direction: policy.DirectionDown, LastChange: &at}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(tc.mode, "obs-ns")
			c, err := New(Options{Config: cfg, Client: fake.NewClientset(), Source: &fakeSource{}})
			if err != nil {
				t.Fatal(err)
			}
			w := &work{node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}, st: &nodeState{}, record: tc.rec}
			obs := c.observation(w, 4, w.record.lastChange(), w.record.lastChangeDirection(), later, 0)
			cost, _ := policy.ApplyCostOf(tc.mode)
			if obs.Apply != cost || obs.Apply.Mode != tc.mode {
				t.Errorf("Apply = %+v, want %+v", obs.Apply, cost)
			}
			if obs.LastDirection != tc.want {
				t.Errorf("LastDirection = %q, want %q", obs.LastDirection, tc.want)
			}
		})
	}
}

// testRestartDirection: in restart mode the direction of a change is
// stored on the ConfigMap beside its time, in the update that writes the
// key, and read back as the policy's LastDirection.
func testRestartDirection(t *testing.T, env *testenv.Env) {
	cfg := testConfig(config.ModeRestart, "rd-ns")
	spans := tracetest.NewSpanRecorder()
	h := newHarness(t, env, cfg, nil, func(o *Options) {
		o.Tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)).Tracer("test")
	})
	h.namespace()
	h.configMap(map[string]string{"default": baseConfig})
	h.daemonSet()
	const node = "rd-node"
	h.node(node, nil, 4) // 1 GPU × 4
	// An OOM on a full GPU with 4 pods: lowered at once.
	h.src.set(node, signal{gpus: 1, used: 47 * gib, peak: 20 * gib, allocated: 4, advertised: 4, oomAt: h.now})
	h.round()
	cm := h.getConfigMap()
	if got := replicasOf(t, cm.Data["default"]); got >= 4 {
		t.Fatalf("key has %d replicas after an OOM with 4 pods, want fewer", got)
	}
	if got := cm.Annotations[AnnotationLastChangeDirection]; got != policy.DirectionDown || cm.Annotations[AnnotationLastChange] != h.now.Format(time.RFC3339) {
		t.Errorf("ConfigMap annotations %v, want %s=%s beside %s", cm.Annotations, AnnotationLastChangeDirection, policy.DirectionDown, AnnotationLastChange)
	}
	if r := h.record(node); r.LastChangeDirection != policy.DirectionDown {
		t.Errorf("node's last decision %+v, want lastChangeDirection down", r)
	}

	// The next round's decision is told so (its span carries what it was
	// told).
	h.advance(cfg.Interval)
	h.round()
	var told []string
	for _, s := range spans.Ended() {
		for _, kv := range s.Attributes() {
			if s.Name() == SpanDecide && kv.Key == "gpuslice.last_change_direction" {
				told = append(told, kv.Value.AsString())
			}
		}
	}
	if len(told) != 2 || told[0] != "" || told[1] != policy.DirectionDown {
		t.Errorf("the decisions were told the last change went %q, want \"\" then down", told)
	}
}

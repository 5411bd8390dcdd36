package controller

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

func TestGate(t *testing.T) {
	now := time.Date(2026, 1, 24, 12, 0, 0, 0, time.UTC)
	up := policy.Decision{Replicas: 5, Direction: policy.DirectionUp, Reason: policy.ReasonSustainedHeadroom, Message: "room"}
	down := policy.Decision{Replicas: 3, Direction: policy.DirectionDown, Reason: policy.ReasonGPUOOM, Message: "oom"}
	stay := policy.Decision{Replicas: 4, Reason: policy.ReasonCooldown, Message: "cooling"}
	in := func(d policy.Decision, change func(*gateInput)) gateInput {
		g := gateInput{now: now, current: 4, decision: d}
		if change != nil {
			change(&g)
		}
		return g
	}
	broken := errors.New(`ConfigMap c key "gpuslice-5" does not parse`)
	tests := []struct {
		name      string
		in        gateInput
		apply     bool
		reason    string
		eventType string
		message   string
	}{
		{"no change: the decision is recorded", in(stay, nil), false, policy.ReasonCooldown, "", "cooling"},
		{"a raise with nothing in the way", in(up, nil), true, policy.ReasonSustainedHeadroom, "", "room"},
		{"a lowering with nothing in the way", in(down, nil), true, policy.ReasonGPUOOM, "", "oom"},
		{"a broken target is refused", in(down, func(g *gateInput) { g.targetErr = broken }),
			false, ReasonConfigInvalid, corev1.EventTypeWarning, "lower 4 -> 3 (GPUOOM) refused: ConfigMap c key"},
		{"a held node refuses a lowering too", in(down, func(g *gateInput) { g.held = "verify failed" }),
			false, ReasonChangeHeld, corev1.EventTypeWarning, "lower 4 -> 3 (GPUOOM) held: verify failed"},
		{"a raise waits for the last change's verification", in(up, func(g *gateInput) { g.pending = "node n advertises 10" }),
			false, ReasonAwaitingVerify, "", "raise 4 -> 5 (SustainedHeadroom) waits until node n advertises 10"},
		{"a lowering does not wait for verification", in(down, func(g *gateInput) { g.pending = "node n advertises 10" }),
			true, policy.ReasonGPUOOM, "", "oom"},
		{"a raise waits for nodes without signals", in(up, func(g *gateInput) { g.unsignalled = []string{"b", "c"} }),
			false, ReasonNodesWithoutSignals, corev1.EventTypeWarning, "node(s) b, c share the config"},
		{"a lowering is not held by nodes without signals", in(down, func(g *gateInput) { g.unsignalled = []string{"b"} }),
			true, policy.ReasonGPUOOM, "", "oom"},
		{"a target not yet propagated waits, lowering too", in(down, func(g *gateInput) { g.readyAt = now.Add(30 * time.Second) }),
			false, ReasonAwaitingPropagation, "", "waits 30s more"},
		{"a target propagated just now is ready", in(up, func(g *gateInput) { g.readyAt = now }),
			true, policy.ReasonSustainedHeadroom, "", "room"},
		{"invalid beats held beats pending", in(up, func(g *gateInput) { g.targetErr, g.held, g.pending = broken, "h", "p" }),
			false, ReasonConfigInvalid, corev1.EventTypeWarning, "refused"},
		{"held beats pending", in(up, func(g *gateInput) { g.held, g.pending = "h", "p" }),
			false, ReasonChangeHeld, corev1.EventTypeWarning, "held: h"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := gate(tc.in)
			if v.apply != tc.apply || v.reason != tc.reason || v.eventType != tc.eventType || !strings.Contains(v.message, tc.message) {
				t.Errorf("gate = %+v, want apply %v, reason %s, event %q, message containing %q", v, tc.apply, tc.reason, tc.eventType, tc.message)
			}
		})
	}
}

package controller

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// Reasons the gate gives for not writing a change the policy asked for.
// ChangeHeld and ConfigInvalid are Warning Events; the others are recorded
// in the node's annotation only, since they pass by themselves.
const (
	// ReasonAwaitingPropagation: config-manager cannot see the target key
	// yet (the ConfigMap volume lags the API).
	ReasonAwaitingPropagation = "AwaitingPropagation"
	// ReasonNodesWithoutSignals: restart mode gives every node one count;
	// a raise is not made while a node that would get it shows no signals.
	ReasonNodesWithoutSignals = "NodesWithoutSignals"
)

// gateInput is everything the gate looks at for one change: state in.
type gateInput struct {
	now      time.Time
	current  int
	decision policy.Decision
	// pending describes a change still waiting for a node's allocatable
	// ("" when none); held says why changes are held after a failed
	// verification ("" when not held).
	pending, held string
	// targetErr says why the config the change would write cannot be
	// written (it exists and does not parse).
	targetErr error
	// readyAt is when the target config becomes visible to the node's
	// plugin; zero means at once.
	readyAt time.Time
	// unsignalled names nodes that would get the change but show no
	// signals (restart mode).
	unsignalled []string
}

// verdict is the gate's answer: write the change, or record why not.
type verdict struct {
	apply bool
	// reason and message go into the node's last-decision record: the
	// policy's own when the count stays or the change is written.
	reason, message string
	// eventType is the type of the Event a refusal records ("" for none).
	eventType string
}

// gate decides whether a policy decision is written now. It is pure: the
// same input gives the same verdict, so every rule is table-tested without
// an API server. Rules, in order:
//   - no change asked: nothing to write, the decision is recorded;
//   - the target config does not parse: refused (ConfigInvalid), never
//     overwritten;
//   - a failed verification holds the node: refused (ChangeHeld);
//   - a raise while the last change is unverified waits (AwaitingVerify):
//     two raises are never stacked blindly; a lowering does not wait;
//   - a raise while nodes sharing the config show no signals waits
//     (NodesWithoutSignals): their memory is unknown;
//   - the target not yet visible to the plugin waits (AwaitingPropagation),
//     lowering too: a label naming a key config-manager cannot see makes it
//     exit, so the change would not happen any sooner.
func gate(in gateInput) verdict {
	d := in.decision
	if d.Replicas == in.current {
		return verdict{reason: d.Reason, message: d.Message}
	}
	change := fmt.Sprintf("%s %d -> %d (%s)", verb(d), in.current, d.Replicas, d.Reason)
	switch up := d.Direction == policy.DirectionUp; {
	case in.targetErr != nil:
		return verdict{reason: ReasonConfigInvalid, eventType: corev1.EventTypeWarning,
			message: fmt.Sprintf("%s refused: %v; the tuner never overwrites it", change, in.targetErr)}
	case in.held != "":
		return verdict{reason: ReasonChangeHeld, eventType: corev1.EventTypeWarning,
			message: fmt.Sprintf("%s held: %s", change, in.held)}
	case up && in.pending != "":
		return verdict{reason: ReasonAwaitingVerify,
			message: fmt.Sprintf("%s waits until %s", change, in.pending)}
	case up && len(in.unsignalled) > 0:
		return verdict{reason: ReasonNodesWithoutSignals, eventType: corev1.EventTypeWarning,
			message: fmt.Sprintf("%s waits: node(s) %s share the config and show no GPU signals", change, strings.Join(in.unsignalled, ", "))}
	case in.now.Before(in.readyAt):
		return verdict{reason: ReasonAwaitingPropagation,
			message: fmt.Sprintf("%s waits %s more, until the node's plugin can see the config", change, in.readyAt.Sub(in.now))}
	}
	return verdict{apply: true, reason: d.Reason, message: d.Message}
}

func verb(d policy.Decision) string {
	if d.Direction == policy.DirectionUp {
		return "raise"
	}
	return "lower"
}

package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// Event reasons of the crash-loop lever, on the Pod (on the Node when the
// pod could not be read).
const (
	// ReasonCrashLoopEvicted: a container that OOMed again and again on a
	// full shared GPU had its pod evicted; its controller recreates it, and
	// it waits Pending for room instead of racing its neighbours.
	ReasonCrashLoopEvicted = "CrashLoopEvicted"
	// ReasonCrashLoopNotEvicted: such a loop was seen and left running; the
	// message says why (policy.evictCrashLoops off, a bare pod, a
	// PodDisruptionBudget, a dry run, an error).
	ReasonCrashLoopNotEvicted = "CrashLoopNotEvicted"
)

// Results of gpuslice_tuner_crash_loop_evictions_total.
const (
	evictEvicted  = "evicted"
	evictDisabled = "disabled"
	evictBare     = "bare"
	evictPDB      = "pdb"
	evictDryRun   = "dry_run"
	evictError    = "error"
)

// evictResults are every result, for counters created at 0.
var evictResults = []string{evictEvicted, evictDisabled, evictBare, evictPDB, evictDryRun, evictError}

// loopReport is what was last done about one crash-looping container.
type loopReport struct {
	result string
	// ooms is the loop's OOM count then: an evicted loop is acted on again
	// only when it OOMed since (a StatefulSet's pod comes back under the
	// same name, and the policy's record of the loop outlives the pod).
	ooms int
	seen time.Time
}

// crashLoops is the second lever (policy.Config.EvictCrashLoops): a pod
// whose container OOMs again and again on a full shared GPU is evicted
// through the Eviction API, so its controller recreates it and it waits
// Pending until it fits, instead of being restarted in place by the kubelet
// and racing its neighbours for memory again. A lowered count cannot end
// such a loop: it stops no running pod.
//
// It never deletes a pod: the API server's eviction honours
// PodDisruptionBudgets (a budget that allows no disruption answers 429,
// reported and tried again next round, not in a loop). It never evicts a
// bare pod, which nothing would recreate, and nothing in a dry run. Each
// loop is reported once per outcome (an Event, the
// gpuslice_tuner_crash_loop_evictions_total metric, a log line), not every
// round; a loop no decision has named for a policy window is forgotten.
func (c *Controller) crashLoops(ctx context.Context, w *work, loops []policy.CrashLoop, now time.Time) {
	st := w.st
	if st.loops == nil {
		st.loops = map[string]loopReport{}
	}
	for _, l := range loops {
		prev, known := st.loops[l.Container]
		switch {
		case !known:
		case prev.result == evictEvicted && l.OOMs <= prev.ooms:
			// Its replacement has not OOMed yet.
			prev.seen = now
			st.loops[l.Container] = prev
			continue
		case prev.result == evictDisabled || prev.result == evictBare:
			// Neither the option nor the pod's owner changes between
			// rounds: nothing to read again.
			prev.seen = now
			st.loops[l.Container] = prev
			continue
		}
		result, pod, why := c.evictLoop(ctx, l)
		if result == "" {
			continue // the pod is gone: its loop ended
		}
		if ctx.Err() != nil && (result == evictError || pod == nil) {
			// The round's context ended (leadership lost, or the round's
			// deadline) while the pod was read or evicted: no outcome of
			// the loop, nothing to report or count. The next round (or
			// leader) tries again.
			c.log.Info("round ended before a crash loop was acted on; trying again next round", "node", w.node.Name,
				"container", l.Container, "err", why, "cause", context.Cause(ctx))
			continue
		}
		r := loopReport{result: result, ooms: l.OOMs, seen: now}
		st.loops[l.Container] = r
		if known && prev.result == result && result != evictEvicted {
			continue // reported already
		}
		c.m.crashLoopEvictions.WithLabelValues(w.node.Name, result).Inc()
		c.reportLoop(w, l, pod, result, why)
	}
	for k, r := range st.loops {
		if now.Sub(r.seen) > c.cfg.Policy.Window {
			delete(st.loops, k)
		}
	}
}

// evictLoop evicts the pod of one loop when it may, and says what came of
// it: a result ("" when the pod is gone), the pod as read (nil when it
// could not be), and why it was not evicted.
func (c *Controller) evictLoop(ctx context.Context, l policy.CrashLoop) (result string, pod *corev1.Pod, why string) {
	if !l.Evict {
		return evictDisabled, c.loopPod(ctx, l), "policy.evictCrashLoops is off"
	}
	ns, name, ok := podOf(l.Container)
	if !ok {
		return evictError, nil, fmt.Sprintf("container key %q names no pod", l.Container)
	}
	p, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", nil, ""
	case err != nil:
		return evictError, nil, fmt.Sprintf("reading the pod: %v", err)
	}
	owner := metav1.GetControllerOf(p)
	if owner == nil {
		return evictBare, p, "it is a bare pod: nothing would recreate it"
	}
	if c.cfg.DryRun {
		return evictDryRun, p, "dry run"
	}
	err = c.evict(ctx, &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		// The pod read, not a namesake created since.
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}},
	})
	switch {
	case err == nil:
		return evictEvicted, p, ""
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return "", nil, "" // gone, or replaced, since it was read
	case apierrors.IsTooManyRequests(err):
		return evictPDB, p, fmt.Sprintf("a PodDisruptionBudget allows no disruption now (tried again next round): %v", err)
	}
	return evictError, p, fmt.Sprintf("the eviction failed (tried again next round): %v", err)
}

// evict asks the API server to evict a pod, once. A PodDisruptionBudget
// that allows no disruption is answered 429 with a Retry-After, which
// client-go's typed EvictV1 obeys up to ten times (measured: 100 s a call):
// a blocked eviction would hold the whole round and be retried in a loop.
// The next round is the retry.
func (c *Controller) evict(ctx context.Context, ev *policyv1.Eviction) error {
	rc, ok := c.client.CoreV1().RESTClient().(*rest.RESTClient)
	if !ok || rc == nil { // client-go's fakes have no REST client
		return c.client.CoreV1().Pods(ev.Namespace).EvictV1(ctx, ev)
	}
	return rc.Post().Namespace(ev.Namespace).Resource("pods").Name(ev.Name).SubResource("eviction").
		Body(ev).MaxRetries(0).Do(ctx).Error()
}

// loopPod reads a loop's pod for its Event, nil when it cannot be read.
func (c *Controller) loopPod(ctx context.Context, l policy.CrashLoop) *corev1.Pod {
	ns, name, ok := podOf(l.Container)
	if !ok {
		return nil
	}
	p, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return p
}

// reportLoop records one loop's outcome: an Event on its pod (or, when the
// pod could not be read, on the node) and a log line.
func (c *Controller) reportLoop(w *work, l policy.CrashLoop, pod *corev1.Pod, result, why string) {
	what := fmt.Sprintf("container %s OOMed %d times in a row on GPU %s of node %s, full and shared with other pods", l.Container, l.OOMs, l.GPU, w.node.Name)
	var ref runtime.Object = nodeRef(w.node.Name)
	if pod != nil {
		ref = pod
	}
	if result == evictEvicted {
		c.rec.Eventf(ref, corev1.EventTypeNormal, ReasonCrashLoopEvicted,
			"%s: evicted, so that its controller recreates it and it waits for room instead of racing its neighbours", what)
		c.log.Info("crash-looping pod evicted", "node", w.node.Name, "container", l.Container, "ooms", l.OOMs, "gpu", l.GPU)
		return
	}
	c.rec.Eventf(ref, corev1.EventTypeWarning, ReasonCrashLoopNotEvicted, "%s: not evicted: %s", what, why)
	c.log.Warn("crash-looping pod not evicted", "node", w.node.Name, "container", l.Container, "ooms", l.OOMs, "gpu", l.GPU,
		"result", result, "why", why)
}

// podOf splits a container key, namespace/pod/container.
func podOf(container string) (ns, pod string, ok bool) {
	ns, rest, ok1 := strings.Cut(container, "/")
	pod, _, ok2 := strings.Cut(rest, "/")
	return ns, pod, ok1 && ok2 && ns != "" && pod != ""
}

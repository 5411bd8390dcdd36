package controller

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// cronJobSuffix is the suffix the CronJob controller gives the Jobs it
// creates: the scheduled time in minutes since the epoch (8 digits and more
// since 1970-03).
var cronJobSuffix = regexp.MustCompile(`^(.+)-[0-9]{8,}$`)

// workloadKey names what a pod is an instance of, so that the tuner's
// workload memory (policy.Memory) recognises tomorrow's pod of today's job:
// "<namespace>/<Kind>/<name>" of its owning Deployment, StatefulSet,
// DaemonSet, CronJob or Job, and for a pod no controller owns, its first
// container's image ("<namespace>/image/<image>"): two bare pods of the same
// image are taken for one workload, the best guess without an owner.
//
// The owner is read from the pod alone, with no extra API call: a ReplicaSet
// named after its Deployment plus the pod-template-hash label is that
// Deployment; a Job whose name ends in the CronJob controller's
// scheduled-time suffix is taken for that CronJob. A ReplicaSet made by hand
// with a pod-template-hash label, or a Job named like a CronJob's, is
// mistaken for one; the price is a shared record, never a wrong write.
func workloadKey(p *corev1.Pod) string {
	if o := metav1.GetControllerOf(p); o != nil {
		name := o.Name
		kind := o.Kind
		switch kind {
		case "ReplicaSet":
			if h := p.Labels["pod-template-hash"]; h != "" && strings.HasSuffix(name, "-"+h) {
				kind, name = "Deployment", strings.TrimSuffix(name, "-"+h)
			}
		case "Job":
			if m := cronJobSuffix.FindStringSubmatch(name); m != nil {
				kind, name = "CronJob", m[1]
			}
		}
		return p.Namespace + "/" + kind + "/" + name
	}
	image := ""
	if len(p.Spec.Containers) > 0 {
		image = p.Spec.Containers[0].Image
	}
	if image == "" {
		return p.Namespace + "/Pod/" + p.Name
	}
	return p.Namespace + "/image/" + image
}

// maxOwnerLookups bounds the pods read from the API server in one round,
// over every node: a cluster full of new pods is named over a few rounds
// instead of in a burst.
const maxOwnerLookups = 32

// ownerTTL is how long a pod's workload key is kept after its containers
// were last seen in the samples.
const ownerTTL = time.Hour

// owners maps the pods whose GPU memory the samples show to their workload
// keys (workloadKey), reading each pod once: from the pending-pod cache when
// it is there (it was pending a moment ago), else with one GET. A pod that
// is gone is remembered as unknown: its containers are then their own
// workloads in policy.Memory, as a pod no record can price.
type owners struct {
	client kubernetes.Interface
	cache  listersv1.PodLister // the pending pods; may be nil
	known  map[string]ownerEntry
	log    *slog.Logger
	// lookups counts this round's reads, against maxOwnerLookups; the
	// round resets it (newRound), not each node's call.
	lookups int
}

// newRound starts a round's budget of lookups.
func (o *owners) newRound() { o.lookups = 0 }

type ownerEntry struct {
	key  string // "" when the pod is gone
	seen time.Time
}

// containerWorkloads is policy.Observation.ContainerWorkloads for gpus.
func (o *owners) containerWorkloads(ctx context.Context, now time.Time, gpus []policy.GPUObservation) map[string]string {
	out := map[string]string{}
	for _, g := range gpus {
		for _, s := range g.Samples {
			for c := range s.ContainerPeaks {
				if _, done := out[c]; done {
					continue
				}
				ns, rest, ok := strings.Cut(c, "/")
				pod, _, ok2 := strings.Cut(rest, "/")
				if !ok || !ok2 || ns == "" || pod == "" {
					continue
				}
				id := ns + "/" + pod
				e, ok := o.known[id]
				if !ok {
					if o.lookups >= maxOwnerLookups {
						continue
					}
					o.lookups++
					var resolved bool
					e, resolved = o.lookup(ctx, ns, pod)
					if !resolved {
						continue
					}
				}
				e.seen = now
				o.known[id] = e
				if e.key != "" {
					out[c] = e.key
				}
			}
		}
	}
	for id, e := range o.known {
		if now.Sub(e.seen) > ownerTTL {
			delete(o.known, id)
		}
	}
	return out
}

// lookup reads one pod; resolved is false when the answer is not known yet
// (an API error other than NotFound: asked again next round).
func (o *owners) lookup(ctx context.Context, ns, name string) (e ownerEntry, resolved bool) {
	if o.cache != nil {
		if p, err := o.cache.Pods(ns).Get(name); err == nil {
			return ownerEntry{key: workloadKey(p)}, true
		}
	}
	p, err := o.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return ownerEntry{}, true
	case err != nil:
		o.log.Debug("reading a pod's owner for the workload memory", "pod", ns+"/"+name, "err", err)
		return ownerEntry{}, false
	}
	return ownerEntry{key: workloadKey(p)}, true
}

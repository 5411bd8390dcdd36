package controller

import (
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

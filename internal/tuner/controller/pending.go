package controller

import (
	"cmp"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// pendingPods is a cluster-wide informer over the pods in phase Pending
// (a field selector, so running pods are never cached), stripped of their
// managed fields.
func pendingPods(c *Controller) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(c.client, 0,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.FieldSelector = "status.phase=Pending" }),
		informers.WithTransform(func(obj any) (any, error) {
			if p, ok := obj.(*corev1.Pod); ok {
				p.ManagedFields = nil
			}
			return obj, nil
		}))
}

// pendingPods is policy.Observation.Pending for node when its GPUs are
// advertised under resource, oldest first: the pods asking for resource that
// the scheduler found no room for (phase Pending, condition PodScheduled False
// with reason Unschedulable) asks for, among the pods that could run on the
// node. A pod is left out when its spec.nodeName names another node or its
// spec.nodeSelector does not match the node's labels. Node affinity, taints
// and tolerations, and every other scheduler predicate are not evaluated:
// a pod they keep off the node still counts, and can earn the node a raise
// it will not use.
func (c *Controller) pendingPods(node *corev1.Node, resource string) []policy.PendingPod {
	return asPending(c.waitingPods(node, resource), resource)
}

// asPending is the policy's view of waiting pods.
func asPending(waiting []*corev1.Pod, resource string) []policy.PendingPod {
	out := make([]policy.PendingPod, 0, len(waiting))
	for _, p := range waiting {
		out = append(out, policy.PendingPod{Workload: workloadKey(p), Replicas: int(podRequest(p, corev1.ResourceName(resource))),
			Since: p.CreationTimestamp.Time})
	}
	return out
}

// waitingPods are the pods behind pendingPods, oldest first.
func (c *Controller) waitingPods(node *corev1.Node, resource string) []*corev1.Pod {
	if c.pods == nil {
		return nil
	}
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return nil
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	var out []*corev1.Pod
	for _, p := range pods {
		if !unschedulable(p) {
			continue
		}
		if p.Spec.NodeName != "" && p.Spec.NodeName != node.Name {
			continue
		}
		if len(p.Spec.NodeSelector) > 0 && !labels.SelectorFromSet(p.Spec.NodeSelector).Matches(labels.Set(node.Labels)) {
			continue
		}
		if podRequest(p, corev1.ResourceName(resource)) > 0 {
			out = append(out, p)
		}
	}
	return out
}

// unschedulable says whether the scheduler tried the pod and found no node
// for it.
func unschedulable(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodPending || p.DeletionTimestamp != nil {
		return false
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled {
			return cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable
		}
	}
	return false
}

// podRequest is how much of res the scheduler reserves for the pod: the
// larger of its containers' sum (with the sidecars, init containers that
// keep running) and the largest init container together with the sidecars
// started before it. A container's amount is its request, else its limit
// (extended resources cannot be overcommitted: the two are equal when both
// are set).
func podRequest(p *corev1.Pod, res corev1.ResourceName) int64 {
	amount := func(c corev1.Container) int64 {
		q, ok := c.Resources.Requests[res]
		if !ok {
			q, ok = c.Resources.Limits[res]
		}
		if !ok {
			return 0
		}
		return q.Value()
	}
	var sum, sidecars, initMax int64
	for _, c := range p.Spec.Containers {
		sum += amount(c)
	}
	for _, c := range p.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sidecars += amount(c)
			initMax = max(initMax, sidecars)
			continue
		}
		initMax = max(initMax, sidecars+amount(c))
	}
	return max(sum+sidecars, initMax)
}

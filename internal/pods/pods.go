// Package pods answers "which pod and container is this?" for the exporter,
// from one of two sources: a pod informer on the API server limited to this
// node (the default: a watch, no polling), or the kubelet's own /pods endpoint
// (no API-server load and no RBAC beyond the node, for clusters that prefer
// it). Both keep a cache the exporter reads on every scrape without I/O.
package pods

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Source is a node's pods, looked up by UID.
type Source interface {
	// Get returns the pod with this UID, or false. The pod is shared: callers
	// must not modify it.
	Get(uid string) (*corev1.Pod, bool)
	// List returns every pod known on the node. Shared, read-only.
	List() []*corev1.Pod
	// Err says whether the source is healthy: nil once it has synced and its
	// last refresh worked.
	Err() error
}

// Notifier is a Source that can say when its pods changed, so that work
// which must not wait for the next scrape (reading a crashed container's
// OOM before the kubelet removes its log) runs at once.
type Notifier interface {
	// OnChange registers f, called (from the source's goroutine) after any
	// pod was added, changed or removed. f must not block.
	OnChange(f func())
}

// ContainerName returns the name of the container (regular, init or
// ephemeral) whose runtime ID is containerID (a bare ID as found in cgroup
// paths, without the "containerd://" scheme).
func ContainerName(pod *corev1.Pod, containerID string) (string, bool) {
	if containerID == "" {
		return "", false
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for i := range list {
			if StripScheme(list[i].ContainerID) == containerID {
				return list[i].Name, true
			}
		}
	}
	return "", false
}

// StripScheme turns "containerd://abc" into "abc".
func StripScheme(id string) string {
	if i := strings.Index(id, "://"); i >= 0 {
		return id[i+3:]
	}
	return id
}

package exporter

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/attribution"
	"github.com/gpuslice/gpuslice/internal/oom"
	"github.com/gpuslice/gpuslice/internal/pods"
)

// oomCounter feeds the OOM tracker what the exporter sees of containers
// and pods, and exposes its counters labelled with the GPU blamed and the
// kind. The tracker owns the OOM state and its one forget policy
// (oom.Tracker).
//
// Containers whose CUDA MPS clients all have a pinned memory limit on a GPU
// (those with a gpuslice_container_gpu_memory_limit_bytes series) are
// capped there (oom.Tracker.Cap): the out-of-memory error a client gets at
// its limit is CUDA's ordinary one, so their device OOMs count as kind
// process-cap. The tracker remembers it for its forget period, so an OOM
// read after the client exited, by the OOM watch between scrapes, counts
// the same.
type oomCounter struct {
	t *oom.Tracker
}

// podsByName indexes a pod source's pods by namespace and name.
func podsByName(src pods.Source) map[[2]string]*corev1.Pod {
	byName := map[[2]string]*corev1.Pod{}
	if src != nil {
		for _, p := range src.List() {
			byName[[2]string{p.Namespace, p.Name}] = p
		}
	}
	return byName
}

// mark watches a container from now on (again), blaming uuid for its OOMs
// when it has no GPU yet ("" when unknown).
func (o *oomCounter) mark(byName map[[2]string]*corev1.Pod, ns, pod, container, uuid string, now time.Time) {
	p := byName[[2]string{ns, pod}]
	if p == nil {
		return // no UID, so no log directory; the next scan may know it
	}
	o.t.Watch(oom.Container{Namespace: ns, Pod: pod, PodUID: logUID(p), Container: container}, uuid, now)
}

// markResult watches the containers that hold a GPU or run a process on one.
func (o *oomCounter) markResult(byName map[[2]string]*corev1.Pod, res attribution.Result, now time.Time) {
	// Holdings first: the allocated GPU is the one to blame when a container
	// also has processes elsewhere.
	for _, h := range res.Holdings {
		o.mark(byName, h.Namespace, h.Pod, h.Container.Container, h.UUID, now)
	}
	for _, u := range res.Usage {
		o.mark(byName, u.Namespace, u.Pod, u.Container.Container, u.UUID, now)
	}
}

// capped is a container seen as an MPS client on a GPU in this scrape,
// with a pinned memory limit (capped) or without.
type capped struct {
	namespace, pod, container, uuid string
	capped                          bool
}

// scan counts the OOMs of the containers in res. mpsGPUs holds the GPUs
// read in this scrape, true for those running an MPS server; caps their
// clients. Both are told to the tracker first, so that the counters a
// container starts with have the kind its OOMs will count under.
func (o *oomCounter) scan(res attribution.Result, mpsGPUs map[string]bool, caps []capped, src pods.Source, now time.Time) error {
	byName := podsByName(src)
	for uuid, on := range mpsGPUs {
		o.t.MPS(uuid, on)
	}
	for _, c := range caps {
		if p := byName[[2]string{c.namespace, c.pod}]; p != nil {
			o.t.Cap(oom.Container{Namespace: c.namespace, Pod: c.pod, PodUID: logUID(p), Container: c.container}, c.uuid, c.capped, now)
		}
	}
	o.markResult(byName, res, now)
	return o.scanWatched(byName, now)
}

// scanWatched reads the logs and terminations of every watched container
// and counts what is new.
func (o *oomCounter) scanWatched(byName map[[2]string]*corev1.Pod, now time.Time) error {
	return o.t.Scan(now, func(c oom.Container) []oom.Termination {
		p := byName[[2]string{c.Namespace, c.Pod}]
		if p == nil {
			return nil
		}
		return appendTerminations(nil, c, p)
	})
}

func (o *oomCounter) emit(em emitter, index map[string]string) {
	o.t.Counts(func(k oom.CountKey, n float64) {
		em.counter(oomEvents, n, k.Namespace, k.Pod, k.Container, index[k.UUID], k.UUID, string(k.Source), k.Kind.Label())
	})
}

// logUID is the UID in the pod's log directory name: for a static pod the
// UID of its manifest, which the mirror pod carries in an annotation.
func logUID(p *corev1.Pod) string {
	if m := p.Annotations["kubernetes.io/config.mirror"]; m != "" {
		return m
	}
	return string(p.UID)
}

func appendTerminations(terms []oom.Termination, c oom.Container, p *corev1.Pod) []oom.Termination {
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for i := range list {
			st := &list[i]
			if st.Name != c.Container {
				continue
			}
			if t := st.State.Terminated; t != nil {
				terms = append(terms, termination(c, int(st.RestartCount), t))
			}
			// While the container runs again, its last termination is the
			// run before (RestartCount-1). In back-off (CrashLoopBackOff)
			// the kubelet moves the run that just died into
			// LastTerminationState and keeps RestartCount at that run's
			// own number, its log R.log; both then carry its container ID.
			if t := st.LastTerminationState.Terminated; t != nil {
				switch {
				case t.ContainerID != "" && t.ContainerID == st.ContainerID:
					terms = append(terms, termination(c, int(st.RestartCount), t))
				case st.RestartCount > 0:
					terms = append(terms, termination(c, int(st.RestartCount)-1, t))
				}
			}
		}
	}
	return terms
}

func termination(c oom.Container, instance int, t *corev1.ContainerStateTerminated) oom.Termination {
	return oom.Termination{Container: c, Instance: instance, Reason: t.Reason, Message: t.Message, ExitCode: t.ExitCode, FinishedAt: t.FinishedAt.Time}
}

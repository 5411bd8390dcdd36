package exporter

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/attribution"
	"github.com/gpuslice/gpuslice/internal/oom"
	"github.com/gpuslice/gpuslice/internal/pods"
)

// watchFor is how long a container stays watched for OOMs after it last held
// a GPU or ran a GPU process: a container that crashed with a CUDA OOM has no
// GPU process any more, and its termination status and its log still have to
// be read.
const watchFor = 15 * time.Minute

// forgetCounterAfter drops the OOM series of a container that has not been
// watched for this long, so deleted pods do not grow the exposition forever.
// It is far longer than any alert's lookback.
const forgetCounterAfter = 6 * time.Hour

type containerKey struct{ ns, pod, container string }

type watched struct {
	c        oom.Container
	uuid     string
	lastSeen time.Time
}

type oomKey struct {
	containerKey
	uuid   string
	source oom.Source
}

type oomCount struct {
	n        float64
	lastSeen time.Time
}

// oomCounter turns the detector's events into cumulative counters labelled
// with the GPU the container used.
type oomCounter struct {
	watch  map[containerKey]*watched
	counts map[oomKey]*oomCount
}

func newOOMCounter() *oomCounter {
	return &oomCounter{watch: map[containerKey]*watched{}, counts: map[oomKey]*oomCount{}}
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
	k := containerKey{ns, pod, container}
	p := byName[[2]string{ns, pod}]
	if p == nil {
		return // no UID, so no log directory; the next scan may know it
	}
	w := o.watch[k]
	// A pod recreated under the same name (a StatefulSet's) has a new
	// UID, so new log files and new instances: start over.
	if w == nil || w.c.PodUID != logUID(p) {
		w = &watched{c: oom.Container{Namespace: ns, Pod: pod, PodUID: logUID(p), Container: container}, uuid: uuid}
		o.watch[k] = w
	}
	w.lastSeen = now
	if w.uuid == "" {
		w.uuid = uuid
	}
	// Counters exist at 0 from the moment a container is watched, so
	// the first OOM is an increase from 0 that increase() and rate()
	// see, not a series born at 1.
	for _, src := range []oom.Source{oom.SourceLog, oom.SourceTermination} {
		ck := oomKey{containerKey: k, uuid: w.uuid, source: src}
		if o.counts[ck] == nil {
			o.counts[ck] = &oomCount{lastSeen: now}
		}
	}
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

func (o *oomCounter) scan(d *oom.Detector, res attribution.Result, src pods.Source, now time.Time) error {
	byName := podsByName(src)
	o.markResult(byName, res, now)
	return o.scanWatched(d, byName, now)
}

// scanWatched reads the logs and terminations of every watched container
// and counts what is new.
func (o *oomCounter) scanWatched(d *oom.Detector, byName map[[2]string]*corev1.Pod, now time.Time) error {
	containers := make([]oom.Container, 0, len(o.watch))
	var terms []oom.Termination
	for k, w := range o.watch {
		if now.Sub(w.lastSeen) > watchFor {
			delete(o.watch, k)
			continue
		}
		containers = append(containers, w.c)
		if p := byName[[2]string{k.ns, k.pod}]; p != nil {
			terms = appendTerminations(terms, w.c, p)
		}
	}
	events, err := d.Scan(containers, terms)
	for _, ev := range events {
		k := containerKey{ev.Container.Namespace, ev.Container.Pod, ev.Container.Container}
		w := o.watch[k]
		if w == nil {
			continue
		}
		ck := oomKey{containerKey: k, uuid: w.uuid, source: ev.Source}
		c := o.counts[ck]
		if c == nil {
			c = &oomCount{}
			o.counts[ck] = c
		}
		c.n++
	}
	for ck, c := range o.counts {
		if w, ok := o.watch[ck.containerKey]; ok && w.uuid == ck.uuid {
			c.lastSeen = now
		} else if now.Sub(c.lastSeen) > forgetCounterAfter {
			delete(o.counts, ck)
		}
	}
	return err
}

func (o *oomCounter) emit(em emitter, index map[string]string) {
	for k, c := range o.counts {
		em.counter(oomEvents, c.n,
			k.ns, k.pod, k.container, index[k.uuid], k.uuid, string(k.source))
	}
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
			if t := st.LastTerminationState.Terminated; t != nil && st.RestartCount > 0 {
				terms = append(terms, termination(c, int(st.RestartCount)-1, t))
			}
		}
	}
	return terms
}

func termination(c oom.Container, instance int, t *corev1.ContainerStateTerminated) oom.Termination {
	return oom.Termination{Container: c, Instance: instance, Reason: t.Reason, Message: t.Message, ExitCode: t.ExitCode, FinishedAt: t.FinishedAt.Time}
}

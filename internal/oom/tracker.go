package oom

import (
	"slices"
	"time"
)

// Tracker owns all the OOM state of the exporter: which containers are
// watched, their cumulative event counts per GPU, source and kind (the
// gpuslice_gpu_oom_events_total series), which of them run under a memory
// cap of their own, and the Detector's read state.
// One period, ForgetAfter, governs all of it (see "Forgetting" in the
// package comment):
//
//   - A container is watched from the first time it is seen live (Watch)
//     until it has not been for ForgetAfter: its logs and terminations are
//     read at every Scan, so that an OOM found after it stopped (a crashed
//     container has no GPU process, a failed pod leaves the kubelet's
//     list) still counts.
//   - Its counters exist at 0 from when it is first watched, one per
//     source and per kind its OOMs can have (Kinds), so its first OOM is
//     an increase that increase() sees, and only ever grow. A
//     counter is dropped once its container has not been live, and the
//     counter has not grown, for ForgetAfter: a late event keeps its series
//     on view that long.
//   - When a container stops being watched, the Detector buries its read
//     state at once; the grave keeps it from counting old events again if
//     it is watched again.
//   - A container seen running under a memory cap of its own on a GPU
//     (Cap: a CUDA MPS client with a pinned device-memory limit) is
//     remembered as such until it has not been seen so for ForgetAfter, so
//     that an OOM read after its processes exited is still judged by it.
//
// Kind: an event counts under the Kind of the line that matched, except
// that a device OOM of a container capped on the GPU blamed counts as
// KindProcessCap. Under MPS a client that reaches its pinned limit gets
// CUDA's ordinary out-of-memory error (PyTorch's "CUDA out of memory",
// JAX's RESOURCE_EXHAUSTED), which does not say that the limit, not the
// GPU, ran out; the cap it hit is its own, as with PyTorch's
// per-process fraction.
//
// A Tracker is not safe for concurrent use.
type Tracker struct {
	d           *Detector
	forgetAfter time.Duration
	watch       map[containerKey]*watched
	counts      map[CountKey]*count
	// kinds are those each container's counters start at 0 with.
	kinds []Kind
	// caps holds, per container incarnation, the GPUs it was last seen
	// capped on (Cap) and when.
	caps map[Container]map[string]time.Time
}

// containerKey names a container across pod incarnations: a pod recreated
// under the same name (a StatefulSet's) has a new UID but the same series.
type containerKey struct{ ns, pod, container string }

type watched struct {
	c        Container
	uuid     string
	lastSeen time.Time
}

// CountKey names one counter: a container, the GPU blamed for its OOMs,
// the source of the events and their kind.
type CountKey struct {
	Namespace, Pod, Container string
	UUID                      string
	Source                    Source
	Kind                      Kind
}

type count struct {
	n        float64
	lastSeen time.Time // last seen live with this GPU, or last grown
}

// NewTracker returns a Tracker reading through d, whose Config.ForgetAfter
// is the period. d must not be scanned by anything else.
func NewTracker(d *Detector) *Tracker {
	kinds := d.Kinds()
	if slices.Contains(kinds, KindDevice) && !slices.Contains(kinds, KindProcessCap) {
		// A capped container's device OOMs count as process-cap.
		kinds = slices.Insert(kinds, 1, KindProcessCap)
	}
	return &Tracker{d: d, forgetAfter: d.forgetAfter, watch: map[containerKey]*watched{}, counts: map[CountKey]*count{},
		kinds: kinds, caps: map[Container]map[string]time.Time{}}
}

// Kinds are the kinds of a container's counters, each at 0 from when it is
// first watched: the Detector's, and KindProcessCap where it has
// KindDevice (see Cap).
func (t *Tracker) Kinds() []Kind { return slices.Clone(t.kinds) }

// ForgetAfter is the period of the forget policy.
func (t *Tracker) ForgetAfter() time.Duration { return t.forgetAfter }

// Watch records that c is live at now: it holds or uses GPU uuid, or asks
// for a GPU ("" when it is not known which). uuid is blamed for the
// container's OOMs unless an earlier Watch of the same pod incarnation
// named one; a new pod UID starts the container over (new log files, new
// instances), its counters going on.
func (t *Tracker) Watch(c Container, uuid string, now time.Time) {
	k := containerKey{c.Namespace, c.Pod, c.Container}
	w := t.watch[k]
	if w == nil || w.c.PodUID != c.PodUID {
		if w != nil {
			t.d.forget(w.c)
			delete(t.caps, w.c)
		}
		w = &watched{c: c, uuid: uuid}
		t.watch[k] = w
	}
	w.lastSeen = now
	if w.uuid == "" {
		w.uuid = uuid
	}
	for _, src := range []Source{SourceLog, SourceTermination} {
		for _, kind := range t.kinds {
			ck := CountKey{c.Namespace, c.Pod, c.Container, w.uuid, src, kind}
			if cn := t.counts[ck]; cn == nil {
				t.counts[ck] = &count{lastSeen: now}
			} else {
				cn.lastSeen = now
			}
		}
	}
}

// Cap records that c runs under a memory cap of its own on GPU uuid at
// now: it is a CUDA MPS client with a pinned device-memory limit there. Its
// device OOMs blamed on uuid count as KindProcessCap from now until it has
// not been seen capped for ForgetAfter, whether or not its processes still
// run when the OOM is read. A container never capped keeps the kinds of its
// lines; a new pod UID starts over (see Watch).
func (t *Tracker) Cap(c Container, uuid string, now time.Time) {
	m := t.caps[c]
	if m == nil {
		m = map[string]time.Time{}
		t.caps[c] = m
	}
	m[uuid] = now
}

// kind is the kind an event of c blamed on uuid counts under.
func (t *Tracker) kind(ev Event, uuid string) Kind {
	if ev.Kind == KindDevice {
		if _, ok := t.caps[ev.Container][uuid]; ok {
			return KindProcessCap
		}
	}
	return ev.Kind
}

// Scan reads the logs of the watched containers and the terminations that
// terms returns for each (nil for none), counts what is new, and forgets
// what the policy says. The error is the Detector's (PodLogsDir
// unreadable); events of terminations still count then.
func (t *Tracker) Scan(now time.Time, terms func(Container) []Termination) error {
	containers := make([]Container, 0, len(t.watch))
	var ts []Termination
	var gone []Container
	for k, w := range t.watch {
		if now.Sub(w.lastSeen) > t.forgetAfter {
			delete(t.watch, k)
			gone = append(gone, w.c)
			continue
		}
		containers = append(containers, w.c)
		if terms != nil {
			ts = append(ts, terms(w.c)...)
		}
	}
	t.d.forget(gone...)
	for c, m := range t.caps {
		for uuid, seen := range m {
			if now.Sub(seen) > t.forgetAfter {
				delete(m, uuid)
			}
		}
		if len(m) == 0 {
			delete(t.caps, c)
		}
	}
	events, err := t.d.Scan(containers, ts)
	for _, ev := range events {
		w := t.watch[containerKey{ev.Container.Namespace, ev.Container.Pod, ev.Container.Container}]
		if w == nil {
			continue
		}
		ck := CountKey{ev.Container.Namespace, ev.Container.Pod, ev.Container.Container, w.uuid, ev.Source, t.kind(ev, w.uuid)}
		cn := t.counts[ck]
		if cn == nil {
			cn = &count{}
			t.counts[ck] = cn
		}
		cn.n++
		cn.lastSeen = now
	}
	for ck, cn := range t.counts {
		if now.Sub(cn.lastSeen) > t.forgetAfter {
			delete(t.counts, ck)
		}
	}
	return err
}

// Counts calls f with every counter.
func (t *Tracker) Counts(f func(CountKey, float64)) {
	for ck, cn := range t.counts {
		f(ck, cn.n)
	}
}

// forget buries the read state of cs now: the Tracker no longer watches
// them.
func (d *Detector) forget(cs ...Container) {
	checked, rootReadable := false, false
	for _, c := range cs {
		st := d.containers[c]
		if st == nil {
			continue
		}
		if !checked {
			checked, rootReadable = true, d.root != "" && d.checkRoot() == nil
		}
		d.bury(st, rootReadable)
		delete(d.containers, c)
	}
}

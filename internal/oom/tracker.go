package oom

import (
	"time"
)

// Tracker owns all the OOM state of the exporter: which containers are
// watched, their cumulative event counts per GPU and source (the
// gpuslice_gpu_oom_events_total series), and the Detector's read state.
// One period, ForgetAfter, governs all of it (see "Forgetting" in the
// package comment):
//
//   - A container is watched from the first time it is seen live (Watch)
//     until it has not been for ForgetAfter: its logs and terminations are
//     read at every Scan, so that an OOM found after it stopped (a crashed
//     container has no GPU process, a failed pod leaves the kubelet's
//     list) still counts.
//   - Its counters exist at 0 from when it is first watched, so its first
//     OOM is an increase that increase() sees, and only ever grow. A
//     counter is dropped once its container has not been live, and the
//     counter has not grown, for ForgetAfter: a late event keeps its series
//     on view that long.
//   - When a container stops being watched, the Detector buries its read
//     state at once; the grave keeps it from counting old events again if
//     it is watched again.
//
// A Tracker is not safe for concurrent use.
type Tracker struct {
	d           *Detector
	forgetAfter time.Duration
	watch       map[containerKey]*watched
	counts      map[CountKey]*count
}

// containerKey names a container across pod incarnations: a pod recreated
// under the same name (a StatefulSet's) has a new UID but the same series.
type containerKey struct{ ns, pod, container string }

type watched struct {
	c        Container
	uuid     string
	lastSeen time.Time
}

// CountKey names one counter: a container, the GPU blamed for its OOMs and
// the source of the events.
type CountKey struct {
	Namespace, Pod, Container string
	UUID                      string
	Source                    Source
}

type count struct {
	n        float64
	lastSeen time.Time // last seen live with this GPU, or last grown
}

// NewTracker returns a Tracker reading through d, whose Config.ForgetAfter
// is the period. d must not be scanned by anything else.
func NewTracker(d *Detector) *Tracker {
	return &Tracker{d: d, forgetAfter: d.forgetAfter, watch: map[containerKey]*watched{}, counts: map[CountKey]*count{}}
}

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
		}
		w = &watched{c: c, uuid: uuid}
		t.watch[k] = w
	}
	w.lastSeen = now
	if w.uuid == "" {
		w.uuid = uuid
	}
	for _, src := range []Source{SourceLog, SourceTermination} {
		ck := CountKey{c.Namespace, c.Pod, c.Container, w.uuid, src}
		if cn := t.counts[ck]; cn == nil {
			t.counts[ck] = &count{lastSeen: now}
		} else {
			cn.lastSeen = now
		}
	}
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
	events, err := t.d.Scan(containers, ts)
	for _, ev := range events {
		w := t.watch[containerKey{ev.Container.Namespace, ev.Container.Pod, ev.Container.Container}]
		if w == nil {
			continue
		}
		ck := CountKey{ev.Container.Namespace, ev.Container.Pod, ev.Container.Container, w.uuid, ev.Source}
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

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
//     source, of the kind its plain GPU OOM would count under (ZeroKind:
//     device, or process-cap on an MPS GPU), so its first such OOM is an
//     increase that increase() sees, and only ever grow. The other kinds'
//     counters appear with their first event (the alerts look for new
//     series too): zeros of every kind tripled the series of a node, and
//     the text of a scrape with them. A
//     counter is dropped once its container has not been live, and the
//     counter has not grown, for ForgetAfter: a late event keeps its series
//     on view that long.
//   - When a container stops being watched, the Detector buries its read
//     state at once; the grave keeps it from counting old events again if
//     it is watched again.
//   - A container seen as a CUDA MPS client on a GPU, with a pinned
//     device-memory limit or without (Cap), is remembered as such until it
//     has not been seen so for ForgetAfter, so that an OOM read after its
//     processes exited is still judged by it.
//
// Kind: an event counts under the Kind of the line that matched, except
// that a device OOM blamed on a GPU shared through MPS counts as
// KindProcessCap: that of a container seen there with a pinned limit, and
// that of a container never seen there as a client at all while the GPU
// runs an MPS server (MPS, or asked as the OOM is read: SetMPSProbe).
// Under MPS a client that reaches its pinned
// limit gets CUDA's ordinary out-of-memory error (PyTorch's "CUDA out of
// memory", JAX's RESOURCE_EXHAUSTED), which does not say that the limit,
// not the GPU, ran out; the cap it hit is its own, as with PyTorch's
// per-process fraction. A client that fails at its limit as it starts
// (a model larger than its share, the usual case) exits before any scrape
// sees it, so the GPU's MPS server, not the client, has to tell: on a
// real H200 the first exporter to judge by seen clients alone counted
// such an OOM as device. Every MPS device plugin (NVIDIA's, gpuslice's)
// gives each client a limit; a client seen without one keeps device.
//
// A Tracker is not safe for concurrent use.
type Tracker struct {
	d           *Detector
	forgetAfter time.Duration
	watch       map[containerKey]*watched
	counts      map[CountKey]*count
	// base is the kind of a plain GPU OOM line for this detector: device,
	// or for patterns of the user's alone, the first of their kinds.
	base Kind
	// caps holds, per container incarnation, the GPUs it was last seen an
	// MPS client on (Cap), whether with a pinned limit, and when.
	caps map[Container]map[string]capSeen
	// mps holds the GPUs that ran an MPS server at their last reading.
	mps map[string]bool
	// mpsNow, when set, reads whether a GPU runs an MPS server now
	// (SetMPSProbe); read holds the GPUs MPS was told of since the last
	// Scan: that Scan need not ask again.
	mpsNow func(uuid string) bool
	read   map[string]bool
}

// capSeen is a container last seen an MPS client of a GPU at seen, with a
// pinned limit or not.
type capSeen struct {
	capped bool
	seen   time.Time
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
	base := KindUnknown
	if kinds := d.Kinds(); slices.Contains(kinds, KindDevice) {
		base = KindDevice
	} else if len(kinds) > 0 {
		base = kinds[0]
	}
	return &Tracker{d: d, forgetAfter: d.forgetAfter, watch: map[containerKey]*watched{}, counts: map[CountKey]*count{},
		base: base, caps: map[Container]map[string]capSeen{}, mps: map[string]bool{}, read: map[string]bool{}}
}

// ZeroKind is the kind of c's counters at 0 on GPU uuid: that of a plain
// GPU OOM line of c there (see Kind in the type's comment).
func (t *Tracker) ZeroKind(c Container, uuid string) Kind {
	return t.kind(Event{Container: c, Kind: t.base}, uuid)
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
			delete(t.caps, w.c)
		}
		w = &watched{c: c, uuid: uuid}
		t.watch[k] = w
	}
	w.lastSeen = now
	if w.uuid == "" {
		w.uuid = uuid
	}
	kind := t.ZeroKind(c, w.uuid)
	for _, src := range []Source{SourceLog, SourceTermination} {
		ck := CountKey{c.Namespace, c.Pod, c.Container, w.uuid, src, kind}
		if cn := t.counts[ck]; cn == nil {
			t.counts[ck] = &count{lastSeen: now}
		} else {
			cn.lastSeen = now
		}
	}
}

// Cap records that c is a CUDA MPS client of GPU uuid at now, with a
// pinned device-memory limit there (capped) or without. Its device OOMs
// blamed on uuid count as KindProcessCap when capped, as KindDevice when
// not, from now until it has not been seen a client for ForgetAfter,
// whether or not its processes still run when the OOM is read. A new pod
// UID starts over (see Watch).
func (t *Tracker) Cap(c Container, uuid string, capped bool, now time.Time) {
	m := t.caps[c]
	if m == nil {
		m = map[string]capSeen{}
		t.caps[c] = m
	}
	m[uuid] = capSeen{capped, now}
}

// MPS records whether GPU uuid ran an MPS server at its latest reading:
// the device OOMs blamed on it of containers never seen its clients count
// as KindProcessCap while it does.
func (t *Tracker) MPS(uuid string, on bool) {
	t.read[uuid] = on
	if on {
		t.mps[uuid] = true
	} else {
		delete(t.mps, uuid)
	}
}

// SetMPSProbe gives the Tracker a reading of whether GPU uuid runs an MPS
// server now. It is asked only for a device OOM of a container never seen
// an MPS client there, on a GPU whose last reading (MPS) had no server,
// and then once per Scan, and not when MPS was told of it since the last
// Scan (a scrape's own reading): logs are read between readings, and the client
// that fails at its limit as it starts may be the first the server has
// served since the last one. On a real H200 such an OOM, read by the OOM
// watch before any scrape had seen the server, counted as device.
func (t *Tracker) SetMPSProbe(f func(uuid string) bool) { t.mpsNow = f }

// kindNow is kind, after asking the MPS probe (SetMPSProbe) about a device
// OOM that the last reading of uuid would count as device for want of a
// server. probed keeps the answers of one Scan, MPS's since the last
// one among them.
func (t *Tracker) kindNow(ev Event, uuid string, probed map[string]bool) Kind {
	k := t.kind(ev, uuid)
	if k != KindDevice || ev.Kind != KindDevice || t.mpsNow == nil || uuid == "" || t.mps[uuid] {
		return k
	}
	if _, seen := t.caps[ev.Container][uuid]; seen {
		return k // a client seen without a limit: its OOM is the GPU's
	}
	on, asked := probed[uuid]
	if !asked {
		on = t.mpsNow(uuid)
		probed[uuid] = on
	}
	if !on {
		return k
	}
	t.mps[uuid] = true
	return t.kind(ev, uuid)
}

// kind is the kind an event of c blamed on uuid counts under.
func (t *Tracker) kind(ev Event, uuid string) Kind {
	if ev.Kind != KindDevice {
		return ev.Kind
	}
	if c, ok := t.caps[ev.Container][uuid]; ok {
		if c.capped {
			return KindProcessCap
		}
		return KindDevice
	}
	if t.mps[uuid] {
		return KindProcessCap
	}
	return KindDevice
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
		for uuid, c := range m {
			if now.Sub(c.seen) > t.forgetAfter {
				delete(m, uuid)
			}
		}
		if len(m) == 0 {
			delete(t.caps, c)
		}
	}
	events, err := t.d.Scan(containers, ts)
	probed := t.read
	t.read = map[string]bool{}
	for _, ev := range events {
		w := t.watch[containerKey{ev.Container.Namespace, ev.Container.Pod, ev.Container.Container}]
		if w == nil {
			continue
		}
		ck := CountKey{ev.Container.Namespace, ev.Container.Pod, ev.Container.Container, w.uuid, ev.Source, t.kindNow(ev, w.uuid, probed)}
		cn := t.counts[ck]
		if cn == nil {
			cn = &count{}
			t.counts[ck] = cn
		}
		cn.n++
		cn.lastSeen = now
	}
	for ck, cn := range t.counts {
		if now.Sub(cn.lastSeen) <= t.forgetAfter {
			continue
		}
		// A container still live keeps every counter it has on its GPU,
		// not only the ones Watch keeps at 0: dropped, an encoder-session
		// counter at 1 would come back at 1 with the next such OOM, and
		// increase() would see no event. Counters of a GPU it no longer
		// uses (a pod recreated elsewhere under its name) go by the period.
		if w := t.watch[containerKey{ck.Namespace, ck.Pod, ck.Container}]; w != nil && ck.UUID == w.uuid && now.Sub(w.lastSeen) <= t.forgetAfter {
			continue
		}
		delete(t.counts, ck)
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

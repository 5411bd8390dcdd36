package exporter

import (
	"time"

	"github.com/gpuslice/gpuslice/internal/attribution"
)

// containerKey names a container by its labels.
type containerKey struct{ ns, pod, container string }

// holderKey is one container holding replica IDs of one physical GPU.
type holderKey struct {
	containerKey
	uuid string
}

// idleTracker remembers, between scrapes, when each container holding a
// replica ID last used its GPU. A notebook or a service that holds a replica
// for days without running a kernel blocks a pending pod as surely as a busy
// one, and no single scrape can tell how long it has been idle.
type idleTracker struct {
	lastActive map[holderKey]time.Time
}

func newIdleTracker() *idleTracker {
	return &idleTracker{lastActive: map[holderKey]time.Time{}}
}

// active tells whether a container used its GPU in the last sample period:
// it has a process there, and that process ran a kernel. Where the GPU
// gives no per-process SM figure (MIG, old GPUs), a process is all there is
// to go by, and the container counts as active rather than wrongly idle.
func active(u *attribution.Usage) bool {
	return u != nil && u.Processes > 0 && (!u.HasSM || u.SMUtilization > 0)
}

// update judges every holder in res at now and returns how long each has
// been idle: 0 for an active one, otherwise the time since it was last
// active, or since this exporter first saw it hold the GPU. gpus are the
// GPUs read in this scrape: a holder of a GPU that was not read is neither
// judged nor reported, and keeps its clock. Holders no longer listed are
// forgotten, so the caller must not call update when the allocations could
// not be read.
func (t *idleTracker) update(res attribution.Result, gpus map[string]bool, now time.Time) map[holderKey]time.Duration {
	usage := make(map[holderKey]*attribution.Usage, len(res.Usage))
	for i := range res.Usage {
		u := &res.Usage[i]
		usage[holderKey{containerKey{u.Namespace, u.Pod, u.Container.Container}, u.UUID}] = u
	}
	idle := make(map[holderKey]time.Duration, len(res.Holdings))
	held := make(map[holderKey]bool, len(res.Holdings))
	for _, h := range res.Holdings {
		k := holderKey{containerKey{h.Namespace, h.Pod, h.Container.Container}, h.UUID}
		held[k] = true
		last, seen := t.lastActive[k]
		if !gpus[h.UUID] {
			if !seen {
				t.lastActive[k] = now
			}
			continue
		}
		if !seen || active(usage[k]) {
			last = now
			t.lastActive[k] = now
		}
		idle[k] = now.Sub(last)
	}
	for k := range t.lastActive {
		if !held[k] {
			delete(t.lastActive, k)
		}
	}
	return idle
}

func emitIdle(em emitter, idle map[holderKey]time.Duration, index map[string]string) {
	for k, d := range idle {
		em.gauge(containerIdle, d.Seconds(), k.ns, k.pod, k.container, index[k.uuid], k.uuid)
	}
}

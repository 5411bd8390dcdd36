package plugin

import (
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/gpuslice/gpuslice/internal/gpu"
)

// applicationXids are the Xids NVIDIA's device plugin ignores: they report a
// failed application, not a failed GPU (graphics engine exception, GPU memory
// page fault, GPU stopped processing, preemptive cleanup, video processor
// exception, context switch timeout). Every other Xid is critical.
var applicationXids = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

// CriticalXid reports whether an Xid marks a GPU unhealthy.
func CriticalXid(xid uint64) bool { return !applicationXids[xid] }

// healthTracker turns backend readings into a GPU inventory with health.
// A GPU is unhealthy from a critical Xid, a failed reading, or a reading in
// which it is missing; it is healthy again once it answers a reading and the
// recovery interval has passed since the last of those.
type healthTracker struct {
	recovery  time.Duration
	log       *slog.Logger
	known     map[string]gpuInfo // by UUID; a GPU once seen stays known
	answering map[string]bool    // in Snapshot.Devices of the last reading
	lastBad   map[string]time.Time
	xids      map[xidKey]uint64
	healthy   map[string]bool // as last reported, to log transitions
}

type xidKey struct {
	uuid string
	xid  uint64
}

func newHealthTracker(recovery time.Duration, log *slog.Logger) *healthTracker {
	return &healthTracker{
		recovery: recovery, log: log,
		known: map[string]gpuInfo{}, answering: map[string]bool{}, lastBad: map[string]time.Time{},
		xids: map[xidKey]uint64{}, healthy: map[string]bool{},
	}
}

// observe takes one reading (snapErr set when nothing could be read) and the
// Xid counts, and reports whether any GPU's health or the inventory changed.
func (h *healthTracker) observe(now time.Time, snap gpu.Snapshot, snapErr error, xids []gpu.XidCount) bool {
	before := len(h.known)
	migChanged := false
	bad := func(uuid, why string) {
		h.lastBad[uuid] = now
		if h.healthy[uuid] || !h.seen(uuid) {
			h.log.Warn("GPU unhealthy", "gpu", uuid, "reason", why)
		}
	}
	if snapErr != nil {
		for uuid := range h.known {
			bad(uuid, "GPU backend unavailable: "+snapErr.Error())
		}
		clear(h.answering)
	} else {
		clear(h.answering)
		for _, d := range snap.Devices {
			if prev, ok := h.known[d.UUID]; ok && prev.MIGEnabled != d.MIGEnabled {
				// Whether the GPU is advertised may change (desires).
				h.log.Info("GPU MIG mode changed", "gpu", d.UUID, "mig_enabled", d.MIGEnabled)
				migChanged = true
			}
			h.known[d.UUID] = gpuInfo{UUID: d.UUID, Index: d.Index, MemoryTotalBytes: d.MemoryTotalBytes, MIGEnabled: d.MIGEnabled}
			h.answering[d.UUID] = true
		}
		for _, f := range snap.Failed {
			if f.UUID == "" {
				continue // a GPU not even naming itself: missing below
			}
			if _, ok := h.known[f.UUID]; !ok {
				h.known[f.UUID] = gpuInfo{UUID: f.UUID, Index: f.Index}
			}
			bad(f.UUID, "reading failed: "+f.Err.Error())
		}
		for uuid := range h.known {
			if !h.answering[uuid] && !slices.ContainsFunc(snap.Failed, func(f gpu.DeviceError) bool { return f.UUID == uuid }) {
				bad(uuid, "missing from the GPU reading")
			}
		}
	}
	for _, x := range xids {
		k := xidKey{x.UUID, x.Xid}
		if x.Count <= h.xids[k] {
			continue
		}
		h.xids[k] = x.Count
		if CriticalXid(x.Xid) {
			h.lastBad[x.UUID] = now
			h.log.Warn("GPU unhealthy: critical Xid", "gpu", x.UUID, "xid", x.Xid, "count", x.Count)
		} else {
			h.log.Info("application Xid, GPU stays healthy", "gpu", x.UUID, "xid", x.Xid, "count", x.Count)
		}
	}
	changed := len(h.known) != before || migChanged
	for uuid := range h.known {
		ok := h.isHealthy(uuid, now)
		if prev, seen := h.healthy[uuid]; !seen || prev != ok {
			changed = true
			if seen && ok {
				h.log.Info("GPU healthy again", "gpu", uuid)
			}
		}
		h.healthy[uuid] = ok
	}
	return changed
}

func (h *healthTracker) seen(uuid string) bool {
	_, ok := h.healthy[uuid]
	return ok
}

func (h *healthTracker) isHealthy(uuid string, now time.Time) bool {
	if !h.answering[uuid] {
		return false
	}
	t, ok := h.lastBad[uuid]
	return !ok || now.Sub(t) >= h.recovery
}

// gpus returns the inventory with health as of the last observe.
func (h *healthTracker) gpus() []gpuInfo {
	out := make([]gpuInfo, 0, len(h.known))
	for _, uuid := range slices.Sorted(maps.Keys(h.known)) {
		g := h.known[uuid]
		g.Healthy = h.healthy[uuid]
		out = append(out, g)
	}
	return out
}

func (h *healthTracker) unhealthy() int {
	n := 0
	for uuid := range h.known {
		if !h.healthy[uuid] {
			n++
		}
	}
	return n
}

package nvmlbackend

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuslice/gpuslice/internal/gpu"
)

// sampleWindow is, for one GPU, where the previous reading's samples
// ended. Each reading asks NVML only for samples newer than these, so the
// GPU's utilization and its processes' SM shares cover one window: the
// time since the previous reading. Before, the GPU read NVML's last sample
// period (nvmlDeviceGetUtilizationRates) while its processes read an
// average since the last reading, and on a real H200 one busy pod read
// 0.41 on a GPU that read 0.20 in the same scrape.
type sampleWindow struct {
	// procSeen is the newest process-utilization sample timestamp read
	// (NVML's CPU timestamps, microseconds).
	procSeen uint64
	// utilSeen is the newest GPU_UTILIZATION_SAMPLES timestamp read.
	utilSeen uint64
	// noUtilSamples: the GPU answered ERROR_NOT_SUPPORTED to
	// nvmlDeviceGetSamples; it never will, so it is not asked again.
	noUtilSamples bool

	// graphicsRead is when the graphics process list was last read,
	// graphicsAny that it listed a process, and unexplained the least
	// used memory the compute list has not accounted for since then
	// (graphicsDue).
	graphicsRead time.Time
	graphicsAny  bool
	unexplained  uint64

	// shares is each process's SM share in the last window that had
	// samples, by PID: what a reading within the same sample period
	// gives again.
	shares map[int]float64
}

// graphicsRecheck is the longest the graphics process list goes unread on
// a GPU whose last list was empty. On a real H200 the list costs 0.72 ms of
// a 7.4 ms scrape (48 CUDA processes, make test-gpu's CPU profile), a
// driver round trip that answers nothing on a compute node: pods there
// run CUDA, and a process with a graphics context as well is in the
// compute list with its whole memory too.
const graphicsRecheck = 30 * time.Second

// graphicsSlack is how far the used memory the compute list does not
// account for may rise above its least since the graphics list was last
// read before the list is read again: a new graphics-only context holds
// memory the compute list lacks (Xorg's smallest, 4 MiB, in nvidia-smi).
// Less than a MiB would read the list on the rounding of NVML's figures.
const graphicsSlack = 2 << 20

// unexplainedMemory is the GPU's used memory less what its compute
// processes hold; known is false when that cannot be told (the list could
// not be read, or a process's memory is not available to this caller).
func unexplainedMemory(used uint64, compute []nvml.ProcessInfo, computeOK bool) (unexplained uint64, known bool) {
	if !computeOK {
		return 0, false
	}
	var held uint64
	for _, p := range compute {
		if p.UsedGpuMemory == notAvailable {
			return 0, false
		}
		held += p.UsedGpuMemory
	}
	if held >= used {
		return 0, true
	}
	return used - held, true
}

// graphicsDue reports whether GPU uuid's graphics process list is to be
// read now: always while the last one listed a process (its memory and
// share move), when the memory the compute list does not account for has
// risen by graphicsSlack above its least since the last read (something
// outside the compute list took memory: a graphics process, or a compute
// process that ended between the two readings, which costs one list), when
// that cannot be told, and at least every graphicsRecheck. Otherwise it
// notes the least unexplained memory seen.
func (b *Backend) graphicsDue(uuid string, unexplained uint64, known bool, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.windows[uuid]
	switch {
	case w.graphicsRead.IsZero(), w.graphicsAny, !known,
		unexplained > w.unexplained+graphicsSlack,
		!now.Before(w.graphicsRead.Add(graphicsRecheck)), now.Before(w.graphicsRead):
		return true
	}
	w.unexplained = min(w.unexplained, unexplained)
	b.windows[uuid] = w
	return false
}

// window returns a copy of the sample window of GPU uuid.
func (b *Backend) window(uuid string) sampleWindow {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.windows[uuid]
}

// updateWindow changes the sample window of GPU uuid under the lock.
func (b *Backend) updateWindow(uuid string, f func(w *sampleWindow)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.windows[uuid]
	f(&w)
	b.windows[uuid] = w
}

// utilReading is a GPU's utilization as readUtilization found it, and
// what it says of the processes' samples of the same window.
type utilReading struct {
	// util is the utilization, 0..1; ok is false when nothing gave one.
	util float64
	ok   bool
	// windowed: util is the time-weighted mean of the driver's
	// GPU_UTILIZATION samples since the previous reading
	// (nvmlDeviceGetSamples), the window of the processes' SM shares.
	// Otherwise it is NVML's last sample period
	// (nvmlDeviceGetUtilizationRates).
	windowed bool
	// idleThrough, when not 0, is the newest sample's timestamp of a
	// window whose samples all read 0: no kernel ran on the GPU.
	idleThrough uint64
	// noNewSample: the driver, which gave samples before, has none newer
	// than the previous reading (two readings within one sample period),
	// so no process sample is newer either. A GPU that has never given
	// one says nothing of its process samples by it.
	noNewSample bool
}

// readUtilization reads the GPU's utilization: over the window since the
// previous reading from the driver's samples; from NVML's last sample
// period on a GPU without samples, or when no sample is newer than the
// previous reading. Its error is a GPU that is gone.
func (b *Backend) readUtilization(h nvml.Device, uuid string) (r utilReading, err error) {
	w := b.window(uuid)
	if !w.noUtilSamples {
		vt, samples, ret := h.GetSamples(nvml.GPU_UTILIZATION_SAMPLES, w.utilSeen)
		switch {
		case ret == nvml.SUCCESS:
			b.answered(uuid, callUtilSamples)
			if mean, newest, found := meanGPUSamples(vt, samples, w.utilSeen); found {
				b.updateWindow(uuid, func(w *sampleWindow) { w.utilSeen = max(w.utilSeen, newest) })
				r = utilReading{util: mean, ok: true, windowed: true}
				if mean == 0 {
					r.idleThrough = newest
				}
				return r, nil
			}
			r.noNewSample = w.utilSeen > 0
		case ret == nvml.ERROR_NOT_FOUND:
			// No sample since the previous reading: the GPU keeps one
			// per sample period, so this reading came within one.
			b.answered(uuid, callUtilSamples)
			r.noNewSample = w.utilSeen > 0
		case gpuGone(ret):
			return utilReading{}, &callError{callUtilSamples, ret}
		case ret == nvml.ERROR_NOT_SUPPORTED:
			b.updateWindow(uuid, func(w *sampleWindow) { w.noUtilSamples = true })
			b.log.Info("nvml: GPU keeps no utilization samples; its utilization is NVML's last sample period, not the window of its processes", "uuid", uuid)
		default:
			b.fellBack(uuid, callUtilSamples, ret)
		}
	}
	rates, ret := h.GetUtilizationRates()
	if ok, err := b.optional(uuid, callUtilization, ret); !ok {
		return utilReading{noNewSample: r.noNewSample}, err
	}
	r.util, r.ok = min(float64(rates.Gpu)/100, 1), true
	return r, nil
}

// fellBack logs, once until it answers again, a reading that failed and
// was replaced by another.
func (b *Backend) fellBack(uuid, call string, ret nvml.Return) {
	b.warnOnce(uuid, call, ret, "nvml: GPU reading failed; using NVML's last sample period instead until it answers")
}

// warnOnce logs msg for a failing reading of a GPU once, until the reading
// answers again (whoever clears b.failing[reading{uuid, call}]).
func (b *Backend) warnOnce(uuid, call string, ret nvml.Return, msg string) {
	k := reading{uuid, call}
	b.mu.Lock()
	logged := b.failing[k]
	b.failing[k] = true
	b.mu.Unlock()
	if !logged {
		b.log.Warn(msg, "uuid", uuid, "reading", call, "error", ret.Error())
	}
}

// meanGPUSamples is the time-weighted mean of the GPU_UTILIZATION samples
// newer than since, as a ratio, and the newest timestamp. found is false
// when no sample is newer than since or their values cannot be read.
// go-nvml does not shorten the slice to the count NVML wrote, so unwritten
// entries (timestamp 0) are there too; they are never newer than since.
func meanGPUSamples(vt nvml.ValueType, samples []nvml.Sample, since uint64) (mean float64, newest uint64, found bool) {
	if _, ok := sampleValue(vt, [8]byte{}); !ok {
		return 0, 0, false
	}
	slices.SortFunc(samples, func(a, b nvml.Sample) int { return cmp.Compare(a.TimeStamp, b.TimeStamp) })
	// Percents until the end: a single sample then reads exactly as
	// GetUtilizationRates would give it (42 → 0.42, not 0.42000000000000004).
	mean, newest, found = timeWeighted(samples, since,
		func(s nvml.Sample) uint64 { return s.TimeStamp },
		func(s nvml.Sample) float64 { v, _ := sampleValue(vt, s.SampleValue); return v })
	return min(max(mean/100, 0), 1), newest, found
}

// sampleValue reads an nvmlValue_t union of type vt (host byte order, as
// the C library wrote it). ok is false for a type it does not know.
func sampleValue(vt nvml.ValueType, v [8]byte) (float64, bool) {
	e := binary.NativeEndian
	switch vt {
	case nvml.VALUE_TYPE_DOUBLE:
		return math.Float64frombits(e.Uint64(v[:])), true
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		return float64(e.Uint32(v[:4])), true
	case nvml.VALUE_TYPE_SIGNED_INT:
		return float64(int32(e.Uint32(v[:4]))), true
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		return float64(e.Uint64(v[:])), true
	case nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return float64(int64(e.Uint64(v[:]))), true
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return float64(e.Uint16(v[:2])), true
	}
	return 0, false
}

// timeWeighted is the mean of the values of samples (sorted by timestamp)
// newer than since, each weighted by the time it stands for: from the
// sample before it, or from since for the first, to its own timestamp.
// Without since (the first reading) the first sample stands for as long as
// the gap after it, or, alone, for itself. newest is the newest timestamp;
// found is false when no sample is newer than since.
func timeWeighted[S any](samples []S, since uint64, stamp func(S) uint64, value func(S) float64) (mean float64, newest uint64, found bool) {
	i, _ := slices.BinarySearchFunc(samples, since, func(s S, t uint64) int {
		if stamp(s) <= t {
			return -1
		}
		return 1
	})
	samples = samples[i:]
	if len(samples) == 0 {
		return 0, since, false
	}
	prev := since
	if prev == 0 {
		first := stamp(samples[0])
		prev = first
		if len(samples) > 1 {
			prev -= min(stamp(samples[1])-first, first)
		}
	}
	var sum, weights, plain float64
	for _, s := range samples {
		t, v := stamp(s), value(s)
		w := float64(t - prev)
		sum += w * v
		weights += w
		plain += v
		prev = t
	}
	newest = stamp(samples[len(samples)-1])
	if weights == 0 {
		// All at one timestamp: no time to weigh by.
		return plain / float64(len(samples)), newest, true
	}
	return sum / weights, newest, true
}

// applyShares sets each process's SM share from NVML's process samples
// newer than since and returns the newest sample timestamp (since if
// none). procs are sorted by PID; samples are sorted here.
//
// What NVML gives (NVML API Reference, nvmlDeviceGetProcessUtilization
// and nvmlProcessUtilizationSample_t): samples newer than
// lastSeenTimeStamp, each with a PID, a CPU timestamp in microseconds and
// smUtil, the share of the GPU's SMs that process kept busy, in percent;
// none for a process that ran no kernel, and ERROR_NOT_FOUND when there is
// no sample at all. On an H200 with driver 580, read every 2 s with the
// last timestamp seen, it gave one sample per process per read, smUtil
// already that process's own share: 53 and 32 for two busy time-sliced
// pods while the GPU's own samples of the same 2 s averaged 84–88; 37–43
// for one busy pod alone, GPU 37–42. Each process's share is therefore the
// time-weighted mean of its own samples, never divided by a count of
// sample periods or of other processes' timestamps: the code before
// took the shortest gap between any two timestamps as the sample period,
// and two processes stamped a moment apart made the window that many
// "periods" long (about 31 on the H200, where two busy pods read 0.0135
// and 0.0145, 0.42/31, against pmon's 36-50 %). A listed process without a
// sample ran no kernel and reads 0.
func applyShares(procs []gpu.Process, samples []nvml.ProcessUtilizationSample, since uint64) (newest uint64) {
	slices.SortFunc(samples, func(a, b nvml.ProcessUtilizationSample) int {
		return cmp.Or(cmp.Compare(a.Pid, b.Pid), cmp.Compare(a.TimeStamp, b.TimeStamp))
	})
	for j := range procs {
		procs[j].SMUtilization, procs[j].HasSMUtilization = 0, true
	}
	newest = since
	j := 0
	for i := 0; i < len(samples); {
		pid := samples[i].Pid
		k := i + 1
		for k < len(samples) && samples[k].Pid == pid {
			k++
		}
		share, last, found := timeWeighted(samples[i:k], since,
			func(s nvml.ProcessUtilizationSample) uint64 { return s.TimeStamp },
			func(s nvml.ProcessUtilizationSample) float64 { return float64(s.SmUtil) })
		i = k
		if !found {
			continue
		}
		// Samples of processes that exited since still move the window.
		newest = max(newest, last)
		for j < len(procs) && procs[j].PID < int(pid) {
			j++
		}
		if j < len(procs) && procs[j].PID == int(pid) {
			procs[j].SMUtilization = min(share/100, 1)
		}
	}
	return newest
}

// fitShares scales the processes' SM shares down so that they add up to no
// more than util, the GPU's utilization over the same window. The two come
// from different counters of the driver and may disagree by a point or
// two (53 + 32 against 84 on the H200); a GPU cannot be busier for its
// processes than for itself, and the energy split and every dashboard
// that subtracts the containers from the GPU rely on the whole covering
// its parts.
func fitShares(procs []gpu.Process, util float64) {
	sum := 0.0
	for _, p := range procs {
		if p.HasSMUtilization {
			sum += p.SMUtilization
		}
	}
	if sum <= util || sum == 0 {
		return
	}
	scale := util / sum
	for j := range procs {
		procs[j].SMUtilization *= scale
	}
}

package policy

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
)

// oomIncidents is what the window's OOM events call for.
type oomIncidents struct {
	// incidents counts the OOMs that sharing caused, a container's repeats
	// (a crash loop) once.
	incidents int
	// target is the count they call for, alloc the allocation at the OOM
	// that set it and fits why.
	target, alloc int
	fits          string
}

// ooms classifies the window's OOM events (see the package doc).
func (v gpuView) ooms() oomIncidents {
	out := oomIncidents{target: v.cur}
	seen := map[string]bool{}
	for i, s := range v.window {
		if s.OOMEvents <= 0 && len(s.OOMs) == 0 {
			continue
		}
		a := s.ReplicasAllocated
		if a <= 0 {
			a = v.cur
		}
		if a < 2 {
			continue // a lone pod: it would run out at any count
		}
		full := v.fullAt(i)
		sharing := 0
		// Whether every OOM of the sample was among pods that all stay
		// (inseparable): a count below a parts none of them.
		staying := true
		for k := range max(s.OOMEvents, len(s.OOMs)) {
			var o OOM
			if k < len(s.OOMs) {
				o = s.OOMs[k]
			}
			if o.Kind == OOMCap || o.Kind == OOMEncoderSession || (o.Kind == OOMUnknown && !full) {
				continue
			}
			if v.hopeless[o.Container] {
				continue // a loop no count ends (hopelessLoops)
			}
			sharing++
			staying = staying && o.Container != "" && v.inseparable(o.Container, s.Time, a, s.ContainerPeaks)
			if o.Container == "" || !seen[o.Container] {
				out.incidents++
			}
			if o.Container != "" {
				seen[o.Container] = true
			}
		}
		if sharing == 0 {
			continue
		}
		if staying {
			// The incident still holds a raise back (RecentOOM), and
			// the objective weighs the pods that come against the
			// ledger, which holds what the OOM asked for while it is
			// in the window. Lowered to a-1 (and banned there for PeakHold),
			// an on-demand 40 GiB model's first load among three
			// services kept every 6 GiB eval job out for six hours
			// where static:6 ran them with no more OOMs
			// (test/traces/unseen/ollama-48g-70b.yaml;
			// TestOOMAmongPodsThatStay).
			continue
		}
		k, fits := v.fitting(s.MemoryTotalBytes)
		if t := min(a-1, k); t < out.target {
			out.target, out.alloc, out.fits = t, a, fits
		}
	}
	out.target = max(out.target, v.cfg.MinReplicas)
	return out
}

// fullAt says whether the GPU was full at the OOM of window[i]: the memory in
// use then, or at the sample before (the failed process may already be
// gone), left less free than the footprint (or than the pressure margin,
// when no footprint is known).
func (v gpuView) fullAt(i int) bool {
	s := v.window[i]
	if s.MemoryTotalBytes == 0 {
		return true // nothing proves room: trust the OOM
	}
	used := s.MemoryUsedBytes
	if i > 0 && v.window[i-1].MemoryTotalBytes == s.MemoryTotalBytes {
		used = max(used, v.window[i-1].MemoryUsedBytes)
	}
	margin := max(v.footprint, uint64((1-v.cfg.PressureThreshold)*float64(s.MemoryTotalBytes)))
	return used+margin > s.MemoryTotalBytes
}

// fitting is the count the measured footprints fit on a GPU of total bytes:
// the largest k whose k hungriest container peaks of the window sum to at
// most TargetUtilization × total (math.MaxInt when no peak is known, so that
// the OOM's own evidence decides).
func (v gpuView) fitting(total uint64) (int, string) {
	peaks := map[string]uint64{}
	for _, s := range v.window {
		for c, p := range s.ContainerPeaks {
			peaks[c] = max(peaks[c], p)
		}
	}
	if len(peaks) == 0 || total == 0 {
		return math.MaxInt, ""
	}
	sorted := slices.SortedFunc(maps.Values(peaks), func(a, b uint64) int { return cmp.Compare(b, a) })
	budget := v.cfg.TargetUtilization * float64(total)
	var sum float64
	k := 0
	for _, p := range sorted {
		if sum+float64(p) > budget {
			break
		}
		sum += float64(p)
		k++
	}
	if k == len(sorted) {
		return math.MaxInt, ""
	}
	return max(k, 1), fmt.Sprintf(" and only the %d hungriest measured pods fit %.0f%% of %s", max(k, 1), 100*v.cfg.TargetUtilization, gib(total))
}

// pressure says whether every sample of the last PressureWindow was at or
// above the threshold, and the count that calls for.
func (v gpuView) pressure() (bool, int, string) {
	span := v.cfg.PressureWindow
	from := v.now.Add(-span)
	ss := within(v.window, from, v.now)
	if !covers(ss, from, v.now, v.cfg.SampleInterval) {
		return false, 0, ""
	}
	lowest := math.Inf(1)
	for _, s := range ss {
		if s.MemoryTotalBytes == 0 {
			return false, 0, ""
		}
		r := float64(s.MemoryUsedBytes) / float64(s.MemoryTotalBytes)
		if r < v.cfg.PressureThreshold {
			return false, 0, ""
		}
		lowest = min(lowest, r)
	}
	alloc := ss[len(ss)-1].ReplicasAllocated
	target := v.cur
	if alloc > 0 {
		target = min(target, alloc-1)
	} else {
		target = v.cur - 1
	}
	target = max(target, v.cfg.MinReplicas)
	return true, target, fmt.Sprintf("memory at or above %.0f%% for %s (lowest %.1f%%) with %d allocated",
		100*v.cfg.PressureThreshold, span, 100*lowest, alloc)
}

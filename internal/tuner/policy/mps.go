package policy

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/gpuslice/gpuslice/internal/mps"
)

// GPUs shared through CUDA MPS (Observation.MPS, sharing.mps).
//
// Under MPS the replica count means something else than under
// time-slicing. Each client container gets a hard memory limit when it
// starts, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT = the GPU's memory / the
// replicas at that moment (mps.MemoryLimit), and keeps it for its whole
// life, restarts included (its environment is fixed at allocation). So:
//
//   - A client past its limit gets an out-of-memory of its own (kind
//     process-cap); its neighbours are not hurt. There is no crowding: the
//     rules that lower on a sharing OOM, on pressure or on fullness do not
//     apply.
//   - The count decides each NEW client's limit. A waiting pod whose need
//     passes total/N at count N would run out at its cap as soon as it
//     starts, and, its limit being fixed, again at every restart: that is
//     the risk a count carries, priced like any OOM (Config.OOMCost).
//   - Raising N lowers the limit only for clients that start after it;
//     lowering N raises it only for them. Running clients keep theirs.
//   - Memory is committed by the running clients' limits (the sum of the
//     limits they started with), not by their usage: while the limits of
//     the clients holding replicas add up to no more than the GPU, no
//     client can find the GPU full. After a raise the older clients keep
//     their larger limits while new ones take the new replicas, and the
//     limits can add up to more than the GPU (N=2 → 4 with two clients
//     running: ½ + ½ + ¼ + ¼); only then is their usage forecast (as under
//     time-slicing, each client's reservation capped at its limit) a
//     chance that one finds the GPU full. A lowering never over-commits:
//     nobody starts until fewer than the new count hold replicas.
//   - A pod that ran out at its limit L shows its workload needs more than
//     L (WorkloadMemory.CapBytes): its next pods are priced at
//     max(1.2 L, L + 100 MiB), the bump the Vertical Pod Autoscaler's
//     recommender gives a container after an OOM, and the objective may go
//     below the base for them (ReasonProcessCapOOM): the count the operator
//     chose gives them a limit they were seen not to fit in.
//
// The bounds and holds are those of time-slicing that still mean
// something: maxReplicas, the minimum (at least 2, as NVIDIA requires under
// MPS), a change still on its way, a window not yet covered, a change not
// yet settled, no raise after a client found the GPU full.

// ReasonProcessCapOOM is a lowering on a GPU shared through MPS: pods of a
// workload that ran out at its own limit wait, and a lower count gives them
// a larger one.
const ReasonProcessCapOOM = "ProcessCapOOM"

// mpsFloor is the least MPS count NVIDIA's plugin accepts.
const mpsFloor = 2

// The bump after a client ran out at its limit: the Vertical Pod
// Autoscaler recommender's OOMBumpUpRatio and OOMMinBumpUp.
const (
	capBumpRatio = 1.2
	capBumpMin   = 100 << 20
)

// capNeed is what a pod of a workload that ran out at limit is priced at.
func capNeed(limit uint64) float64 {
	return max(capBumpRatio*float64(limit), float64(limit)+capBumpMin)
}

// rememberCaps folds the process-cap OOMs of the samples newer than since
// into the workloads' CapBytes: the limit the container started with (the
// latest the window shows for it) is less than its workload needs. An OOM
// whose container's limit is unknown says nothing about its size.
func rememberCaps(since time.Time, out *Memory, obs Observation) {
	if !obs.MPS {
		return
	}
	for _, g := range obs.GPUs {
		for _, s := range g.Samples {
			if !s.Time.After(since) || s.Time.After(obs.Now) {
				continue
			}
			for _, o := range s.OOMs {
				if o.Kind != OOMCap || o.Container == "" {
					continue
				}
				limit := limitIn(g.Samples, o.Container)
				if limit == 0 {
					continue
				}
				wl := obs.workload(o.Container)
				w := out.Workloads[wl] // scalars only: PeakByAge stays shared, unchanged
				if limit >= w.CapBytes {
					w.CapBytes = limit
				}
				w.CapAt, w.LastSeen = later(w.CapAt, s.Time), later(w.LastSeen, s.Time)
				out.Workloads[wl] = w
				// The count set the limit it ran out at: like a sharing OOM
				// under time-slicing, it may undo a change not yet settled.
				out.LastOOM = later(out.LastOOM, s.Time)
			}
		}
	}
}

// limitIn is the latest limit the samples show for container c, 0 when
// none does.
func limitIn(ss []Sample, c string) uint64 {
	for i := len(ss) - 1; i >= 0; i-- {
		if l := ss[i].ContainerLimits[c]; l > 0 {
			return l
		}
	}
	return 0
}

// decideMPSGPU is decideGPU for a GPU shared through MPS: the same view of
// the GPU's history, judged by decideMPS.
func decideMPSGPU(cfg Config, obs Observation, g GPUObservation, nodeFootprint uint64) Decision {
	v := newGPUView(cfg, &obs, g, nodeFootprint, mpsFloor, false)
	loops := v.mpsLoops()
	d := v.decideMPS(obs.LastChange, loops)
	d.CrashLoops = loops
	d.FootprintBytes = v.footprint
	d.GPU = g.UUID
	d.Message = g.UUID + ": " + d.Message
	return d
}

// mpsDemand is a waiting pod priced for MPS: capped says its workload ran
// out at its limit lately, and its price is at least capNeed of it.
type mpsDemand struct {
	demand
	capped bool
}

// mpsQueue prices the waiting pods as queue does, and at least at capNeed
// for a workload that ran out at its limit within Remember.
func (v gpuView) mpsQueue(led ledger) []mpsDemand {
	q := v.queue(led)
	out := make([]mpsDemand, len(q))
	for i, d := range q {
		out[i].demand = d
		w := v.obs.Memory.Workloads[v.obs.Pending[i].Workload]
		if w.CapBytes == 0 || v.now.Sub(w.CapAt) > v.cfg.Remember {
			continue
		}
		need := capNeed(w.CapBytes)
		if d.none || d.mean < need {
			// What its pods showed under a cap says nothing of their
			// spread beyond it: the bump is the estimate.
			out[i].item = item{mean: need, sd: settledSpread * need}
			out[i].none = false
		}
		out[i].capped = true
	}
	return out
}

// mpsArrival is the price of a pod not here yet (arrival), and at least
// capNeed for a workload that ran out at its limit within Remember: its
// next pods are likely to come (a fine-tune an hour after the last, or the
// next evening), and a spare replica is taken at once by whoever comes, at
// the spare's limit, before the tuner sees them wait. Within PeakHold only,
// the evening fine-tunes of the shipped MPS trace ran out again on the
// second day (75 OOM events against 50, for 17,000 pod-seconds less
// waiting: at the 6 h OOM price, the worse trade).
func (v gpuView) mpsArrival(led ledger) item {
	a, _ := v.arrival(led)
	for _, w := range v.obs.Memory.Workloads {
		if w.CapBytes > 0 && v.now.Sub(w.CapAt) <= v.cfg.Remember {
			if need := capNeed(w.CapBytes); need > a.mean {
				a = item{mean: need, sd: max(a.sd, settledSpread*need)}
			}
		}
	}
	return a
}

// mpsLoops are the containers that ran out at their own limit twice or
// more in the window: under MPS their limit is fixed, so they loop until
// they end, and only their eviction (a new pod, a new limit) ends it. It
// ends it only once the count in effect gives a new pod more than the
// container's own limit: evicted before that (the lowering for it not yet
// applied), the new pod starts with the same limit and loops again (the
// replay evicted one pod 156 times so). Until then, and where its limit
// is unknown, the loop is reported and not evicted.
func (v gpuView) mpsLoops() []CrashLoop {
	n := map[string]int{}
	for _, s := range v.window {
		for _, o := range s.OOMs {
			if o.Kind == OOMCap && o.Container != "" {
				n[o.Container]++
			}
		}
	}
	var out []CrashLoop
	if len(v.window) == 0 {
		return nil
	}
	latest := v.window[len(v.window)-1]
	for _, c := range slices.Sorted(maps.Keys(n)) {
		_, runs := latest.ContainerPeaks[c]
		_, holds := latest.ContainerLimits[c]
		if n[c] >= 2 && (runs || holds) {
			own := limitIn(v.window, c)
			relief := own > 0 && v.cur > 0 && latest.MemoryTotalBytes/uint64(v.cur) > own
			out = append(out, CrashLoop{Container: c, GPU: v.uuid, OOMs: n[c], Evict: v.cfg.EvictCrashLoops && relief})
		}
	}
	return out
}

// loopRisk is, with eviction on, the chance that the containers looping
// at their own limit run out again once evicted and started at count n's
// limit, each priced at capNeed of its own limit. A loop is evicted only
// once the count in effect gives more than its limit (mpsLoops), so the
// count must come down for it first: this is what weighs that lowering.
// Without eviction a looping container keeps its limit whatever the count,
// and nothing is added.
func (v gpuView) loopRisk(loops []CrashLoop, n int, total uint64) float64 {
	if !v.cfg.EvictCrashLoops || n <= 0 {
		return 0
	}
	L := float64(mps.MemoryLimit(total, n))
	r := 0.0
	for _, l := range loops {
		own := limitIn(v.window, l.Container)
		if own == 0 {
			continue
		}
		need := capNeed(own)
		r += overflow(L, need, settledSpread*need*settledSpread*need)
	}
	return r
}

// client is a running MPS client in a forecast: what it is expected to use
// (its reservation, capped at its limit) and its limit.
type client struct {
	use   item
	limit float64
}

// capped is it under a limit: a client cannot hold more than its limit.
func capped(it item, limit float64) item {
	if it.mean >= limit {
		return item{mean: limit}
	}
	return item{mean: it.mean, sd: min(it.sd, limit-it.mean)}
}

// clients are the running pods of the ledger (led.running's order) with
// their limits: the latest the window shows for each, else the limit of the
// count in effect (a container whose limit the exporter could not read).
func (v gpuView) clients(led ledger) []client {
	keys := slices.Sorted(maps.Keys(led.s.ContainerPeaks))
	def := float64(mps.MemoryLimit(led.s.MemoryTotalBytes, v.cur))
	out := make([]client, len(keys))
	for i, c := range keys {
		l := float64(limitIn(v.window, c))
		if l == 0 {
			l = def
		}
		out[i] = client{use: capped(led.running[i], l), limit: l}
	}
	return out
}

// committed is the memory the limits of the clients holding replicas
// commit: each known limit of the latest sample, and the count in effect's
// limit for each replica holder whose limit is unknown (an idle client, a
// source without limits).
func (v gpuView) committed(led ledger, held int) float64 {
	var sum float64
	known := 0
	for _, l := range led.s.ContainerLimits {
		sum += float64(l)
		known++
	}
	cs := v.clients(led)
	for i, c := range slices.Sorted(maps.Keys(led.s.ContainerPeaks)) {
		if _, ok := led.s.ContainerLimits[c]; !ok {
			sum += cs[i].limit
			known++
		}
	}
	if held > known {
		sum += float64(held-known) * float64(mps.MemoryLimit(led.s.MemoryTotalBytes, v.cur))
	}
	return sum
}

// leaving are the indexes (in led.running's order) of the running pods
// expected to leave while a count holds, in the order they are expected to
// leave: transient's rule.
func (v gpuView) leaving(led ledger) []int {
	type out struct {
		i    int
		in   time.Duration
		mean float64
	}
	var ls []out
	for i, c := range slices.Sorted(maps.Keys(led.s.ContainerPeaks)) {
		w := v.obs.Memory.Workloads[v.obs.workload(c)]
		age := v.age(c)
		cm, seen := v.obs.Memory.Containers[c]
		switch {
		case !seen || cm.Resident:
		case w.Known(v.cfg) && w.Lifetime < transientAge:
			ls = append(ls, out{i, max(w.Lifetime-age, 0), led.running[i].mean})
		case !w.Known(v.cfg) && age < transientAge:
			ls = append(ls, out{i, 0, led.running[i].mean})
		}
	}
	slices.SortStableFunc(ls, func(a, b out) int { return cmp.Or(cmp.Compare(a.in, b.in), cmp.Compare(a.mean, b.mean)) })
	idx := make([]int, len(ls))
	for k, l := range ls {
		idx[k] = l.i
	}
	return idx
}

// weighMPS predicts count n on a GPU shared through MPS. Each pod that
// starts while n holds gets the limit L = total/n. Its risk is the sum of
//
//   - for every waiting pod n lets in now, in queue order, the chance that
//     it needs more than L (it runs out at its own cap);
//   - when nobody waits, the same for a pod not here yet in each spare;
//   - for the pods next in line that get the replicas of the running jobs
//     expected to leave (after the departures a count below the allocation
//     needs before anyone starts), the same at L;
//   - and, only while the limits of the clients holding replicas add up to
//     more than the GPU (possible after a raise: the older clients keep
//     their larger limits), the chance that their usage, each capped at its
//     limit, passes the GPU's total at each start, the worst of the
//     hand-ons.
func (v gpuView) weighMPS(led ledger, q []mpsDemand, n int) candidate {
	c := candidate{n: n}
	total := float64(led.s.MemoryTotalBytes)
	L := float64(mps.MemoryLimit(led.s.MemoryTotalBytes, n))
	a := v.allocated(led)
	cs := v.clients(led)
	mean, vr := led.other, 0.0
	for _, cl := range cs {
		mean += cl.use.mean
		vr += cl.use.sd * cl.use.sd
	}
	committed := v.committed(led, a)
	full := func() float64 {
		if committed <= total {
			return 0 // the limits fit: no client can find the GPU full
		}
		return overflow(total, mean, max(vr, 0))
	}
	start := func(it item) float64 {
		u := capped(it, L)
		mean += u.mean
		vr += u.sd * u.sd
		committed += L
		return overflow(L, it.mean, it.sd*it.sd)
	}
	c.risk = full()
	free := n - a
	k := 0
	for free > 0 && k < len(q) && !q[k].none && q[k].replicas <= free {
		c.risk += start(q[k].item)
		c.risk += full()
		free -= q[k].replicas
		c.saved += q[k].patience
		k++
	}
	c.admitted = k
	arrival := v.mpsArrival(led)
	if len(q) == 0 && free > 0 && arrival.mean > 0 {
		c.spares = free
		for range free {
			c.risk += start(arrival)
			c.risk += full()
		}
	}
	var next []item
	for _, d := range q[k:] {
		if d.none {
			d.item = item{mean: v.sizes.quantile(0.9), sd: arrival.sd}
		}
		next = append(next, d.item)
	}
	leaving := v.leaving(led)
	deficit := max(-free, 0) // departures before a replica is free again
	for len(next) < min(max(len(leaving)-deficit, 0), maxHandoffs) && arrival.mean > 0 {
		next = append(next, arrival)
	}
	worst, j := 0.0, 0
	for _, i := range leaving {
		if j >= min(len(next), maxHandoffs) {
			break
		}
		mean -= cs[i].use.mean
		vr -= cs[i].use.sd * cs[i].use.sd
		committed -= cs[i].limit
		if deficit > 0 {
			deficit--
			continue
		}
		c.risk += start(next[j])
		j++
		worst = max(worst, full())
	}
	c.risk += worst
	return c
}

// decideMPS is decide for a GPU shared through MPS (see the comment at the
// top of this file).
func (v gpuView) decideMPS(lastChange time.Time, loops []CrashLoop) Decision {
	cfg, cur := v.cfg, v.cur
	least := max(cfg.MinReplicas, mpsFloor)
	sinceChange := time.Duration(math.MaxInt64)
	if !lastChange.IsZero() {
		sinceChange = v.now.Sub(lastChange)
	}
	settle := v.obs.Apply.Settle(cfg)
	oomSince := !lastChange.IsZero() && v.obs.Memory.LastOOM.After(lastChange)
	settling := sinceChange < settle && !oomSince
	hold := func(reason, format string, args ...any) Decision {
		return Decision{Replicas: cur, Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	if cur > cfg.MaxReplicas {
		to := max(cfg.MaxReplicas, mpsFloor)
		return Decision{Replicas: to, Reason: ReasonAboveMaximum,
			Message: fmt.Sprintf("%d MPS replicas is above maxReplicas %d, lowering %d -> %d", cur, cfg.MaxReplicas, cur, to)}
	}
	if cur < least {
		return Decision{Replicas: least, Reason: ReasonBelowMinimum,
			Message: fmt.Sprintf("%d replicas is below the minimum %d under MPS, raising %d -> %d", cur, least, cur, least)}
	}
	if sinceChange < cfg.SampleInterval {
		return hold(ReasonCooldown, "last change %s ago, less than a sample, keeping %d MPS replicas", sinceChange, cur)
	}
	if len(v.window) > 0 {
		if adv := v.window[len(v.window)-1].ReplicasAdvertised; adv != 0 && adv != cur {
			return hold(ReasonAwaitingApply, "%d replicas advertised, %d decided: the last change has not taken effect", adv, cur)
		}
	}
	if !v.ok {
		return hold(ReasonNoWorkload, "the GPU's total memory is unknown, nothing to size a limit, keeping %d MPS replicas", cur)
	}
	led := v.latest
	if !covers(v.window, v.now.Add(-cfg.Window), v.now, cfg.SampleInterval) {
		return hold(ReasonInsufficientHistory, "samples cover less than the %s window (%d samples, one every %s expected), keeping %d MPS replicas",
			cfg.Window, len(v.window), cfg.SampleInterval, cur)
	}

	q := v.mpsQueue(led)
	b := bounds{lo: min(max(v.base, least), cur), hi: max(min(cfg.MaxReplicas, cur+cfg.MaxStepUp), cur)}
	if slices.ContainsFunc(q, func(d mpsDemand) bool { return d.capped }) || (cfg.EvictCrashLoops && len(loops) > 0) {
		// Evidence, not a guess: the base's limit is too small for them.
		b.lo = min(least, cur)
	}
	if n := v.fullOOMs(); n > 0 {
		b.hi, b.hiReason = cur, ReasonRecentOOM
		b.hiMessage = fmt.Sprintf("%d client(s) found the GPU full in the last %s: the running clients' limits over-commit it", n, cfg.Window)
	}
	b.holdWhilePodEnds(led.s, cur, v.countsAllocation)
	if settling {
		switch v.obs.LastDirection {
		case DirectionUp:
			b.lo, b.loReason = cur, ReasonSettling
			b.loMessage = fmt.Sprintf("the raise %s ago has not settled (%s)", sinceChange.Round(time.Second), settle)
		case DirectionDown:
			b.hi, b.hiReason = cur, ReasonSettling
			b.hiMessage = fmt.Sprintf("the lowering %s ago has not settled (%s)", sinceChange.Round(time.Second), settle)
		}
	}

	var best, at candidate
	for n := b.lo; n <= b.hi; n++ {
		c := v.weighMPS(led, q, n)
		c.risk += v.loopRisk(loops, n, led.s.MemoryTotalBytes)
		v.price(&c)
		if n == cur {
			at = c
		}
		if n == b.lo || c.cost < best.cost || (c.cost == best.cost && abs(n-cur) < abs(best.n-cur)) {
			best = c
		}
	}
	total := led.s.MemoryTotalBytes
	state := fmt.Sprintf("%s of %s used with %d allocated, %s committed by the running clients' limits", gib(led.s.MemoryUsedBytes), gib(total),
		led.s.ReplicasAllocated, gibf(v.committed(led, led.s.ReplicasAllocated)))
	why := func(c candidate) string {
		s := fmt.Sprintf("%d replicas: a new client's limit %s, OOM risk %s", c.n, gib(mps.MemoryLimit(total, c.n)), percent(c.risk))
		if c.admitted > 0 {
			ds := make([]demand, min(c.admitted, 6))
			for i := range ds {
				ds[i] = q[i].demand
			}
			s += fmt.Sprintf(", lets in %d of %d waiting (%s)", c.admitted, len(q), prices(ds))
		}
		if c.spares > 0 {
			s += fmt.Sprintf(", %d spare", c.spares)
		}
		return s
	}
	const keep = "; running clients keep the limit they started with"
	switch {
	case best.n > cur:
		return Decision{Replicas: best.n, Reason: ReasonSustainedHeadroom,
			Message: fmt.Sprintf("%s; %s, raising %d -> %d%s", state, why(best), cur, best.n, keep)}
	case best.n < cur:
		reason := ReasonUnbackedReplicas
		if best.n < v.base {
			reason = ReasonProcessCapOOM
		}
		return Decision{Replicas: best.n, Reason: reason,
			Message: fmt.Sprintf("%s; %s (at %d: %s), lowering %d -> %d%s", state, why(best), cur, percent(at.risk), cur, best.n, keep)}
	}
	pending := len(v.obs.Pending)
	switch {
	case b.hiReason != "" && pending > at.admitted:
		return hold(b.hiReason, "%s; keeping %d MPS replicas", b.hiMessage, cur)
	case b.loReason != "":
		return hold(b.loReason, "%s; keeping %d MPS replicas", b.loMessage, cur)
	case cur >= cfg.MaxReplicas && pending > at.admitted:
		return hold(ReasonAtMaximum, "%d MPS replicas is maxReplicas; keeping %d", cur, cur)
	case pending > 0 && at.admitted < len(q):
		next := v.weighMPS(led, q, min(cur+1, max(cfg.MaxReplicas, cur)))
		return hold(ReasonInsufficientHeadroom, "%d pod(s) wait; %s; %s, keeping %d MPS replicas", pending, state, why(next), cur)
	case cur > led.s.ReplicasAllocated:
		return hold(ReasonFreeReplicas, "%d of %d replicas are free, no pod needs another; %s, keeping %d MPS replicas",
			cur-led.s.ReplicasAllocated, cur, why(at), cur)
	}
	return hold(ReasonInsufficientHeadroom, "every replica is taken; %s; %s, keeping %d MPS replicas", state, why(at), cur)
}

// fullOOMs counts the window's OOMs in which a client found the GPU full
// rather than its own limit (a kind other than process-cap or an encoder
// session): under MPS only over-committed limits make that possible.
func (v gpuView) fullOOMs() int {
	n := 0
	for i, s := range v.window {
		for k := range max(s.OOMEvents, len(s.OOMs)) {
			if k < len(s.OOMs) && (s.OOMs[k].Kind == OOMCap || s.OOMs[k].Kind == OOMEncoderSession) {
				continue
			}
			if (k >= len(s.OOMs) || s.OOMs[k].Kind == OOMUnknown) && !v.fullAt(i) {
				continue
			}
			n++
		}
	}
	return n
}

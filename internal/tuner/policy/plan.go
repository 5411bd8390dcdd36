package policy

import (
	"fmt"
	"math"
	"time"
)

// gpuView is the part of a GPU's history that Decide looks at.
type gpuView struct {
	cfg    Config
	now    time.Time
	cur    int
	obs    *Observation
	window []Sample // within [now−Window, now]
	// footprint is the node's largest peak in the window of a container
	// still running: the price of a pod whose workload is not known.
	footprint uint64
	// peaks is each container's largest memory on this GPU in the window.
	peaks map[string]uint64
	// base is the least count a guess may withdraw to (Memory.Base).
	base int
	// unattributed[i] is the most memory no container accounted for in
	// window[:i+1].
	unattributed []uint64
	// latest is the ledger of the latest sample over a Window; ok is
	// false when there is none (no sample, or its total unknown).
	latest ledger
	ok     bool
}

func decideGPU(cfg Config, obs Observation, g GPUObservation, nodeFootprint uint64) Decision {
	v := gpuView{cfg: cfg, now: obs.Now, cur: obs.CurrentReplicas, obs: &obs, footprint: nodeFootprint}
	v.window = within(g.Samples, obs.Now.Add(-cfg.Window), obs.Now)
	v.peaks = map[string]uint64{}
	v.unattributed = make([]uint64, len(v.window))
	var u uint64
	for i, s := range v.window {
		var sum uint64
		for c, p := range s.ContainerPeaks {
			v.peaks[c] = max(v.peaks[c], p)
			sum += p
		}
		if s.MemoryUsedBytes > sum {
			u = max(u, s.MemoryUsedBytes-sum)
		}
		v.unattributed[i] = u
	}
	v.base = max(obs.Memory.Base, cfg.MinReplicas, 1)
	if len(v.window) > 0 {
		v.latest, v.ok = v.ledgerAt(len(v.window)-1, cfg.Window)
	}
	d := v.decide(obs.LastChange)
	d.FootprintBytes = v.footprint
	d.GPU = g.UUID
	d.Message = g.UUID + ": " + d.Message
	return d
}

// ledger is the GPU's memory at one sample, reserved pod by pod.
type ledger struct {
	s Sample
	// budget is TargetUtilization × total less every reservation: the
	// room left for pods not admitted yet.
	budget float64
	// smallest is the least a running pod's leaving frees: its
	// reservation (0 with no pod running).
	smallest float64
}

// PeakHold is how long a container's own peak stays reserved after it last
// reached it: a service that dips for lunch comes back (RIFE on the seed
// day, 8 GiB, 6 GiB from 13:00 to 15:00, 8 GiB again: the day crashes five
// times when its 8 GiB is not kept), while one that has stayed lower for a
// quarter of a day is in its evening, and holding its daytime peak all
// night kept the seed day's last job (1.5 GiB at 23:00) from ever starting.
const PeakHold = 6 * time.Hour

// reservation is what running container c is expected to hold over the
// next horizon: the most it used since it started, if it reached that
// within PeakHold, at least what it holds now plus the growth its
// workload's pods showed from its age to horizon later (PeakByAge: a job
// still loading reaches its working set, a leaking service keeps
// leaking). A container that has settled is reserved at its own size, not
// at its workload's largest pod. While it is younger than a Window and its
// workload is not known (watched for less than a Window,
// WorkloadMemory.Known), it is reserved at least at a stranger's price, the
// one it was admitted at: it may not have reached its working set yet.
func (v gpuView) reservation(c string, horizon time.Duration) (bytes uint64, guess bool) {
	own := v.peaks[c]
	w := v.obs.Memory.Workloads[v.obs.workload(c)]
	age := v.age(c)
	r := own
	if cm := v.obs.Memory.Containers[c]; v.now.Sub(cm.PeakAt) <= PeakHold {
		r = max(r, cm.PeakBytes)
	}
	if ahead, now := w.PeakBy(age+horizon), w.PeakBy(age); ahead > now {
		r = max(r, own+(ahead-now))
	}
	if age < v.cfg.Window && w.Lifetime >= 2*v.cfg.Window {
		// A pod of a workload whose pods run for hours may, in its first
		// window, still grow to what the largest of them reached: an error
		// there stays for hours (a model 8 minutes into loading, at 12 of
		// its 20 GiB, beside a job admitted into the 8 GiB it had not yet
		// taken). A short job's error is gone with it, and reserving every
		// job of a burst at its largest sibling's size for its whole life
		// costs the burst (night burst: 124,576 pod-s pending, 115,842 for
		// static:5).
		r = max(r, w.PeakBy(age+horizon))
	}
	if !w.Known(v.cfg) && age < v.cfg.Window {
		return max(r, v.footprint), true
	}
	return r, false
}

// age is how long container c has been seen: since Memory first saw it,
// or, when Memory does not know it (Decide without Round), since the first
// sample of the window that shows it.
func (v gpuView) age(c string) time.Duration {
	if cm, ok := v.obs.Memory.Containers[c]; ok && !cm.FirstSeen.IsZero() {
		return v.now.Sub(cm.FirstSeen)
	}
	for _, s := range v.window {
		if _, ok := s.ContainerPeaks[c]; ok {
			return v.now.Sub(s.Time)
		}
	}
	return 0
}

// ledgerAt reserves the memory of window[i] over horizon.
func (v gpuView) ledgerAt(i int, horizon time.Duration) (l ledger, ok bool) {
	l.s = v.window[i]
	if l.s.MemoryTotalBytes == 0 {
		return l, false
	}
	var reserved uint64
	l.smallest = math.Inf(1)
	for c := range l.s.ContainerPeaks {
		r, _ := v.reservation(c, horizon)
		reserved += r
		l.smallest = min(l.smallest, float64(r))
	}
	if math.IsInf(l.smallest, 1) {
		l.smallest = 0
	}
	// Memory no container accounts for (a process outside any pod, a
	// driver's context) is reserved at the most it held in the window: it
	// comes and goes between samples. A replica held by a pod that shows no
	// memory is not reserved: an idle notebook holds one for hours without
	// touching the GPU, and a pod with two replica IDs is one container.
	reserved += v.unattributed[i]
	l.budget = v.cfg.TargetUtilization*float64(l.s.MemoryTotalBytes) - float64(reserved)
	return l, true
}

// price is what pending pod p is expected to use: when its workload is
// Known, what its pods grew to by the time they had shared the GPU as long
// as p will (horizon); else a stranger's price. Known says which.
func (v gpuView) price(p PendingPod) (price uint64, known bool) {
	if w := v.obs.Memory.Workloads[p.Workload]; w.Known(v.cfg) {
		return w.PeakBy(v.horizon(p)), true
	}
	return v.footprint, false
}

// horizon is how long pending pod p is expected to share the GPU once
// admitted: the longest its workload's pods ran, at least a Window. A
// leaking service is small when it starts and fills the GPU a day later:
// priced at what it needs a Window in, the fourth service on a 12 GiB card
// that holds three takes the replica a stranger left and crash-loops for
// days (233 OOM events on a generated week, services unbounded); priced at
// what it grew to over its life, it waits for the room.
func (v gpuView) horizon(p PendingPod) time.Duration {
	w := v.obs.Memory.Workloads[p.Workload]
	if !w.Known(v.cfg) {
		return v.cfg.Window
	}
	return max(v.cfg.Window, w.Lifetime)
}

// queue is what the pending pods ask of the ledger's budget.
type queue struct {
	// backed counts the replicas of the longest queue prefix whose pods
	// the budget backs, and prices are those pods' prices.
	backed int
	prices []uint64
	// next is the price of the first pod not backed (0 when all are), and
	// learning says it waits for its workload's first pod to be learnt.
	next     uint64
	learning bool
}

// admit walks the pending pods in queue order (a replica goes to the
// oldest waiting pod, first come first served), pricing each pod once
// whatever replicas it asks for: a pod's memory is its processes', not its
// replica IDs'.
//
// A pod of a workload whose first pods are still being learnt is admitted
// only at a price at least twice what they have shown: its siblings are
// the same unknown. A burst of 24 jobs that load 6 GiB and grow to 12 GiB
// two minutes later, priced at the 6 GiB the first one showed, fills an
// 80 GiB card twice over; with the rule the first one shows its size
// before the rest are priced at it. Pods that load a little and grow a lot
// (thumbnail jobs at 0.5 GiB beside a 2.5 GiB detector) start beside it at
// once.
func (v gpuView) admit() queue {
	var q queue
	led, ok := v.latest, v.ok
	if !ok {
		return q
	}
	shown := map[string]uint64{} // workloads being learnt: the most their running pods showed
	for c := range led.s.ContainerPeaks {
		if wl := v.obs.workload(c); !v.obs.Memory.Workloads[wl].Known(v.cfg) {
			shown[wl] = max(shown[wl], v.peaks[c])
		}
	}
	budget := led.budget
	for _, p := range v.obs.Pending {
		price, known := v.price(p)
		s, learning := shown[p.Workload]
		wait := !known && learning && (s == 0 || price < 2*s)
		if price == 0 || budget < float64(price) || wait {
			q.next = max(price, 1)
			q.learning = wait && budget >= float64(price)
			break
		}
		if !known && !learning {
			shown[p.Workload] = 0 // admitted now: its siblings wait for it
		}
		budget -= float64(price)
		q.backed += max(p.Replicas, 1)
		q.prices = append(q.prices, price)
	}
	return q
}

// spares is how many pods of a stranger's price the budget backs: a spare
// replica goes to the next pod to arrive, before any sample sees it.
func (v gpuView) spares(budget float64) int {
	if v.footprint == 0 || budget <= 0 {
		return 0
	}
	return int(math.Floor(budget / float64(v.footprint)))
}

// plan is the count the ledger backs now.
type plan struct {
	// a is the allocated count; to the count the memory backs: the pods
	// that hold replicas, the waiting pods the budget backs in queue order
	// and, when it backs all of them, spare replicas for strangers.
	a, to int
	q     queue
	// short says a waiting pod is not backed; spare counts the spare
	// replicas in to.
	short bool
	spare int
}

func (v gpuView) plan(led ledger) plan {
	p := plan{a: led.s.ReplicasAllocated}
	p.q = v.admit()
	if p.q.next > 0 {
		p.short = true
		p.to = p.a + p.q.backed
		if p.q.backed == 0 && led.budget+led.smallest < float64(p.q.next) {
			// Not even the smallest running pod's leaving makes room for
			// the next: the replica it leaves is not handed on. (On the
			// seed day a 20 GiB fine-tune took, at 12:50, the replica a
			// 6 GiB job had just left, beside services at their daytime
			// peaks, and crashed.)
			p.to = p.a - 1
		}
		return p
	}
	left := led.budget
	for _, c := range p.q.prices {
		left -= float64(c)
	}
	p.spare = v.spares(left)
	p.to = p.a + p.q.backed + p.spare
	return p
}

// full is the count at which no replica is handed on because the pods
// holding replicas fill the GPU to PressureThreshold even without the
// smallest of them, in every sample of the last PressureWindow (one
// allocation burst is not fullness), as measured, not as projected: the
// replica the smallest leaves has no room for another pod (allocated − 1). Measured
// pressure is evidence, like an OOM, so it may go below the base; a
// projection is a guess and may not, and neither may TargetUtilization,
// which is the tuner's own margin. (On family-24g-big-models two models
// and a job hold 22.2 of 24 GiB, 92.5%, without the smallest job: its
// replica is handed on, as at the operator's count, and nothing OOMs.)
func (v gpuView) full(led ledger) (int, string) {
	from := v.now.Add(-v.cfg.PressureWindow)
	ss := within(v.window, from, v.now)
	if !covers(ss, from, v.now, v.cfg.SampleInterval) {
		return v.cur, ""
	}
	var rest uint64
	for _, s := range ss {
		line := v.cfg.PressureThreshold * float64(s.MemoryTotalBytes)
		if s.MemoryTotalBytes == 0 || float64(s.MemoryUsedBytes) < line || len(s.ContainerPeaks) == 0 {
			return v.cur, ""
		}
		smallest := uint64(math.MaxUint64)
		for _, p := range s.ContainerPeaks {
			smallest = min(smallest, p)
		}
		if rest = s.MemoryUsedBytes - min(smallest, s.MemoryUsedBytes); float64(rest) < line {
			return v.cur, ""
		}
	}
	s := led.s
	if s.ReplicasAllocated == 0 {
		return v.cur, ""
	}
	return s.ReplicasAllocated - 1, fmt.Sprintf("for %s %s of %s used with %d allocated, %s without the smallest pod: at or past %.0f%% either way",
		v.cfg.PressureWindow, gib(s.MemoryUsedBytes), gib(s.MemoryTotalBytes), s.ReplicasAllocated, gib(rest), 100*v.cfg.PressureThreshold)
}

// idleUnbacked says whether, in every sample of the window, more replicas
// were free than the memory left backed at a stranger's price: an idle
// replica is given back only on the same span of evidence a raise needs,
// so that it is not given back and raised for again every quarter hour.
func (v gpuView) idleUnbacked() bool {
	if !covers(v.window, v.now.Add(-v.cfg.Window), v.now, v.cfg.SampleInterval) {
		return false
	}
	for i := range v.window {
		led, ok := v.ledgerAt(i, v.cfg.Window)
		if !ok || led.s.ReplicasAllocated == 0 || v.cur-led.s.ReplicasAllocated <= v.spares(led.budget) {
			return false
		}
	}
	return true
}

func (v gpuView) decide(lastChange time.Time) Decision {
	cfg, cur := v.cfg, v.cur
	sinceChange := time.Duration(math.MaxInt64)
	if !lastChange.IsZero() {
		sinceChange = v.now.Sub(lastChange)
	}

	// Lowerings: the smallest target wins; on equal targets the order below
	// (OOM, pressure, fullness, unbacked, bound) names the reason.
	low := Decision{Replicas: cur}
	lower := func(to int, reason, msg string) {
		if to < low.Replicas {
			low = Decision{Replicas: to, Reason: reason, Message: msg + fmt.Sprintf(", lowering %d -> %d", cur, to)}
		}
	}
	oi := v.ooms()
	if oi.incidents > 0 {
		lower(oi.target, ReasonGPUOOM, fmt.Sprintf("%d GPU OOM incident(s) on a full GPU in the last %s; %d pods did not fit together%s",
			oi.incidents, cfg.Window, oi.alloc, oi.fits))
	}
	// Pressure that no OOM and no measured fullness backs withdraws only
	// the tuner's own bets: on family-24g-big-models two models and two
	// jobs hold 96.9% of 24 GiB for minutes at the operator's count of 4,
	// and nothing ever OOMs there.
	pressed, pressTarget, pressMsg := v.pressure()
	pressTarget = max(pressTarget, v.base)
	if pressed && sinceChange >= cfg.PressureWindow {
		lower(pressTarget, ReasonMemoryPressure, pressMsg)
	}
	led, ok := v.latest, v.ok
	var p plan
	if ok {
		p = v.plan(led)
		if to, msg := v.full(led); to < cur {
			lower(max(to, cfg.MinReplicas, 1), ReasonMemoryFull, msg)
		}
		if to := max(p.to, v.base); to < cur {
			switch {
			case p.short:
				// A waiting pod takes a free replica the moment one is
				// free, before any sample sees it: the count stops at
				// the pods the memory backs, at once.
				lower(to, ReasonUnbackedReplicas, fmt.Sprintf(
					"%d pod(s) wait and %s of %s is used with %d allocated: the memory left, %s under %.0f%%, backs %d of them (the next priced %s)",
					len(v.obs.Pending), gib(led.s.MemoryUsedBytes), gib(led.s.MemoryTotalBytes), p.a, gibf(led.budget), 100*cfg.TargetUtilization,
					len(p.q.prices), gib(p.q.next)))
			case sinceChange >= cfg.Window && v.idleUnbacked():
				lower(to, ReasonUnbackedReplicas, fmt.Sprintf(
					"for %s %d of %d replicas were free and the memory left (%s of %s used with %d allocated, %s under %.0f%%) backs %d pod(s) of %s",
					cfg.Window, cur-p.a, cur, gib(led.s.MemoryUsedBytes), gib(led.s.MemoryTotalBytes), p.a, gibf(led.budget), 100*cfg.TargetUtilization,
					to-p.a, gib(v.footprint)))
			}
		}
	}
	if cur > cfg.MaxReplicas {
		lower(cfg.MaxReplicas, ReasonAboveMaximum, fmt.Sprintf("%d replicas is above maxReplicas %d", cur, cfg.MaxReplicas))
	}
	if low.Replicas < cur {
		return low
	}
	if cur < cfg.MinReplicas {
		return Decision{Replicas: cfg.MinReplicas, Reason: ReasonBelowMinimum,
			Message: fmt.Sprintf("%d replicas is below minReplicas %d", cur, cfg.MinReplicas)}
	}

	hold := func(reason, format string, args ...any) Decision {
		return Decision{Replicas: cur, Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case oi.incidents > 0:
		return hold(ReasonRecentOOM, "%d GPU OOM incident(s) on a full GPU in the last %s, keeping %d replicas", oi.incidents, cfg.Window, cur)
	case pressed && pressTarget >= cur:
		return hold(ReasonOngoingPressure, "%s; %d replicas is already at or below them, keeping it", pressMsg, cur)
	case pressed:
		return hold(ReasonMemoryPressureGuard, "%s, but the last change was %s ago (< pressureWindow %s), keeping %d replicas",
			pressMsg, sinceChange, cfg.PressureWindow, cur)
	case cur >= cfg.MaxReplicas:
		return hold(ReasonAtMaximum, "%d replicas is maxReplicas", cur)
	case sinceChange < cfg.SampleInterval:
		return hold(ReasonCooldown, "last change %s ago, less than a sample, keeping %d replicas", sinceChange, cur)
	case !covers(v.window, v.now.Add(-cfg.Window), v.now, cfg.SampleInterval):
		return hold(ReasonInsufficientHistory, "samples cover less than the %s window (%d samples, one every %s expected), keeping %d replicas",
			cfg.Window, len(v.window), cfg.SampleInterval, cur)
	}
	latest := v.window[len(v.window)-1]
	if latest.ReplicasAdvertised != 0 && latest.ReplicasAdvertised != cur {
		return hold(ReasonAwaitingApply, "%d replicas advertised, %d decided: the last change has not taken effect", latest.ReplicasAdvertised, cur)
	}
	if !ok {
		return hold(ReasonNoWorkload, "the GPU's total memory is unknown, nothing to size a raise, keeping %d replicas", cur)
	}
	a, free, pending := p.a, max(cur-p.a, 0), len(v.obs.Pending) > 0
	used := func() string {
		return fmt.Sprintf("%s of %s used with %d allocated leaves %s under %.0f%%",
			gib(latest.MemoryUsedBytes), gib(latest.MemoryTotalBytes), a, gibf(led.budget), 100*cfg.TargetUtilization)
	}
	var to int
	var why string
	switch {
	case v.footprint == 0 && len(p.q.prices) == 0:
		return hold(ReasonNoWorkload, "no container memory seen in the last %s nor remembered for the pending pods, nothing to size a raise, keeping %d replicas", cfg.Window, cur)
	case pending && p.q.backed > 0 && a+p.q.backed > cur:
		// Pods wait for replicas the memory backs: the raise is for them
		// alone. Spare replicas beside them would go to whoever arrives
		// next, unpriced, in the middle of a burst.
		to = a + p.q.backed
		why = fmt.Sprintf("%d pod(s) wait; %s for %d of them, priced %s", len(v.obs.Pending), used(), len(p.q.prices), gibs(p.q.prices[:min(len(p.q.prices), 6)]))
	case p.q.learning:
		return hold(ReasonLearning, "%d pod(s) wait; the next is of a workload whose first pod is still being learnt, %s, keeping %d replicas", len(v.obs.Pending), used(), cur)
	case p.short:
		return hold(ReasonInsufficientHeadroom, "%d pod(s) wait; %s: the next, priced %s, would not fit, keeping %d replicas", len(v.obs.Pending), used(), gib(p.q.next), cur)
	case free > 0 || pending:
		return hold(ReasonFreeReplicas, "%d of %d replicas are free, no pod needs another, keeping %d replicas", free, cur, cur)
	case p.spare == 0:
		return hold(ReasonInsufficientHeadroom, "every replica is taken; %s: the next pod, priced %s, would not fit, keeping %d replicas", used(), gib(v.footprint), cur)
	case sinceChange < cfg.Cooldown:
		// Every replica is taken and nobody waits yet: a spare replica is
		// a bet on the next pod, whoever it is.
		return hold(ReasonCooldown, "last change %s ago, cooldown %s for a spare replica, keeping %d replicas", sinceChange, cfg.Cooldown, cur)
	default:
		// One spare: it saves the next pod a round's wait, and pods that
		// come together wait a round and are priced as a queue (a spare
		// for each would go unpriced to whoever comes; as many spares as
		// the memory backs make no difference on any trace here).
		to = a + 1
		why = fmt.Sprintf("every replica is taken; %s, room for %d more pod(s) of %s: one spare", used(), p.spare, gib(v.footprint))
	}
	to = min(to, cur+cfg.MaxStepUp, cfg.MaxReplicas)
	if banned, c, at := v.banned(); banned <= cur {
		return hold(ReasonRememberedOOM, "%s, still running, OOMed on a full GPU with %d pods at %s, keeping %d replicas",
			c, banned+1, at.Format(time.RFC3339), cur)
	} else {
		to = min(to, banned)
	}
	return Decision{Replicas: to, Reason: ReasonSustainedHeadroom, Message: why + fmt.Sprintf(", raising %d -> %d", cur, to)}
}

// banned is the count below which the pod that OOMed on a full GPU with
// A pods holding replicas is not given A again while it still runs: the
// same pod at the same count would hit the same wall, whatever the
// estimates say (a crash loop keeps its container). Its workload's
// PeakByAge keeps the memory the OOM asked for, so its next pods, tomorrow's
// run of a daily job included, are priced at it instead of being held at a
// count that a smaller mix would have fitted (on family-48g-leaky a ban of
// the leaking service's workload at 4 held every job out for the second
// day). It returns math.MaxInt when nothing holds.
func (v gpuView) banned() (int, string, time.Time) {
	limit, who, when := math.MaxInt, "", time.Time{}
	for c := range v.window[len(v.window)-1].ContainerPeaks {
		w, ok := v.obs.Memory.Workloads[v.obs.workload(c)]
		if !ok || w.OOMAllocated == 0 || w.OOMContainer != c || v.now.Sub(w.LastOOM) >= v.cfg.Remember {
			continue
		}
		if w.OOMAllocated-1 < limit || (w.OOMAllocated-1 == limit && c < who) {
			limit, who, when = w.OOMAllocated-1, c, w.LastOOM
		}
	}
	return limit, who, when
}

// gibf writes a byte budget that may be negative.
func gibf(b float64) string { return fmt.Sprintf("%.1f GiB", b/(1<<30)) }

// Package sim replays a trace of pods on one time-sliced GPU under a replica
// policy, offline, and sums up how it went: GPU OOM events, time pods waited
// for a replica, time they held one, replica changes. `gpuslice-tuner
// simulate` prints its Result.
//
// The replay follows DESIGN.md, "Trace file for simulate". It is event
// driven and exact: a pod waits (first come, first served) until a replica is
// free and keeps it until its run ends. When the running pods' memory sum
// passes the GPU's total, the pod whose memory grew at that moment, or that
// just started, fails with an OOM event, keeps its replica and starts again
// RestartDelay later from the beginning of its memory timeline, its run
// clock still going. Lowering replicas never stops a running pod.
//
// Events at one instant happen in this order: pods end; memory changes, all
// decreases before any increase, increases one pod at a time in trace order
// (so exactly one pod is blamed for passing the total); arrivals queue up;
// on a tick, the policy samples and decides; waiting pods are admitted.
//
// Every Tick (the controller's sampling interval) the GPU is sampled as the
// controller samples it: total and used memory at the tick, each container's
// peak since the previous tick, OOM events since the previous tick, replicas
// advertised and allocated. The policy sees the samples of its History
// window and the pods waiting, with their workload keys, in a
// policy.Observation, so `tuner` runs policy.Round itself, carrying the
// workload memory from tick to tick as the controller does from round to
// round. A change takes effect at once.
package sim

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// RestartDelay is how long a pod killed by a GPU OOM waits before it starts
// again.
const RestartDelay = 30 * time.Second

// Epoch is the wall-clock time of a trace's 0s, for the observations handed
// to policies.
var Epoch = time.Date(2026, 1, 24, 0, 0, 0, 0, time.UTC)

// ErrBadPolicy wraps errors about a policy name or a policy's answer.
var ErrBadPolicy = errors.New("bad policy")

// Policy decides the replica count during a replay.
type Policy interface {
	// Name is how the result names the policy: "tuner", "static:4".
	Name() string
	// Start is the count at 0s, given the trace's initialReplicas.
	Start(initial int) int
	// Tick is how often the GPU is sampled and the policy asked.
	Tick() time.Duration
	// History is how far back the samples handed to Decide go.
	History() time.Duration
	Decide(obs policy.Observation) policy.Decision
}

// Tuner is the tuner's own policy, policy.Round with Config.
type Tuner struct{ Config policy.Config }

// Options are how a replay applies the policy's changes.
type Options struct {
	// Apply is the apply mode's cost: a change takes effect Apply.Latency
	// after the decision, and no pod is admitted during the Apply.Blackout
	// before that (the device plugin restarting). The zero value applies at
	// once.
	Apply policy.ApplyCost
}

func (Tuner) Name() string                                    { return "tuner" }
func (Tuner) Start(initial int) int                           { return initial }
func (t Tuner) Tick() time.Duration                           { return t.Config.SampleInterval }
func (t Tuner) History() time.Duration                        { return t.Config.Window }
func (t Tuner) Decide(obs policy.Observation) policy.Decision { return policy.Decide(t.Config, obs) }

// Round is policy.Round with Config: the tuner remembers workloads from tick
// to tick as the controller does from round to round.
func (t Tuner) Round(obs policy.Observation) (policy.Decision, policy.Memory) {
	return policy.Round(t.Config, obs)
}

// rounder is a Policy that keeps a workload memory between ticks.
type rounder interface {
	Round(obs policy.Observation) (policy.Decision, policy.Memory)
}

// Static keeps Replicas for the whole replay, whatever the trace's
// initialReplicas: what a hand-written device-plugin config does.
type Static struct{ Replicas int }

func (s Static) Name() string         { return "static:" + strconv.Itoa(s.Replicas) }
func (s Static) Start(int) int        { return s.Replicas }
func (Static) Tick() time.Duration    { return 15 * time.Second }
func (Static) History() time.Duration { return 0 }
func (s Static) Decide(policy.Observation) policy.Decision {
	return policy.Decision{Replicas: s.Replicas, Reason: "Static", Message: "static policy"}
}

// ParsePolicy reads "tuner" (policy.Decide with cfg) or "static:N" (N >= 1).
func ParsePolicy(spec string, cfg policy.Config) (Policy, error) {
	if spec == "tuner" {
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		return Tuner{Config: cfg}, nil
	}
	if n, ok := strings.CutPrefix(spec, "static:"); ok {
		r, err := strconv.Atoi(n)
		if err != nil || r < 1 {
			return nil, fmt.Errorf("%w: %q: N in static:N must be a whole number >= 1", ErrBadPolicy, spec)
		}
		return Static{Replicas: r}, nil
	}
	return nil, fmt.Errorf("%w: %q: want tuner or static:N", ErrBadPolicy, spec)
}

// Result sums up a replay. Pod-seconds are summed over pods and end at the
// trace's duration.
type Result struct {
	Policy    string `json:"policy"`
	OOMEvents int    `json:"oomEvents"`
	// RaiseOOMEvents are the OOM events that a raise let happen: at each,
	// more pods held replicas than the count before the policy's latest
	// raise allowed, and the pod that failed was one of those beyond it
	// (the latest admitted since the raise) or would not have failed
	// without them. A static policy has none.
	RaiseOOMEvents int `json:"raiseOOMEvents"`
	// PodSecondsPending is time pods waited for a replica, counting pods
	// still waiting at the end up to the end.
	PodSecondsPending float64 `json:"podSecondsPending"`
	// PodSecondsPendingWarmup is the part of PodSecondsPending before the
	// policy's first full History window and its apply mode's latency
	// after it: time in which it has, by design, not watched long enough
	// to act, or its first act has not taken effect yet.
	PodSecondsPendingWarmup float64 `json:"podSecondsPendingWarmup"`
	// PodSecondsRunning is time pods held a replica, OOM restarts included.
	PodSecondsRunning float64 `json:"podSecondsRunning"`
	ReplicaChanges    int     `json:"replicaChanges"`
	// FinalReplicas is the count the policy chose last (the last change's
	// `to`, else the start), as MinReplicas and MaxReplicas are over the
	// counts it chose: one chosen within its apply latency of the end is
	// still on its way there.
	FinalReplicas int `json:"finalReplicas"`
	// PodSecondsLost is work thrown away by OOMs: from the start of each
	// failed attempt to its OOM, plus the wait before the restart. An
	// eviction throws away the attempt it stops, or ends the restart wait
	// it comes in (the pod waits Pending from then), so lost time is always
	// part of PodSecondsRunning.
	PodSecondsLost float64 `json:"podSecondsLost"`
	Pods           int     `json:"pods"`
	// PodsCompleted ran their whole run within the trace.
	PodsCompleted int `json:"podsCompleted"`
	// PodsNeverStarted were still waiting at the end.
	PodsNeverStarted int `json:"podsNeverStarted"`
	// PodsWithOOM failed at least once.
	PodsWithOOM int `json:"podsWithOOM"`
	// MaxPendingSeconds is the longest a single pod waited.
	MaxPendingSeconds float64 `json:"maxPendingSeconds"`
	MinReplicas       int     `json:"minReplicas"`
	MaxReplicas       int     `json:"maxReplicas"`
	// MaxHeld is the most pods that held replicas at once: a count is
	// only as many pods as come for it.
	MaxHeld int `json:"maxHeld"`
	// ApplyMode is the apply mode replayed, ApplyLatencySeconds the
	// latency charged over all changes (a change takes effect that long
	// after the decision) and BlackoutSeconds the time the node admitted
	// nothing while its plugin restarted; both within the trace, so a
	// change decided near its end is charged up to the end only.
	ApplyMode           string  `json:"applyMode"`
	ApplyLatencySeconds float64 `json:"applyLatencySeconds"`
	BlackoutSeconds     float64 `json:"blackoutSeconds"`
	// Reversals counts changes that undid the one before (the opposite
	// direction) within its settle time (policy.ApplyCost.Settle) with no
	// OOM event between: a raise undone a round later, paid for twice.
	Reversals int `json:"reversals"`
	// OOMsPerContainer counts each pod's OOM events (pods with none are
	// left out); MaxOOMsInARow is the most OOM events one pod had in a
	// row, each within RowGap of the one before.
	OOMsPerContainer map[string]int `json:"oomsPerContainer"`
	MaxOOMsInARow    int            `json:"maxOOMsInARow"`
	// Evictions counts pods the policy evicted for OOMing in a row; an
	// evicted pod is recreated at once by its controller and waits at the
	// end of the queue, from the beginning of its run.
	Evictions int      `json:"evictions"`
	Changes   []Change `json:"changes"`
	// MPSResult is set when the trace shares the GPU through MPS (mps.go).
	*MPSResult
	// waits is each pod's time pending, in trace order (TestReplay).
	waits []time.Duration
}

// Change is one replica change.
type Change struct {
	Seconds float64 `json:"t"`
	At      string  `json:"at"` // the same instant as a Go duration, for people
	From    int     `json:"from"`
	To      int     `json:"to"`
	Reason  string  `json:"reason"`
	Message string  `json:"message"`
}

type podState int

const (
	notArrived podState = iota
	waiting
	running
	restarting // killed by an OOM, holding its replica until RestartDelay passes
	finished
)

type podRun struct {
	*Pod
	index     int
	state     podState
	queued    time.Duration // when it last started waiting: its arrival, or its eviction
	admitted  time.Duration
	end       time.Duration // admitted + Run
	attempt   time.Duration // start of the current memory timeline
	step      int           // current step of Memory
	mem       uint64
	restartAt time.Duration
	peak      uint64 // since the previous tick
	seen      bool   // ran at some point since the previous tick
	ooms      int
	row       int           // OOMs in a row
	lastOOM   time.Duration // when the latest happened
	waited    time.Duration // waits before an eviction
	ran       time.Duration // runs before an eviction
	starts    int
}

// RowGap is how close two OOM events of one pod must be to count as in a
// row: a crash loop restarts within RestartDelay plus the time its
// allocation takes to fail.
const RowGap = 10 * time.Minute

// nextStep is when the pod's memory next changes, or -1.
func (p *podRun) nextStep() time.Duration {
	if p.state != running || p.step+1 >= len(p.Memory) {
		return -1
	}
	return later(p.attempt, p.Memory[p.step+1].At)
}

// later is d after t, or the largest Duration when that is out of its
// range: a run or a memory step that far off is, to the replay, never.
func later(t, d time.Duration) time.Duration {
	if d > math.MaxInt64-t {
		return math.MaxInt64
	}
	return t + d
}

type replay struct {
	tr       *Trace
	pol      Policy
	pods     []*podRun
	arrivals []*podRun // by arrival, then trace order
	next     int       // next arrival
	queue    []*podRun // waiting, first come first served
	used     uint64
	held     int // pods holding a replica
	replicas int // the count in effect
	// decided is the count the policy asked for last; it takes effect at
	// effectAt (decided == replicas once it has).
	decided  int
	effectAt time.Duration
	opt      Options
	settle   time.Duration
	// lastDir and lastAt are the latest change's direction and time;
	// oomSince says an OOM event came after it.
	lastDir  string
	lastAt   time.Duration
	oomSince bool
	changed  time.Time
	// beforeRaise is the count before the latest raise, decided at
	// raisedAt; 0 before any.
	beforeRaise int
	raisedAt    time.Duration
	mem         policy.Memory
	workloads   map[string]string // pod name -> workload, read-only
	samples     []policy.Sample
	newOOMs     []policy.OOM // since the previous tick
	nextTick    time.Duration
	res         Result
	pending     time.Duration
	warmup      time.Duration
	lost        time.Duration
	latency     time.Duration // charged by chargeApply
	blackout    time.Duration
	mps         *mpsReplay // nil unless the trace shares through MPS (mps.go)
}

// Run replays tr under p, applying changes at once. It is deterministic.
func Run(tr *Trace, p Policy) (*Result, error) { return RunWith(tr, p, Options{}) }

// RunWith replays tr under p with opt. It is deterministic.
func RunWith(tr *Trace, p Policy, opt Options) (*Result, error) {
	if p.Tick() <= 0 {
		return nil, fmt.Errorf("%w: %s: tick must be > 0", ErrBadPolicy, p.Name())
	}
	r := &replay{tr: tr, pol: p, replicas: p.Start(tr.InitialReplicas), opt: opt}
	if r.replicas < 1 {
		return nil, fmt.Errorf("%w: %s starts at %d replicas", ErrBadPolicy, p.Name(), r.replicas)
	}
	r.decided = r.replicas
	if t, ok := p.(Tuner); ok {
		r.settle = opt.Apply.Settle(t.Config)
	} else {
		r.settle = opt.Apply.Latency + p.History()
	}
	r.workloads = map[string]string{}
	for i := range tr.Pods {
		r.pods = append(r.pods, &podRun{Pod: &tr.Pods[i], index: i})
		r.workloads[tr.Pods[i].Name] = tr.Pods[i].Workload
	}
	r.arrivals = slices.Clone(r.pods)
	slices.SortStableFunc(r.arrivals, func(a, b *podRun) int { return cmp.Compare(a.Arrive, b.Arrive) })
	mode := opt.Apply.Mode
	if mode == "" {
		mode = policy.ModeInstant
	}
	r.res = Result{Policy: p.Name(), Pods: len(tr.Pods), MinReplicas: r.replicas, MaxReplicas: r.replicas, Changes: []Change{},
		ApplyMode: mode, OOMsPerContainer: map[string]int{}}
	r.startMPS()

	for t := time.Duration(0); t < tr.Duration; {
		r.endRuns(t)
		r.changeMemory(t)
		if r.decided != r.replicas && t >= r.effectAt {
			r.replicas = r.decided
		}
		for ; r.next < len(r.arrivals) && r.arrivals[r.next].Arrive == t; r.next++ {
			r.arrivals[r.next].state = waiting
			r.arrivals[r.next].queued = t
			r.queue = append(r.queue, r.arrivals[r.next])
		}
		if t == r.nextTick {
			if err := r.tick(t); err != nil {
				return nil, err
			}
			r.nextTick += p.Tick()
		}
		r.admit(t)
		next := r.nextEvent(t)
		r.chargeApply(t, next)
		t = next
	}
	r.finish()
	return &r.res, nil
}

// nextEvent is the first instant after t at which something happens, or the
// trace's end.
func (r *replay) nextEvent(t time.Duration) time.Duration {
	next := min(r.nextTick, r.tr.Duration)
	if r.decided != r.replicas {
		next = min(next, r.effectAt)
		if b := r.effectAt - r.opt.Apply.Blackout; b > t {
			next = min(next, b)
		}
	}
	if r.next < len(r.arrivals) {
		next = min(next, r.arrivals[r.next].Arrive)
	}
	for _, p := range r.pods {
		switch p.state {
		case running:
			next = min(next, p.end)
			if s := p.nextStep(); s > t {
				next = min(next, s)
			}
		case restarting:
			next = min(next, p.end, p.restartAt)
		}
	}
	return next
}

func (r *replay) endRuns(t time.Duration) {
	for _, p := range r.pods {
		if (p.state == running || p.state == restarting) && p.end == t {
			r.setMemory(p, 0)
			p.state = finished
			r.held--
		}
	}
}

// changeMemory applies the memory steps and restarts due at t.
func (r *replay) changeMemory(t time.Duration) {
	type change struct {
		p  *podRun
		to uint64
	}
	var changes []change
	for _, p := range r.pods {
		switch {
		case p.state == restarting && p.restartAt == t:
			p.state, p.attempt, p.step = running, t, 0
			changes = append(changes, change{p, p.Memory[0].Bytes})
		case p.nextStep() == t:
			p.step++
			changes = append(changes, change{p, p.Memory[p.step].Bytes})
		}
	}
	for _, c := range changes {
		if c.to <= c.p.mem {
			r.setMemory(c.p, c.to)
		}
	}
	for _, c := range changes {
		if c.to > c.p.mem {
			r.grow(c.p, c.to, t)
		}
	}
}

// grow raises a pod's memory, or fails it with an OOM when the GPU's total
// would be passed.
func (r *replay) grow(p *podRun, to uint64, t time.Duration) {
	if r.mps.overLimit(p, to) {
		r.capOOM(p, t)
		return
	}
	if fits(r.used-p.mem, to, r.tr.MemoryTotalBytes) {
		r.setMemory(p, to)
		return
	}
	// The trace's OOM is by construction the GPU's total being passed: the
	// exporter would report it as a full device.
	if r.raiseLet(p, to) {
		r.res.RaiseOOMEvents++
	}
	r.oom(p, t, policy.OOMDevice)
}

// raiseLet says whether the pods a raise let in made pod p's growth to
// bytes fail: more pods hold replicas than the count before the policy's
// latest raise allowed, and p is one of those beyond it (the latest
// admitted since the raise) or would have grown to bytes without them. A
// pod that fails beside only the pods the count before the raise allowed
// fails whatever the raise did: a trainer that needs 14 GiB beside three
// 4 GiB services on 24 GiB fails at each load, with or without the 2 GiB
// job a raise let in beside it.
func (r *replay) raiseLet(p *podRun, bytes uint64) bool {
	if r.beforeRaise <= 0 || r.held <= r.beforeRaise {
		return false
	}
	var holding []*podRun // those admitted since the raise
	for _, q := range r.pods {
		if (q.state == running || q.state == restarting) && q.admitted >= r.raisedAt {
			holding = append(holding, q)
		}
	}
	// The latest admitted first; on equal times the later in the trace.
	slices.SortStableFunc(holding, func(a, b *podRun) int {
		return cmp.Or(cmp.Compare(b.admitted, a.admitted), cmp.Compare(b.index, a.index))
	})
	extra := uint64(0)
	for _, q := range holding[:min(r.held-r.beforeRaise, len(holding))] {
		if q == p {
			return true
		}
		extra += q.mem
	}
	return fits(r.used-p.mem-extra, bytes, r.tr.MemoryTotalBytes)
}

// fits says whether others plus bytes is at most total, where others (the
// memory the other pods hold) is at most total and bytes may be anything a
// trace holds: the sum itself could pass 2^64 and wrap to a small number.
func fits(others, bytes, total uint64) bool { return bytes <= total && others <= total-bytes }

// oom fails pod p at t with an OOM of kind: counted, its row of OOMs
// carried on, and the pod restarting after RestartDelay.
func (r *replay) oom(p *podRun, t time.Duration, kind policy.OOMKind) {
	r.res.OOMEvents++
	r.oomSince = true
	r.res.OOMsPerContainer[p.Name]++
	if p.ooms > 0 && t-p.lastOOM <= RowGap {
		p.row++
	} else {
		p.row = 1
	}
	p.lastOOM = t
	r.res.MaxOOMsInARow = max(r.res.MaxOOMsInARow, p.row)
	r.newOOMs = append(r.newOOMs, policy.OOM{Container: p.Name, Kind: kind})
	p.ooms++
	r.lost += t - p.attempt + min(RestartDelay, p.end-t, r.tr.Duration-t)
	r.setMemory(p, 0)
	p.state, p.restartAt = restarting, t+RestartDelay
}

func (r *replay) setMemory(p *podRun, to uint64) {
	r.used = r.used - p.mem + to
	p.mem = to
	if p.state == running {
		p.peak, p.seen = max(p.peak, to), true
	}
}

// tick samples the GPU as the controller would and asks the policy.
func (r *replay) tick(t time.Duration) error {
	now := Epoch.Add(t)
	s := policy.Sample{
		Time:               now,
		MemoryTotalBytes:   r.tr.MemoryTotalBytes,
		MemoryUsedBytes:    r.used,
		ContainerPeaks:     map[string]uint64{},
		OOMEvents:          len(r.newOOMs),
		OOMs:               r.newOOMs,
		ReplicasAdvertised: r.replicas,
		ReplicasAllocated:  r.held,
	}
	for _, p := range r.pods {
		if p.seen {
			s.ContainerPeaks[p.Name] = p.peak
		}
		p.peak, p.seen = p.mem, p.state == running
	}
	r.mpsSample(&s)
	r.newOOMs = nil
	r.samples = append(r.samples, s)
	from := now.Add(-r.pol.History())
	drop := 0
	for drop < len(r.samples) && r.samples[drop].Time.Before(from) {
		drop++
	}
	r.samples = r.samples[drop:]

	obs := policy.Observation{
		Node: "sim", Now: now, CurrentReplicas: r.decided, LastChange: r.changed, LastDirection: r.lastDir,
		ContainerWorkloads: r.workloads, Memory: r.mem, Apply: r.opt.Apply,
		GPUs: []policy.GPUObservation{{UUID: "GPU-sim-0", Samples: r.samples}},
	}
	r.mpsObserve(&obs)
	for _, p := range r.queue {
		obs.Pending = append(obs.Pending, policy.PendingPod{Workload: p.Workload, Replicas: 1, Since: Epoch.Add(p.queued)})
	}
	var d policy.Decision
	if rp, ok := r.pol.(rounder); ok {
		d, r.mem = rp.Round(obs)
	} else {
		d = r.pol.Decide(obs)
	}
	if d.Replicas < 1 {
		return fmt.Errorf("%w: %s answered %d replicas at %s (%s)", ErrBadPolicy, r.pol.Name(), d.Replicas, t, d.Reason)
	}
	for _, l := range d.CrashLoops {
		if l.Evict {
			r.evict(l.Container, t)
		}
	}
	if d.Replicas != r.decided {
		dir := policy.DirectionDown
		if d.Replicas > r.decided {
			r.beforeRaise, r.raisedAt = r.decided, t
			dir = policy.DirectionUp
		}
		if r.lastDir != "" && dir != r.lastDir && t-r.lastAt < r.settle && !r.oomSince {
			r.res.Reversals++
		}
		r.res.Changes = append(r.res.Changes, Change{Seconds: t.Seconds(), At: t.String(), From: r.decided, To: d.Replicas,
			Reason: d.Reason, Message: d.Message})
		r.decided, r.changed, r.lastDir, r.lastAt, r.oomSince = d.Replicas, now, dir, t, false
		r.effectAt = t + r.opt.Apply.Latency
		if r.opt.Apply.Latency == 0 {
			r.replicas = r.decided
		}
		r.res.MinReplicas = min(r.res.MinReplicas, r.decided)
		r.res.MaxReplicas = max(r.res.MaxReplicas, r.decided)
	}
	return nil
}

// chargeApply charges [t, next), in which nothing happens, to the apply
// latency while a decided count has not taken effect, and to the blackout
// while the node admits nothing for it (admit). Charged as the replay
// passes through them, a change decided near the trace's end is charged
// only up to the end, and one that a later decision overtakes only until
// then.
func (r *replay) chargeApply(t, next time.Duration) {
	if r.decided == r.replicas {
		return
	}
	r.latency += next - t
	if t >= r.effectAt-r.opt.Apply.Blackout {
		r.blackout += next - t
	}
}

// evict takes the pod named c off the GPU, as the Eviction API would: its
// controller recreates it at once, so it waits again at the end of the
// queue and runs its whole run once admitted.
func (r *replay) evict(c string, t time.Duration) {
	for _, p := range r.pods {
		if p.Name != c || (p.state != running && p.state != restarting) {
			continue
		}
		if p.state == restarting {
			// oom charged the failed attempt and the restart wait to its
			// end; the eviction cuts the wait short at t, and from t the pod
			// waits Pending, which is not lost work.
			r.lost -= min(p.restartAt, p.end, r.tr.Duration) - t
		} else {
			// The attempt running since p.attempt is thrown away: the pod
			// starts its run over once admitted again.
			r.lost += t - p.attempt
		}
		r.setMemory(p, 0)
		r.held--
		p.waited += p.admitted - p.queued
		p.ran += t - p.admitted
		p.state, p.queued, p.row = waiting, t, 0
		r.queue = append(r.queue, p)
		r.res.Evictions++
	}
}

func (r *replay) admit(t time.Duration) {
	if r.decided != r.replicas && t >= r.effectAt-r.opt.Apply.Blackout {
		return // the device plugin restarts: the kubelet admits nothing
	}
	for len(r.queue) > 0 && r.held < r.replicas {
		p := r.queue[0]
		r.queue = r.queue[1:]
		p.state, p.admitted, p.end, p.attempt, p.step = running, t, later(t, p.Run), t, 0
		r.held++
		r.res.MaxHeld = max(r.res.MaxHeld, r.held)
		p.starts++
		wait := t - p.queued
		r.pending += wait
		r.warmup += r.beforeWarm(p.queued, t)
		r.res.MaxPendingSeconds = max(r.res.MaxPendingSeconds, (p.waited + wait).Seconds())
		r.mpsAdmit(p)
		r.grow(p, p.Memory[0].Bytes, t)
	}
}

// beforeWarm is the part of [from, to) before the policy's first full
// History window and the apply mode's latency after it.
func (r *replay) beforeWarm(from, to time.Duration) time.Duration {
	h := r.pol.History() + r.opt.Apply.Latency
	return min(to, h) - min(from, h)
}

func (r *replay) finish() {
	end := r.tr.Duration
	var runningTime time.Duration
	r.res.waits = make([]time.Duration, len(r.pods))
	for i, p := range r.pods {
		if p.state == waiting {
			r.res.waits[i] = p.waited + end - p.queued
		} else if p.state != notArrived {
			r.res.waits[i] = p.waited + p.admitted - p.queued
		}
		switch p.state {
		case waiting:
			r.pending += end - p.queued
			r.warmup += r.beforeWarm(p.queued, end)
			r.res.MaxPendingSeconds = max(r.res.MaxPendingSeconds, (p.waited + end - p.queued).Seconds())
			runningTime += p.ran
			if p.starts == 0 {
				r.res.PodsNeverStarted++
			}
		case running, restarting, finished:
			runningTime += min(p.end, end) - p.admitted + p.ran
			if p.end <= end {
				r.res.PodsCompleted++
			}
		}
		if p.ooms > 0 {
			r.res.PodsWithOOM++
		}
	}
	r.res.PodSecondsPending = r.pending.Seconds()
	r.res.PodSecondsRunning = runningTime.Seconds()
	r.res.PodSecondsPendingWarmup = r.warmup.Seconds()
	r.res.PodSecondsLost = r.lost.Seconds()
	r.res.ApplyLatencySeconds = r.latency.Seconds()
	r.res.BlackoutSeconds = r.blackout.Seconds()
	r.res.ReplicaChanges = len(r.res.Changes)
	r.res.FinalReplicas = r.decided
}

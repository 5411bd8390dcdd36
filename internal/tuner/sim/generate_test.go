package sim

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

var (
	genSeeds  = flag.Int("gen-seeds", defaultGenSeeds, "how many generated traces TestCriterionGenerated replays")
	genFirst  = flag.Uint64("gen-first", 1, "the first seed TestCriterionGenerated replays")
	genDump   = flag.String("gen-dump", "", "write the generated traces as YAML into this folder, for simulate")
	genReport = flag.Bool("gen-report", false, "print every generated seed's verdict and kind of miss, and the knownMisses for the tuner as it stands, failing on no miss")
)

// defaultGenSeeds is how many seeds TestCriterionGenerated replays, and
// the docs' table shows, by default: the classic seeds and as many again
// that draw issue 21's archetypes.
const defaultGenSeeds = 2 * classicSeeds

// archetype adds one kind of workload to a generated trace.
type archetype struct {
	name string
	// resident says its pods are services that hold a replica for hours
	// or days.
	resident bool
	add      func(f *family, g *generator)
}

// residentShare bounds what the services of a generated trace hold
// together at their peaks: an operator does not put on one GPU services
// that fill it by themselves, and a trace where they do shows only how
// often a full GPU crashes, under any policy.
const residentShare = 0.5

// boundResidents scales the resident pods' memory down so that their
// peaks sum to at most share of the GPU (a leak counts at its largest).
// A reserved share (a server that takes a fixed part of the card) is left
// as it is and narrows the rest: the other services get at most half of
// what it leaves, and no pod grows past nine tenths of it, since a job
// that cannot fit beside the server under any count shows nothing about
// the count.
func (f *family) boundResidents(share float64) {
	peaks := map[string]uint64{} // a resident workload's pods are restarts of one service
	var reserved uint64
	for _, p := range f.pods {
		var peak uint64
		for _, m := range p.memory {
			peak = max(peak, m[1])
		}
		switch {
		case p.reserved:
			reserved += peak
		case p.resident:
			peaks[p.workload] = max(peaks[p.workload], peak)
		}
	}
	var sum uint64
	for _, p := range peaks {
		sum += p
	}
	limit := uint64(share * float64(f.total))
	if reserved > 0 {
		limit = min(limit, (f.total-reserved)/2)
	}
	if sum > limit {
		for i := range f.pods {
			if f.pods[i].resident && !f.pods[i].reserved {
				for k := range f.pods[i].memory {
					f.pods[i].memory[k][1] = max(uint64(float64(f.pods[i].memory[k][1])*float64(limit)/float64(sum)), 256<<20)
				}
			}
		}
	}
	if reserved == 0 {
		return
	}
	room := (f.total - reserved) / 10 * 9 / (256 << 20) * (256 << 20)
	for i := range f.pods {
		if !f.pods[i].reserved {
			for k := range f.pods[i].memory {
				f.pods[i].memory[k][1] = min(f.pods[i].memory[k][1], room)
			}
		}
	}
}

// generator holds what the archetypes of one generated trace share.
type generator struct {
	// anonymous leaves jobs without a workload key, as in the seed trace:
	// every pod is a stranger to the workload memory.
	anonymous bool
	// jobs counts an anonymous trace's jobs per workload, to give each its
	// own key.
	jobs map[string]int
	// days are the trace's days; workdays those with office hours.
	days, workdays []time.Duration
}

// share is a size of fraction [lo, hi] of the GPU.
func (f *family) share(lo, hi float64) uint64 {
	return max(f.between(uint64(lo*float64(f.total)), uint64(hi*float64(f.total))), 256<<20)
}

// key is the workload key of a job of workload wl: wl itself, or, in an
// anonymous trace, nothing the next job shares.
// (Counting in f.seq, as this did before, gave every job of wl the key
// wl-1: f.seq counts pods by their key, never by wl, so the anonymous
// traces were keyed after all.)
func (g *generator) key(wl string) string {
	if g.anonymous {
		g.jobs[wl]++
		return fmt.Sprintf("%s-%d", wl, g.jobs[wl])
	}
	return wl
}

// archetypes are the workloads generated traces mix: the kinds of load the
// shipped family shows, with every size relative to the GPU and every
// instant drawn from the trace's seed.
var archetypes = []archetype{
	{"steady-service", true, func(f *family, g *generator) {
		f.service(fmt.Sprintf("svc%d", len(f.seq)), [][2]uint64{{0, f.share(0.04, 0.18)}})
	}},
	{"diurnal-service", true, func(f *family, g *generator) {
		wl := fmt.Sprintf("web%d", len(f.seq))
		night, day := f.share(0.03, 0.1), f.share(0.1, 0.22)
		var mem [][2]uint64
		for _, d := range g.days {
			on, off := d+time.Duration(7+f.rng.IntN(3))*time.Hour, d+time.Duration(17+f.rng.IntN(4))*time.Hour
			if d == 0 {
				mem = append(mem, [2]uint64{0, night})
			}
			mem = append(mem, [2]uint64{secs(on), day}, [2]uint64{secs(off), night})
		}
		f.service(wl, mem)
	}},
	{"leaky-service", true, func(f *family, g *generator) {
		// Grows from start by rate an hour and is restarted (a new pod)
		// every period; the restart is what bounds it.
		start, top := f.share(0.04, 0.1), f.share(0.3, 0.75)
		period := []time.Duration{12 * time.Hour, 24 * time.Hour, 27 * time.Hour}[f.rng.IntN(3)]
		rate := (top - start) / uint64(period/time.Hour)
		for at := time.Duration(0); at < f.duration; at += period {
			var mem [][2]uint64
			for k := time.Duration(0); k < period; k += time.Hour {
				mem = append(mem, [2]uint64{secs(k), start + uint64(k/time.Hour)*rate})
			}
			f.pod("leaky", at, period, mem)
		}
	}},
	{"crash-loop", true, func(f *family, g *generator) {
		// Loads, dies, backs off with a little memory held, loads again.
		load := f.share(0.08, 0.25)
		up, down := time.Duration(1+f.rng.IntN(5))*time.Minute, time.Duration(1+f.rng.IntN(5))*time.Minute
		start := time.Duration(f.rng.IntN(int(f.duration/time.Hour))) * time.Hour
		var mem [][2]uint64
		for k := time.Duration(0); k < f.duration-start; k += up + down {
			mem = append(mem, [2]uint64{secs(k), load}, [2]uint64{secs(k + up), 256 << 20})
		}
		f.pod("looper", start, f.duration-start, mem)
	}},
	{"burst", false, func(f *family, g *generator) {
		// Many small jobs of one to three workloads queued at once, at the
		// same hour every day or once.
		kinds := 1 + f.rng.IntN(3)
		type kind struct {
			wl     string
			lo, hi float64
			run    time.Duration
		}
		var ks []kind
		for k := range kinds {
			lo := 0.02 + 0.1*f.rng.Float64()
			ks = append(ks, kind{fmt.Sprintf("burst%d-%d", len(f.seq), k), lo, lo * (1 + f.rng.Float64()), time.Duration(5+f.rng.IntN(25)) * time.Minute})
		}
		n, gap := 10+f.rng.IntN(40), time.Duration(f.rng.IntN(20))*time.Second
		hour := time.Duration(f.rng.IntN(24)) * time.Hour
		days := g.days[:1]
		if f.rng.IntN(2) == 0 {
			days = g.days
		}
		for _, d := range days {
			for i := range n {
				k := ks[f.rng.IntN(len(ks))]
				peak := f.share(k.lo, k.hi)
				f.job(g.key(k.wl), d+hour+time.Duration(i)*gap, f.jitter(k.run, 0.3), peak/2, peak, time.Duration(10+f.rng.IntN(120))*time.Second)
			}
		}
	}},
	{"big-models", false, func(f *family, g *generator) {
		// One or two large models that run for hours, loading most of
		// their weights first.
		for range 1 + f.rng.IntN(2) {
			peak := f.share(0.2, 0.42)
			at := time.Duration(f.rng.Int64N(int64(f.duration * 3 / 4))).Truncate(time.Minute)
			f.job(g.key("llm"), at, f.jitter(5*time.Hour, 0.6), peak*3/5, peak, time.Duration(2+f.rng.IntN(8))*time.Minute)
		}
	}},
	{"office-stream", false, func(f *family, g *generator) {
		// Jobs of two to four workloads arriving through office hours on
		// workdays, or all day, at a random pace.
		kinds := 2 + f.rng.IntN(3)
		allDay := f.rng.IntN(3) == 0
		gap := time.Duration(5+f.rng.IntN(30)) * time.Minute
		base := len(f.seq)
		days := g.workdays
		if allDay {
			days = g.days
		}
		for _, d := range days {
			from, to := d+9*time.Hour, d+18*time.Hour
			if allDay {
				from, to = d, d+24*time.Hour
			}
			for t := from + f.jitter(gap, 0.9); t < to; t += f.jitter(gap, 0.9) {
				k := f.rng.IntN(kinds)
				lo := 0.02 + 0.04*float64(k)
				peak := f.share(lo, lo*2)
				f.job(g.key(fmt.Sprintf("stream%d-%d", base, k)), t, f.jitter(time.Duration(10+10*k)*time.Minute, 0.5),
					peak*2/5, peak, time.Duration(1+f.rng.IntN(5))*time.Minute)
			}
		}
	}},
	{"daily-job", false, func(f *family, g *generator) {
		// A large job at the same hour every workday: it returns, and
		// whatever it taught the tuner must still hold.
		peak := f.share(0.2, 0.42)
		hour := time.Duration(f.rng.IntN(24)) * time.Hour
		wl := fmt.Sprintf("daily%d", len(f.seq))
		for _, d := range g.workdays {
			f.job(g.key(wl), d+hour, f.jitter(2*time.Hour, 0.4), peak*3/5, peak, time.Duration(3+f.rng.IntN(8))*time.Minute)
		}
	}},
	{"strangers", false, func(f *family, g *generator) {
		// Ad hoc jobs, each its own workload, that start small and grow.
		at := time.Duration(f.rng.Int64N(int64(f.duration * 3 / 4))).Truncate(time.Minute)
		base := len(f.seq)
		for i := range 3 + f.rng.IntN(8) {
			peak := f.share(0.05, 0.3)
			f.job(fmt.Sprintf("adhoc%d-%d", base, i), at, f.jitter(time.Hour, 0.5), peak*2/5, peak, time.Duration(2+f.rng.IntN(9))*time.Minute)
			at += time.Duration(f.rng.IntN(40)) * time.Minute
		}
	}},
	// The archetypes below came with issue 21, which found the ones above
	// lacking the shapes homelab GPUs carry. Only seeds past classicSeeds
	// draw them (generated), so the first seeds' traces stay what they were.
	{"reserved-share", true, func(f *family, g *generator) {
		// A server that takes a fixed share of the card when it starts
		// (vLLM's gpu_memory_utilization) and holds it flat whatever its
		// load: the big pod beside which the small jobs deadlocked.
		f.service(fmt.Sprintf("vllm%d", len(f.seq)), [][2]uint64{{0, f.share(0.3, 0.6)}})
		f.pods[len(f.pods)-1].reserved = true
	}},
	{"on-demand-models", true, func(f *family, g *generator) {
		// One long-running server (Ollama) that holds its runtime, loads a
		// model when a request comes and unloads it after some idle
		// minutes (keep_alive): steps up and down several times a day in
		// one pod's timeline, never a new pod.
		base := f.share(0.01, 0.03)
		models := make([]uint64, 1+f.rng.IntN(3))
		for i := range models {
			models[i] = f.share(0.08, 0.3)
		}
		mem := [][2]uint64{{0, base}}
		for t := f.jitter(2*time.Hour, 0.9); t < f.duration; {
			mem = append(mem, [2]uint64{secs(t), base + models[f.rng.IntN(len(models))]})
			t += time.Duration(10+f.rng.IntN(80))*time.Minute + time.Duration(5+f.rng.IntN(6))*time.Minute // busy, then idle until unloaded
			if t >= f.duration {
				break
			}
			mem = append(mem, [2]uint64{secs(t), base})
			t += f.jitter(3*time.Hour, 0.8)
		}
		f.service(fmt.Sprintf("ollama%d", len(f.seq)), mem)
	}},
	{"scheduled-bursts", false, func(f *family, g *generator) {
		// A CronJob that starts 5-15 short jobs of one workload at once,
		// every hour or every few hours, all trace long: the issue's
		// flapping came from hourly bursts beside a steady server.
		wl := fmt.Sprintf("cron%d", len(f.seq))
		every := []time.Duration{time.Hour, time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour}[f.rng.IntN(5)]
		if f.duration > 48*time.Hour {
			every = max(every, 3*time.Hour) // a week of hourly bursts is thousands of pods for each replay
		}
		n, lo := 5+f.rng.IntN(11), 0.02+0.08*f.rng.Float64()
		run := time.Duration(2+f.rng.IntN(10)) * time.Minute
		for t := time.Duration(f.rng.IntN(60)) * time.Minute; t < f.duration; t += every {
			for range n {
				peak := f.share(lo, lo*1.3)
				f.job(g.key(wl), t, f.jitter(run, 0.4), peak/2, peak, time.Duration(10+f.rng.IntN(50))*time.Second)
			}
		}
	}},
	{"growing-service", true, func(f *family, g *generator) {
		// A service whose cache fills as the day goes: it rises in
		// half-hour steps for 4-16 hours, then stays flat, with no
		// restart to bring it down (unlike leaky-service).
		start, top := f.share(0.03, 0.08), f.share(0.12, 0.3)
		steps := 2 * (4 + f.rng.IntN(13))
		var mem [][2]uint64
		for k := range steps + 1 {
			mem = append(mem, [2]uint64{secs(time.Duration(k) * 30 * time.Minute), start + (top-start)*uint64(k)/uint64(steps)})
		}
		f.service(fmt.Sprintf("cache%d", len(f.seq)), mem)
	}},
	{"classroom", false, func(f *family, g *generator) {
		// A class's notebooks: 10-30 arrive between 09:00 and 10:00, each
		// starts its kernel, loads a model a few minutes later and holds
		// it for one to two hours. One to three images key them, or
		// nothing does (a bare pod per student), once or every workday.
		days := g.workdays
		if len(days) == 0 || f.rng.IntN(2) == 0 {
			days = g.days[:1]
		}
		type image struct{ lo, hi float64 }
		images := make([]image, 1+f.rng.IntN(3))
		for i := range images {
			lo := 0.03 + 0.05*f.rng.Float64()
			images[i] = image{lo, lo * 1.5}
		}
		keyless := f.rng.IntN(3) == 0
		base := len(f.seq)
		for _, d := range days {
			for range 10 + f.rng.IntN(21) {
				k := f.rng.IntN(len(images))
				peak := f.share(images[k].lo, images[k].hi)
				at := d + 9*time.Hour + time.Duration(f.rng.IntN(3600))*time.Second
				n := len(f.pods)
				f.job(g.key(fmt.Sprintf("nb%d-%d", base, k)), at, f.jitter(90*time.Minute, 0.33), peak/4, peak, time.Duration(2+f.rng.IntN(10))*time.Minute)
				if keyless && len(f.pods) > n {
					f.pods[n].keyless = true
				}
			}
		}
	}},
	{"mixed-sizes", false, func(f *family, g *generator) {
		// One workload whose jobs differ widely (a pipeline batching by
		// its input): 2-25 % of the card each, all trace long. Its record
		// has a spread no single size stands for.
		wl := fmt.Sprintf("mixed%d", len(f.seq))
		gap := time.Duration(10+f.rng.IntN(30)) * time.Minute
		if f.duration > 48*time.Hour {
			gap += 30 * time.Minute // bounds a week's pods
		}
		for t := f.jitter(gap, 0.9); t < f.duration; t += f.jitter(gap, 0.9) {
			peak := f.share(0.02, 0.25)
			f.job(g.key(wl), t, f.jitter(30*time.Minute, 0.6), peak/2, peak, time.Duration(1+f.rng.IntN(5))*time.Minute)
		}
	}},
}

// classicArchetypes are the archetypes before issue 21, the only ones the
// seeds up to classicSeeds draw: appending to archetypes changes
// rng.IntN(len(archetypes)), so without the split every earlier seed would
// become another trace and the old results and misses would name nothing.
const (
	classicArchetypes = 9
	classicSeeds      = 30
)

func secs(d time.Duration) uint64 { return uint64(d / time.Second) }

// generated builds the trace of one seed: a GPU of 12, 24, 48 or 80 GiB, an
// initial count, a duration from half a day to a week, and two to five
// archetypes, some workloads anonymous. Seeds up to classicSeeds draw from
// the classic archetypes only, with one trace in five anonymous, as before
// issue 21; later seeds draw their first archetype from the new ones and
// the others from all, with one trace in three anonymous, so that both
// kinds are well represented among the new shapes.
func generated(seed uint64) *family {
	rng := rand.New(rand.NewPCG(seed, 0x6a09e667f3bcc908))
	total := []uint64{gpu12, gpu24, gpu48, gpu80}[rng.IntN(4)]
	duration := []time.Duration{12 * time.Hour, 24 * time.Hour, 24 * time.Hour, 24 * time.Hour, 48 * time.Hour, 7 * 24 * time.Hour}[rng.IntN(6)]
	f := newFamily(fmt.Sprintf("gen-%d", seed), "", total, 1+rng.IntN(6), duration, seed)
	classic := seed <= classicSeeds
	g := &generator{jobs: map[string]int{}}
	if classic {
		g.anonymous = rng.IntN(5) == 0
	} else {
		g.anonymous = rng.IntN(3) == 0
	}
	for d := time.Duration(0); d < duration; d += 24 * time.Hour {
		g.days = append(g.days, d)
		if len(g.days)%7 != 6 && len(g.days)%7 != 0 { // a week starts on a Monday
			g.workdays = append(g.workdays, d)
		}
	}
	var picked []string
	for i := range 2 + rng.IntN(4) {
		var a archetype
		switch {
		case classic:
			a = archetypes[rng.IntN(classicArchetypes)]
		case i == 0:
			a = archetypes[classicArchetypes+rng.IntN(len(archetypes)-classicArchetypes)]
		default:
			a = archetypes[rng.IntN(len(archetypes))]
		}
		if (a.name == "leaky-service" || a.name == "reserved-share") && slices.Contains(picked, a.name) {
			continue // one to a GPU: two leaks, or two reservations, fill any card with services alone
		}
		picked = append(picked, a.name)
		from := len(f.pods)
		a.add(f, g)
		if a.resident {
			for i := from; i < len(f.pods); i++ {
				f.pods[i].resident = true
			}
		}
	}
	f.boundResidents(residentShare)
	if len(f.pods) == 0 {
		archetypes[0].add(f, g)
		picked = append(picked, archetypes[0].name)
	}
	f.about = fmt.Sprintf("seed %d: %.0f GiB, %d initial, %s, anonymous=%v: %s", seed, float64(total)/float64(gib), f.initial, duration, g.anonymous, strings.Join(picked, ", "))
	return f
}

// knownMisses are the generated traces, among the seeds TestCriterionGenerated
// replays by default, on which the tuner misses the bar (judge), each with
// the kind of miss that docs/tuner-policy.md ("Traces not seen") explains.
// Only a dominating static's shorter wait may be listed: a hard kind (an OOM
// after a raise, more OOMs than the initial count, a reversal, a pod never
// started that a static count starts, a loop eviction does not end) fails a
// seed whether listed or not. A seed listed here that meets the bar fails
// the test, as does a seed not listed that misses it: the list can only be
// shortened by a better tuner, never lengthened to make a test pass.
// -gen-report prints the list for the tuner as it stands.
var knownMisses = map[uint64]missKind{
	4:  missCrashLoop,
	5:  missStranger,
	7:  missLearning,
	9:  missRound,
	10: missStranger,
	14: missWait,
	15: missLearning,
	22: missStranger,
	27: missLearning, // met the bar until a burst of a workload never seen was learnt one pod at a time while another workload was being learnt too (TestLearningOnePodAtATime: held-out seed 66 OOMed 71 times, now 2)
	32: missStranger,
	38: missStranger,
	40: missWait, // a stranger until the classroom's keyless notebooks were keyed by their names' stem (NameStem)
	41: missRound,
	43: missRound,
	44: missLearning,
	46: missWait,
	48: missStranger,
	51: missRound,
	57: missStranger, // unsolved (an OOM after a raise) until strangers were priced by rank (rankPrice)
	58: missWait,
}

// unsolved are the seeds on which this tuner misses a hard bar: an OOM
// after a raise let more pods in. They are not excused: each is an open
// defect, named here with what happens, so that the test tells a seed
// that gets worse or better from one that stays as it is; a seed listed
// here that stops missing a hard bar fails the test until it is taken off.
// docs/tuner-policy.md ("Traces not seen") explains each.
var unsolved = map[uint64]string{
	24: "a crash-looping service on 24 GiB beside anonymous jobs: a raise for a stranger that then grows meets the looper's next load, and the looper OOMs in a loop (no eviction by default); the stranger comes as the recent job sizes fall to nine, so it is priced by bounded learning, not by rank",
	54: "an on-demand model server (Ollama-like) loads a model larger than any it loaded before, after a raise let a job in; the record had not seen that size",
}

// holdTo fails the seed's test unless its verdict is what the lists say:
// a hard miss only on a seed listed as unsolved, and that seed still
// missing by an OOM after a raise (what every unsolved seed misses by); a
// miss only on a seed listed as a known miss, of the kind listed, and that
// seed still missing the bar.
func (v verdict) holdTo(t *testing.T, seed uint64, known map[uint64]missKind, unsolved map[uint64]string) {
	t.Helper()
	why, listed := known[seed]
	listed = listed && !v.hard()
	switch {
	case unsolved[seed] != "" && slices.Contains(v.kinds(), missRaiseOOM):
		for _, m := range v.misses {
			t.Logf("unsolved (%s): %s", unsolved[seed], m.text)
		}
	case unsolved[seed] != "" && v.hard():
		t.Errorf("listed as unsolved (%s), by an OOM after a raise, but misses by %v now", unsolved[seed], v.kinds())
	case unsolved[seed] != "":
		t.Errorf("listed as unsolved (%s) but misses no hard bar now: take it off", unsolved[seed])
	case len(v.misses) > 0 && !listed:
		for _, m := range v.misses {
			t.Errorf("%s (%s)", m.text, m.kind.why)
		}
	case len(v.misses) > 0 && !slices.Contains(v.kinds(), why):
		for _, m := range v.misses {
			t.Errorf("listed as a known miss (%s) but misses by %s now: %s", why.name, m.kind.name, m.text)
		}
	case len(v.misses) > 0:
		for _, m := range v.misses {
			t.Logf("known miss (%s): %s", why.name, m.text)
		}
	case listed:
		t.Errorf("listed as a known miss (%s) but meets the bar: take it off", why.name)
	}
}

// knownMissesPlugin and unsolvedPlugin are knownMisses and unsolved for
// the tuner replayed in plugin mode (TestCriterionGeneratedPlugin): each
// change takes effect 10 s after it is decided, as gpuslice-plugin applies
// it and as simulate replays by default. knownMissesPlugin is knownMisses
// and the seeds that miss only in plugin mode, so a seed taken off
// knownMisses that still misses in plugin mode is named here. Like the
// instant lists, they may only shrink.
var knownMissesPlugin = func() map[uint64]missKind {
	m := maps.Clone(knownMisses)
	// They meet the bar in instant. On 23 a pod that came waits for a
	// raise where static:16 has a free replica; on 35 a scheduled burst
	// waits the raise's latency after the first window (190 pod-seconds)
	// where static:15 has its replicas free.
	m[23], m[35] = missRound, missRound
	return m
}()

var unsolvedPlugin = map[uint64]string{
	24: unsolved[24],
	33: "in the round a pod ended, its peak still in the ledger made every count from 13 up a near-certain OOM while a lowering was held for the round, and a raise 13 -> 14 came out cheaper by its patience alone; the card OOMed five minutes later (docs/tuner-policy.md: a raise only when it pays for itself, tried)",
	54: unsolved[54],
}

// TestCriterionGeneratedPlugin holds the tuner to the bar on the default
// generated seeds in plugin mode, the mode users of simulate see, against
// knownMissesPlugin and unsolvedPlugin. The tables in docs/tuner-policy.md
// are TestCriterionGenerated's, in instant mode.
func TestCriterionGeneratedPlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("replays every generated trace under 18 policies")
	}
	if *criterionMode == policy.ModePlugin || *genReport || *genFirst != 1 || *genSeeds != defaultGenSeeds {
		t.Skip("TestCriterionGenerated judges these seeds in this run")
	}
	for seed := uint64(1); seed <= defaultGenSeeds; seed++ {
		f := generated(seed)
		t.Run(f.name, func(t *testing.T) {
			tr, err := ParseTrace(f.name, f.yaml())
			if err != nil {
				t.Fatal(err)
			}
			v := judge(t, tr, policy.ModePlugin)
			t.Log(v.summary())
			v.holdTo(t, seed, knownMissesPlugin, unsolvedPlugin)
		})
	}
}

// TestCriterionGenerated holds the tuner to the bar (judge) on traces it
// was not tuned on: each seed builds a trace from the archetypes above.
// Over the default seeds it keeps the table in docs/tuner-policy.md
// (-update-docs rewrites it); -gen-seeds and -gen-first pick other seeds,
// -gen-dump writes the traces for `gpuslice-tuner simulate`, and
// -gen-report prints every seed's verdict and the knownMisses that fits the
// tuner as it stands (with -v), failing on nothing.
func TestCriterionGenerated(t *testing.T) {
	if testing.Short() {
		t.Skip("replays every generated trace under 18 policies")
	}
	defaults := *genFirst == 1 && *genSeeds == defaultGenSeeds
	var table, report, listed strings.Builder
	table.WriteString("| seed | trace | tuner OOMs (by a raise) | tuner pending pod-s (in the first window) | never started | changes (reversals) | with eviction: OOMs in a row (evictions) | best static with no more OOMs | the bar |\n")
	table.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	count := map[string]int{}
	met := 0
	for seed := *genFirst; seed < *genFirst+uint64(*genSeeds); seed++ {
		f := generated(seed)
		t.Run(f.name, func(t *testing.T) {
			data := f.yaml()
			if *genDump != "" {
				if err := os.WriteFile(filepath.Join(*genDump, f.name+".yaml"), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			tr, err := ParseTrace(f.name, data)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(f.about)
			v := judge(t, tr, *criterionMode)
			t.Log(v.summary())
			kinds := v.kinds()
			if *genReport {
				for _, m := range v.misses {
					t.Logf("%s: %s", m.kind.name, m.text)
				}
			} else if defaults {
				v.holdTo(t, seed, knownMisses, unsolved)
			} else {
				for _, m := range v.misses {
					t.Errorf("%s (%s)", m.text, m.kind.why)
				}
			}
			got := v.tuner
			best := "none"
			if b := v.best(); b > 0 {
				best = fmt.Sprintf("%d: %d / %.0f", b, v.static[b].OOMEvents, v.static[b].PodSecondsPending)
			}
			bar := "meets"
			var names []string
			for _, k := range kinds {
				names = append(names, k.name)
				count[k.name]++
			}
			switch {
			case len(kinds) == 0:
				met++
			case v.hard():
				bar = "misses: " + strings.Join(names, ", ")
				fmt.Fprintf(&listed, "\t// %d: %s (hard: cannot be listed)\n", seed, strings.Join(names, ", "))
			default:
				bar = "misses: " + kinds[0].why
				fmt.Fprintf(&listed, "\t%d: %s,\n", seed, kinds[0].name)
			}
			line := "meets"
			if len(names) > 0 {
				line = "misses " + strings.Join(names, ", ")
				if v.hard() {
					line += " (hard)"
				}
			}
			fmt.Fprintf(&report, "%s: %s\n", f.about, line)
			fmt.Fprintf(&table, "| %d | %s | %d (%d) | %.0f (%.0f) | %d | %d (%d) | %s | %s | %s |\n", seed, strings.TrimPrefix(f.about, fmt.Sprintf("seed %d: ", seed)),
				got.OOMEvents, got.RaiseOOMEvents, got.PodSecondsPending, got.PodSecondsPendingWarmup, got.PodsNeverStarted, got.ReplicaChanges, got.Reversals,
				v.evictCell(), best, bar)
		})
	}
	if *genReport {
		var kinds []string
		for k, n := range count {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		}
		slices.Sort(kinds)
		fmt.Printf("%s%d of %d seeds meet the bar; seeds per kind of miss (a seed may have several): %s\n\nvar knownMisses = map[uint64]missKind{\n%s}\n",
			report.String(), met, *genSeeds, strings.Join(kinds, ", "), listed.String())
		return
	}
	if defaults {
		docSection(t, "generated", table.String())
	}
}

package sim

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	genSeeds = flag.Int("gen-seeds", 30, "how many generated traces TestCriterionGenerated replays")
	genFirst = flag.Uint64("gen-first", 1, "the first seed TestCriterionGenerated replays")
	genDump  = flag.String("gen-dump", "", "write the generated traces as YAML into this folder, for simulate")
)

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
func (f *family) boundResidents(share float64) {
	peaks := map[string]uint64{} // a resident workload's pods are restarts of one service
	for _, p := range f.pods {
		if p.resident {
			for _, m := range p.memory {
				peaks[p.workload] = max(peaks[p.workload], m[1])
			}
		}
	}
	var sum uint64
	for _, p := range peaks {
		sum += p
	}
	limit := uint64(share * float64(f.total))
	if sum <= limit {
		return
	}
	for i := range f.pods {
		if f.pods[i].resident {
			for k := range f.pods[i].memory {
				f.pods[i].memory[k][1] = max(uint64(float64(f.pods[i].memory[k][1])*float64(limit)/float64(sum)), 256<<20)
			}
		}
	}
}

// generator holds what the archetypes of one generated trace share.
type generator struct {
	// anonymous leaves jobs without a workload key, as in the seed trace:
	// every pod is a stranger to the workload memory.
	anonymous bool
	// days are the trace's days; workdays those with office hours.
	days, workdays []time.Duration
}

// share is a size of fraction [lo, hi] of the GPU.
func (f *family) share(lo, hi float64) uint64 {
	return max(f.between(uint64(lo*float64(f.total)), uint64(hi*float64(f.total))), 256<<20)
}

// key is the workload key of a job of workload wl: wl itself, or, in an
// anonymous trace, nothing the next job shares.
func (g *generator) key(f *family, wl string) string {
	if g.anonymous {
		return fmt.Sprintf("%s-%d", wl, f.seq[wl]+1)
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
				f.job(g.key(f, k.wl), d+hour+time.Duration(i)*gap, f.jitter(k.run, 0.3), peak/2, peak, time.Duration(10+f.rng.IntN(120))*time.Second)
			}
		}
	}},
	{"big-models", false, func(f *family, g *generator) {
		// One or two large models that run for hours, loading most of
		// their weights first.
		for range 1 + f.rng.IntN(2) {
			peak := f.share(0.2, 0.42)
			at := time.Duration(f.rng.Int64N(int64(f.duration * 3 / 4))).Truncate(time.Minute)
			f.job(g.key(f, "llm"), at, f.jitter(5*time.Hour, 0.6), peak*3/5, peak, time.Duration(2+f.rng.IntN(8))*time.Minute)
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
				f.job(g.key(f, fmt.Sprintf("stream%d-%d", base, k)), t, f.jitter(time.Duration(10+10*k)*time.Minute, 0.5),
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
			f.job(g.key(f, wl), d+hour, f.jitter(2*time.Hour, 0.4), peak*3/5, peak, time.Duration(3+f.rng.IntN(8))*time.Minute)
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
}

func secs(d time.Duration) uint64 { return uint64(d / time.Second) }

// generated builds the trace of one seed: a GPU of 12, 24, 48 or 80 GiB, an
// initial count, a duration from half a day to a week, and two to five
// archetypes, some workloads anonymous.
func generated(seed uint64) *family {
	rng := rand.New(rand.NewPCG(seed, 0x6a09e667f3bcc908))
	total := []uint64{gpu12, gpu24, gpu48, gpu80}[rng.IntN(4)]
	duration := []time.Duration{12 * time.Hour, 24 * time.Hour, 24 * time.Hour, 24 * time.Hour, 48 * time.Hour, 7 * 24 * time.Hour}[rng.IntN(6)]
	f := newFamily(fmt.Sprintf("gen-%d", seed), "", total, 1+rng.IntN(6), duration, seed)
	g := &generator{anonymous: rng.IntN(5) == 0}
	for d := time.Duration(0); d < duration; d += 24 * time.Hour {
		g.days = append(g.days, d)
		if len(g.days)%7 != 6 && len(g.days)%7 != 0 { // a week starts on a Monday
			g.workdays = append(g.workdays, d)
		}
	}
	var picked []string
	for range 2 + rng.IntN(4) {
		a := archetypes[rng.IntN(len(archetypes))]
		if a.name == "leaky-service" && slices.Contains(picked, a.name) {
			continue // one leak to a GPU: two leaks fill any card with services alone
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
// replays by default, on which the tuner misses issue 12's bar, each with
// the kind of miss that docs/tuner-policy.md ("Traces not seen") explains.
// A seed listed here that meets the bar fails the test, as does a seed not
// listed that misses it: the list can only be shortened by a better tuner,
// never lengthened to make a test pass.
var knownMisses = map[uint64]string{
	1:  missRound,
	4:  missCrashLoop,
	5:  missStranger,
	7:  missLearning,
	9:  missRound,
	10: missStranger,
	14: missRound,
	15: missLearning,
	16: missStranger,
	20: missRound,
	22: missStranger,
	23: missLearning,
	27: missLearning,
}

// The kinds of miss (docs/tuner-policy.md, "Traces not seen").
const (
	missRound     = "a round's wait: no spare was backed where the count had a free replica"
	missLearning  = "learning: a burst of workloads never seen waits for its first pods to show their size"
	missStranger  = "a stranger priced at the largest pod running: it was smaller"
	missCrashLoop = "the operator's count crash-loops before any evidence, as static does, and waits more after"
)

// TestCriterionGenerated holds the tuner to issue 12's bar (judge) on
// traces it was not tuned on: each seed builds a trace from the archetypes
// above. Over the default seeds it keeps the table in docs/tuner-policy.md
// (-update-docs rewrites it); -gen-seeds and -gen-first pick other seeds,
// -gen-dump writes the traces for `gpuslice-tuner simulate`.
func TestCriterionGenerated(t *testing.T) {
	if testing.Short() {
		t.Skip("replays every generated trace under 17 policies")
	}
	defaults := *genFirst == 1 && *genSeeds == 30
	var table strings.Builder
	table.WriteString("| seed | trace | tuner OOMs (by a raise) | tuner pending pod-s (in the first window) | never started | changes | best static with no more OOMs | the bar |\n")
	table.WriteString("|---|---|---|---|---|---|---|---|\n")
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
			v := judge(t, tr)
			t.Log(v.summary())
			why, known := knownMisses[seed]
			// A listed seed may miss on waiting only: OOMs after a raise,
			// or more than the initial count has, fail it like any other.
			if init := v.static[min(tr.InitialReplicas, 16)]; v.tuner.RaiseOOMEvents > 0 || v.tuner.OOMEvents > init.OOMEvents {
				known = false
			}
			switch {
			case len(v.misses) > 0 && !(known && defaults):
				for _, m := range v.misses {
					t.Error(m)
				}
			case len(v.misses) > 0:
				for _, m := range v.misses {
					t.Logf("known miss (%s): %s", why, m)
				}
			case known && defaults:
				t.Errorf("listed as a known miss (%s) but meets the bar: take it off knownMisses", why)
			}
			got := v.tuner
			best := "none"
			if b := v.best(); b > 0 {
				best = fmt.Sprintf("%d: %d / %.0f", b, v.static[b].OOMEvents, v.static[b].PodSecondsPending)
			}
			bar := "meets"
			if len(v.misses) > 0 {
				bar = "misses: " + why
			}
			fmt.Fprintf(&table, "| %d | %s | %d (%d) | %.0f (%.0f) | %d | %d | %s | %s |\n", seed, strings.TrimPrefix(f.about, fmt.Sprintf("seed %d: ", seed)),
				got.OOMEvents, got.RaiseOOMEvents, got.PodSecondsPending, got.PodSecondsPendingWarmup, got.PodsNeverStarted, got.ReplicaChanges, best, bar)
		})
	}
	if defaults {
		docSection(t, "generated", table.String())
	}
}

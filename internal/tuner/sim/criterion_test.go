package sim

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

var (
	updateDocs = flag.Bool("update-docs", false, "rewrite the criterion tables in docs/tuner-policy.md")
	// criterionMode is the apply mode the tuner is judged in. The tables
	// and knownMisses are instant's (a change applies at once); simulate's
	// own default is plugin, whose 10 s latency the tuner meets fewer
	// seeds in (docs/tuner-policy.md, "Judged in plugin mode").
	criterionMode = flag.String("criterion-mode", policy.ModeInstant, "the apply mode the tuner is replayed in (static counts never change, so none matters to them); the knownMisses and tables are instant's")
)

// docsPath is docs/tuner-policy.md, which keeps the criterion tables.
var docsPath = filepath.Join("..", "..", "..", "docs", "tuner-policy.md")

// docSection checks that the part of docs/tuner-policy.md between the lines
// "<!-- begin name -->" and "<!-- end name -->" is want, or, with
// -update-docs, rewrites it: the tables there are this test's output, and a
// stale one fails.
func docSection(t *testing.T, name, want string) {
	t.Helper()
	data, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- begin "+name+" -->\n", "<!-- end "+name+" -->"
	i, j := strings.Index(string(data), begin), strings.Index(string(data), end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q section", docsPath, strings.TrimSpace(begin), end)
	}
	got := string(data[i+len(begin) : j])
	if got == want {
		return
	}
	if !*updateDocs {
		t.Errorf("the %s table in %s is stale: run go test ./internal/tuner/sim -run %s -update-docs", name, docsPath, t.Name())
		return
	}
	out := string(data[:i+len(begin)]) + want + string(data[j:])
	if err := os.WriteFile(docsPath, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
}

// verdict is one trace replayed under the tuner with its defaults, under
// the tuner with crash-loop eviction on, and under every static count
// 1..16, judged by issue 12's bar and issue 21's additions.
type verdict struct {
	tuner *Result
	// evict is the tuner with Config.EvictCrashLoops: only the bar on OOMs
	// in a row applies to it (eviction is opt-in, the defaults are judged
	// whole above).
	evict  *Result
	static [17]*Result
	// misses are the ways the tuner failed the bar.
	misses []miss
	// dominating are the static counts that dominate the tuner.
	dominating map[int]bool
}

// miss is one way a replay failed the bar: its kind, and a sentence with
// the numbers.
type miss struct {
	kind missKind
	text string
}

// missKind names a kind of miss: name is its Go identifier (for the list
// -gen-report prints), why what it means (docs/tuner-policy.md, "Traces not
// seen"). A hard kind breaks a bar no trace may break, so it is never
// listed as known; the others are a dominating static's shorter wait.
type missKind struct {
	name, why string
	hard      bool
}

// The kinds of miss. judge finds the hard ones from the results alone and
// classifies a domination by where the tuner's extra wait went (classify).
var (
	missRaiseOOM     = missKind{"missRaiseOOM", "an OOM after a raise let more pods in", true}
	missMoreOOMs     = missKind{"missMoreOOMs", "more OOMs than leaving the initial count alone", true}
	missReversal     = missKind{"missReversal", "a change undone within its settle time with no OOM between", true}
	missNeverStarted = missKind{"missNeverStarted", "pods never started where a static count starts them all with no OOM", true}
	missEvictRow     = missKind{"missEvictRow", "with eviction on, a container OOMed more than twice in a row", true}
	missRound        = missKind{"missRound", "a round's wait: no spare was backed where the count had a free replica", false}
	missLearning     = missKind{"missLearning", "learning: a burst of workloads never seen waits for its first pods to show their size", false}
	missStranger     = missKind{"missStranger", "strangers (workloads of one pod) carry most of the extra wait: priced from the node's sizes, they took less", false}
	missCrashLoop    = missKind{"missCrashLoop", "the operator's count crash-loops before any evidence, as static does, and waits more after", false}
	missWait         = missKind{"missWait", "waits more: the count stayed below what known workloads needed", false}
)

// maxInARow is the most OOM events, one after another, that a container
// may have with eviction on: the config evicts after the second, so a third
// means the loop was not ended.
const maxInARow = 2

// judge replays tr and judges the tuner by issue 12's bar:
//   - no OOM event that a raise let happen (more pods held replicas than
//     the count before the tuner's latest raise allowed);
//   - no more OOM events than leaving the initial count alone;
//   - no static count 1..16, chosen in hindsight, with both no more OOM
//     events and less pending pod-time;
//
// and by issue 21's:
//   - no reversal (a change undone within its settle time with no OOM
//     between: Result.Reversals);
//   - no pod never started where some static count 1..16 starts every pod
//     with no OOM (a deadlock: the count held pods out that fit);
//   - with eviction on (a second replay, Config.EvictCrashLoops), no
//     container with more than maxInARow OOMs in a row; the replay's OOMs
//     are all of a full GPU, as the bar asks.
//
// The tuner's pending time before its first full window is left out of the
// domination: a count chosen in hindsight knows the trace from 0s, while
// the tuner may not act before it has watched a window (queue.yaml's
// twelve pods at 0s could never be matched otherwise). Only the first
// window is left out; the time it takes to learn a workload that arrives
// later is counted in full.
func judge(t *testing.T, tr *Trace, mode string) verdict {
	t.Helper()
	cfg := policy.DefaultConfig()
	v := verdict{tuner: mustRunIn(t, tr, Tuner{Config: cfg}, mode), dominating: map[int]bool{}}
	cfg.EvictCrashLoops = true
	v.evict = mustRunIn(t, tr, Tuner{Config: cfg}, mode)
	for n := 1; n <= 16; n++ {
		v.static[n] = mustRun(t, tr, Static{Replicas: n})
	}
	v.check(tr)
	return v
}

// check finds v's misses from its replays of tr (judge).
func (v *verdict) check(tr *Trace) {
	got := v.tuner
	if got.RaiseOOMEvents > 0 {
		v.add(missRaiseOOM, "%d of the tuner's %d OOM events came after a raise let more pods in", got.RaiseOOMEvents, got.OOMEvents)
	}
	if init := v.static[min(tr.InitialReplicas, 16)]; got.OOMEvents > init.OOMEvents {
		v.add(missMoreOOMs, "tuner: %d OOM events, leaving the initial %d replicas alone: %d", got.OOMEvents, tr.InitialReplicas, init.OOMEvents)
	}
	if got.Reversals > 0 {
		v.add(missReversal, "tuner: %d of its %d changes undid the one before within its settle time with no OOM between", got.Reversals, got.ReplicaChanges)
	}
	if n := v.startsAll(); n > 0 && got.PodsNeverStarted > 0 {
		v.add(missNeverStarted, "tuner: %d pods never started, static:%d starts every pod with no OOM", got.PodsNeverStarted, n)
	}
	if e := v.evict; e.MaxOOMsInARow > maxInARow {
		v.add(missEvictRow, "tuner with eviction on: a container OOMed %d times in a row (%d evictions, %d OOM events)", e.MaxOOMsInARow, e.Evictions, e.OOMEvents)
	}
	for n := 1; n <= 16; n++ {
		s := v.static[n]
		if s.OOMEvents <= got.OOMEvents && s.PodSecondsPending < got.PodSecondsPending-got.PodSecondsPendingWarmup {
			v.dominating[n] = true
		}
	}
	if len(v.dominating) > 0 {
		var ns []string
		for n := 1; n <= 16; n++ {
			if v.dominating[n] {
				ns = append(ns, fmt.Sprint(n))
			}
		}
		b := v.best()
		v.add(v.classify(tr, b), "static:%s dominate(s) the tuner; static:%d: %d OOM events and %.0f pod-s pending against %d and %.0f (%.0f in the first window)",
			strings.Join(ns, ","), b, v.static[b].OOMEvents, v.static[b].PodSecondsPending, got.OOMEvents, got.PodSecondsPending, got.PodSecondsPendingWarmup)
	}
}

func (v *verdict) add(k missKind, format string, args ...any) {
	v.misses = append(v.misses, miss{kind: k, text: fmt.Sprintf(format, args...)})
}

// startsAll is the smallest static count that starts every pod with no OOM
// event, or 0.
func (v verdict) startsAll() int {
	for n := 1; n <= 16; n++ {
		if s := v.static[n]; s.PodsNeverStarted == 0 && s.OOMEvents == 0 {
			return n
		}
	}
	return 0
}

// roundWait is the most extra wait per delayed pod that classify puts down
// to the tuner's rounds: two sampling intervals.
const roundWait = 2 * 15 * time.Second

// classify says why static:b waits less than the tuner, from where the
// tuner's extra wait went, pod by pod: a loop the tuner let run (more than
// maxInARow OOMs in a row) is a crash loop; a few seconds per delayed pod
// is a round's wait; otherwise the kind of pod that carries most of it: a
// stranger (the only pod of its workload), a pod that arrived while its
// workload was still being learnt (before its first pod had run a window),
// or a pod of a workload already known.
func (v verdict) classify(tr *Trace, b int) missKind {
	if v.tuner.MaxOOMsInARow > maxInARow {
		return missCrashLoop
	}
	tw, sw := v.tuner.waits, v.static[b].waits
	count := map[string]int{}
	learnt := map[string]time.Duration{} // when a workload's first pod had run a window under the tuner
	window := policy.DefaultConfig().Window
	for i, p := range tr.Pods {
		count[p.Workload]++
		if at, ok := learnt[p.Workload]; !ok || p.Arrive+tw[i]+window < at {
			learnt[p.Workload] = p.Arrive + tw[i] + window
		}
	}
	var extra [3]time.Duration // stranger, learning, known
	var total time.Duration
	delayed := 0
	for i, p := range tr.Pods {
		// The first window's wait is excused in the domination, so it is
		// not what the tuner lost.
		d := p.Arrive + tw[i] - max(p.Arrive, window) - sw[i]
		if d <= 0 {
			continue
		}
		delayed++
		total += d
		switch {
		case count[p.Workload] == 1:
			extra[0] += d
		case p.Arrive < learnt[p.Workload]:
			extra[1] += d
		default:
			extra[2] += d
		}
	}
	switch {
	case delayed == 0 || total/time.Duration(delayed) <= roundWait:
		return missRound
	case extra[0] >= extra[1] && extra[0] >= extra[2]:
		return missStranger
	case extra[1] >= extra[2]:
		return missLearning
	}
	return missWait
}

// kinds are the distinct kinds of v's misses, in the order found.
func (v verdict) kinds() []missKind {
	var ks []missKind
	for _, m := range v.misses {
		if !slices.Contains(ks, m.kind) {
			ks = append(ks, m.kind)
		}
	}
	return ks
}

// hard says v has a miss no known-miss list may excuse.
func (v verdict) hard() bool {
	return slices.ContainsFunc(v.misses, func(m miss) bool { return m.kind.hard })
}

// best is the static count with the least pending time among those with no
// more OOM events than the tuner (0 when none has).
func (v verdict) best() int {
	b := 0
	for n := 1; n <= 16; n++ {
		if s := v.static[n]; s.OOMEvents <= v.tuner.OOMEvents && (b == 0 || s.PodSecondsPending < v.static[b].PodSecondsPending) {
			b = n
		}
	}
	return b
}

func (v verdict) summary() string {
	got, e := v.tuner, v.evict
	s := fmt.Sprintf("tuner: %d OOM events (%d after a raise), %.0f pod-s pending (%.0f in the first window), %d never started, %d changes (%d reversals), replicas %d-%d; with eviction: %d in a row at most, %d evictions, %d OOM events",
		got.OOMEvents, got.RaiseOOMEvents, got.PodSecondsPending, got.PodSecondsPendingWarmup, got.PodsNeverStarted, got.ReplicaChanges, got.Reversals, got.MinReplicas, got.MaxReplicas,
		e.MaxOOMsInARow, e.Evictions, e.OOMEvents)
	if b := v.best(); b > 0 {
		s += fmt.Sprintf("; best static with no more OOMs: static:%d, %d OOM events, %.0f pod-s pending", b, v.static[b].OOMEvents, v.static[b].PodSecondsPending)
	}
	return s
}

// evictCell is the eviction replay's column: the most OOMs in a row, then
// the evictions.
func (v verdict) evictCell() string {
	return fmt.Sprintf("%d (%d)", v.evict.MaxOOMsInARow, v.evict.Evictions)
}

// row is the trace's line of the table in docs/tuner-policy.md.
func (v verdict) row(name string) string {
	got := v.tuner
	row := fmt.Sprintf("| `%s` | %d (%d) | %.0f (%.0f) | %d | %d (%d) | %s |", name, got.OOMEvents, got.RaiseOOMEvents, got.PodSecondsPending,
		got.PodSecondsPendingWarmup, got.PodsNeverStarted, got.ReplicaChanges, got.Reversals, v.evictCell())
	for n := 1; n <= 16; n++ {
		mark := ""
		if v.dominating[n] {
			mark = " **dominates**"
		}
		row += fmt.Sprintf(" %d / %.0f%s |", v.static[n].OOMEvents, v.static[n].PodSecondsPending, mark)
	}
	return row + "\n"
}

// tableHead is the head of the criterion tables.
func tableHead() string {
	var b strings.Builder
	b.WriteString("| trace | tuner OOMs (by a raise) | tuner pending pod-s (in the first window) | never started | changes (reversals) | with eviction: OOMs in a row (evictions) |")
	for n := 1; n <= 16; n++ {
		fmt.Fprintf(&b, " %d |", n)
	}
	b.WriteString("\n|---|---|---|---|---|---|" + strings.Repeat("---|", 16) + "\n")
	return b.String()
}

// TestCriterion holds the tuner with its defaults to issue 12's bar and
// issue 21's additions (judge) on every trace under test/traces, and keeps the table of the results in
// docs/tuner-policy.md (-update-docs rewrites it).
// shippedMisses are the shipped traces on which the tuner is dominated by
// a static count chosen in hindsight, with why (docs/tuner-policy.md).
// Only a shorter wait may be listed, never a hard bar; a listed trace that
// meets the bar fails the test, so the list can only shrink.
var shippedMisses = map[string]string{
	"family-12g-night-burst": "learning: the burst's two workloads are learnt one pod at a time, a window each, while static:5 runs them from 01:00",
	"issue21-24g-margin":     "waits more: the first job waits until the tuner has learnt what a job needs (two 10 GiB models are all it has seen); then it holds 3 like static:3",
}

// shippedTraces are the names of the shipped traces (testdata/traces, the
// file name without .yaml), in file order.
func shippedTraces(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob(tracePath("*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no traces under %s: %v", tracePath(""), err)
	}
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = strings.TrimSuffix(filepath.Base(p), ".yaml")
	}
	return names
}

func TestCriterion(t *testing.T) {
	var table strings.Builder
	table.WriteString(tableHead())
	for _, name := range shippedTraces(t) {
		t.Run(name, func(t *testing.T) {
			v := judge(t, mustRead(t, name+".yaml"), *criterionMode)
			why, known := shippedMisses[name]
			known = known && !v.hard()
			switch {
			case len(v.misses) > 0 && known:
				for _, m := range v.misses {
					t.Logf("known miss (%s): %s", why, m.text)
				}
			case len(v.misses) > 0:
				for _, m := range v.misses {
					t.Errorf("%s (%s)", m.text, m.kind.why)
				}
			case known:
				t.Errorf("listed in shippedMisses (%s) but meets the bar: take it off", why)
			}
			t.Log(v.summary())
			table.WriteString(v.row(name))
		})
	}
	docSection(t, "criterion", table.String())
}

// TestCriterionPlugin holds the tuner to the same bar on every shipped
// trace in plugin mode, the one simulate replays by default and
// gpuslice-plugin applies in: each change takes effect 10 s after it is
// decided. A miss listed in shippedMisses may stay a miss here, but no
// other trace may miss, and no hard bar may be missed. The generated seeds
// are judged in plugin mode by TestCriterionGeneratedPlugin, against lists
// of their own (the tuner meets fewer of them there, docs/tuner-policy.md).
func TestCriterionPlugin(t *testing.T) {
	if *criterionMode == policy.ModePlugin {
		t.Skip("TestCriterion judges plugin mode in this run")
	}
	for _, name := range shippedTraces(t) {
		t.Run(name, func(t *testing.T) {
			v := judge(t, mustRead(t, name+".yaml"), policy.ModePlugin)
			why, known := shippedMisses[name]
			for _, m := range v.misses {
				if known && !v.hard() {
					t.Logf("known miss (%s): %s", why, m.text)
					continue
				}
				t.Errorf("%s (%s)", m.text, m.kind.why)
			}
			t.Log(v.summary())
		})
	}
}

package sim

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

var printTable = flag.Bool("table", false, "print docs/tuner-policy.md's table of tuner vs every static count")

// TestCriterion holds the tuner with its defaults to issue 12's bar on every
// trace under test/traces: no OOM that a raise let happen, no more OOMs than
// leaving the initial count alone, and no static count 1..16 chosen in
// hindsight with both no more OOMs and less pending pod-time.
//
// The tuner's pending time before its first full window is left out of the
// last comparison: a count chosen in hindsight knows the trace from 0s,
// while the tuner may not act before it has watched a window (queue.yaml's
// twelve pods at 0s could never be matched otherwise). Only the first
// window is left out; the time it takes to learn a workload that arrives
// later is counted in full.
//
// Traces under test/traces/open are the ones the tuner does not meet the bar
// on yet: they are replayed and reported, not asserted, and belong in
// test/traces once they pass. With -table it prints the table kept in
// docs/tuner-policy.md.
func TestCriterion(t *testing.T) {
	shipped, err := filepath.Glob(tracePath("*.yaml"))
	if err != nil || len(shipped) == 0 {
		t.Fatalf("no traces under %s: %v", tracePath(""), err)
	}
	open, err := filepath.Glob(tracePath(filepath.Join("open", "*.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	table.WriteString("| trace | tuner OOMs (by a raise) | tuner pending pod-s (in the first window) |")
	for n := 1; n <= 16; n++ {
		fmt.Fprintf(&table, " %d |", n)
	}
	table.WriteString("\n|---|---|---|" + strings.Repeat("---|", 16) + "\n")
	for _, path := range append(shipped, open...) {
		isOpen := filepath.Base(filepath.Dir(path)) == "open"
		name := strings.TrimSuffix(filepath.Base(path), ".yaml")
		if isOpen {
			name = "open/" + name
		}
		t.Run(name, func(t *testing.T) {
			miss := t.Errorf
			if isOpen {
				miss = t.Logf
			}
			table.WriteString(criterionRow(t, path, name, miss))
		})
	}
	if *printTable {
		fmt.Fprint(os.Stdout, table.String())
	}
}

// criterionRow replays one trace under the tuner and every static count,
// reports each miss of the bar through miss, and returns the table row.
func criterionRow(t *testing.T, path, name string, miss func(string, ...any)) string {
	tr, err := ReadTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	got := mustRun(t, tr, Tuner{Config: policy.DefaultConfig()})
	var static [17]*Result
	for n := 1; n <= 16; n++ {
		static[n] = mustRun(t, tr, Static{Replicas: n})
	}
	if got.RaiseOOMEvents > 0 {
		miss("%d of the tuner's %d OOM events came after a raise let more pods in", got.RaiseOOMEvents, got.OOMEvents)
	}
	if init := static[min(tr.InitialReplicas, 16)]; got.OOMEvents > init.OOMEvents {
		miss("tuner: %d OOM events, leaving the initial %d replicas alone: %d", got.OOMEvents, tr.InitialReplicas, init.OOMEvents)
	}
	row := fmt.Sprintf("| `%s` | %d (%d) | %.0f (%.0f) |", name, got.OOMEvents, got.RaiseOOMEvents, got.PodSecondsPending, got.PodSecondsPendingWarmup)
	for n := 1; n <= 16; n++ {
		s := static[n]
		mark := ""
		if s.OOMEvents <= got.OOMEvents && s.PodSecondsPending < got.PodSecondsPending-got.PodSecondsPendingWarmup {
			miss("static:%d dominates the tuner: %d OOM events and %.0f pod-s pending against %d and %.0f",
				n, s.OOMEvents, s.PodSecondsPending, got.OOMEvents, got.PodSecondsPending)
			mark = " **dominates**"
		}
		row += fmt.Sprintf(" %d / %.0f%s |", s.OOMEvents, s.PodSecondsPending, mark)
	}
	t.Logf("tuner: %d OOM events (%d after a raise), %.0f pod-s pending, %d changes, replicas %d-%d",
		got.OOMEvents, got.RaiseOOMEvents, got.PodSecondsPending, got.ReplicaChanges, got.MinReplicas, got.MaxReplicas)
	return row + "\n"
}

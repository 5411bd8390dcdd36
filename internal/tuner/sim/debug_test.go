package sim

import (
	"flag"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

var (
	replayTrace = flag.String("replay", "", "trace to replay under the tuner, printing every decision in [replay-from, replay-to]")
	replayFrom  = flag.Duration("replay-from", 0, "the first instant -replay prints")
	replayTo    = flag.Duration("replay-to", 0, "the last instant -replay prints (0: the trace's end)")
	replayVs    = flag.Int("replay-vs", 0, "with -replay, compare each pod's wait with static:N's")
	replayPods  = flag.Bool("replay-pods", false, "with -replay, list the containers of each sample printed")
	replayMode  = flag.String("replay-mode", policy.ModeInstant, "with -replay, the apply mode replayed (the criterion's default instant; simulate's plugin)")
	judgeGlob   = flag.String("judge", "", "traces (a glob) for TestJudge to judge as the criterion does, in -criterion-mode")
)

// tracer is the tuner, printing what it saw and decided.
type tracer struct{ Tuner }

func (d tracer) Round(obs policy.Observation) (policy.Decision, policy.Memory) {
	dec, mem := d.Tuner.Round(obs)
	at := obs.Now.Sub(Epoch)
	if at < *replayFrom || at > *replayTo {
		return dec, mem
	}
	s := obs.GPUs[0].Samples[len(obs.GPUs[0].Samples)-1]
	var q []string
	for _, p := range obs.Pending {
		w := mem.Workloads[p.Workload]
		q = append(q, fmt.Sprintf("%s(%.1f GiB, known %v, pods %d mean %.1f)", p.Workload, float64(w.PeakBytes)/float64(gib), w.Known(d.Config), w.Pods, w.MeanPeak/float64(gib)))
	}
	if len(q) > 6 {
		q = append(q[:6], fmt.Sprintf("+%d", len(q)-6))
	}
	fmt.Printf("%s cur=%d alloc=%d used=%.1f GiB base=%d -> %d %s: %s | waiting %v\n", at, obs.CurrentReplicas, s.ReplicasAllocated,
		float64(s.MemoryUsedBytes)/float64(gib), mem.Base, dec.Replicas, dec.Reason, dec.Message, q)
	if *replayPods {
		for c, p := range s.ContainerPeaks {
			cm := mem.Containers[c]
			fmt.Printf("    %-24s %5.1f GiB, age %s, own peak %.1f GiB, known %v\n", c, float64(p)/float64(gib),
				obs.Now.Sub(cm.FirstSeen), float64(cm.PeakBytes)/float64(gib), mem.Workloads[obs.ContainerWorkloads[c]].Known(d.Config))
		}
	}
	return dec, mem
}

// TestReplay is a tool, not a test: with -replay it prints the tuner's
// decisions on a trace, and with -replay-vs N each pod whose wait differs
// from static:N's.
//
//	go test ./internal/tuner/sim -run TestReplay -v -args -replay /abs/trace.yaml -replay-from 1h -replay-to 2h -replay-vs 5
func TestReplay(t *testing.T) {
	if *replayTrace == "" {
		t.Skip("a tool: set -replay")
	}
	tr, err := ReadTrace(*replayTrace)
	if err != nil {
		t.Fatal(err)
	}
	if *replayTo == 0 {
		*replayTo = tr.Duration
	}
	r := mustRunIn(t, tr, tracer{Tuner{policy.DefaultConfig()}}, *replayMode)
	fmt.Printf("tuner: %d OOM events (%d after a raise), %.0f pod-s pending, %d never started, %d changes\n",
		r.OOMEvents, r.RaiseOOMEvents, r.PodSecondsPending, r.PodsNeverStarted, r.ReplicaChanges)
	if *replayVs > 0 {
		s := mustRun(t, tr, Static{*replayVs})
		for i, p := range tr.Pods {
			if r.waits[i] != s.waits[i] {
				fmt.Printf("%-24s arrives %-10s waits %-10s static:%d %s\n", p.Name, p.Arrive, r.waits[i], *replayVs, s.waits[i])
			}
		}
	}
}

// TestJudge is a tool, not a test: with -judge it holds every trace the
// glob matches to the criterion's bar (judge, in -criterion-mode) and
// prints each one's numbers and its first miss, for traces that are not
// shipped: a family of one's own, a user's recording.
//
//	go test ./internal/tuner/sim -run TestJudge -v -args -judge '/abs/traces/*.yaml' -criterion-mode plugin
func TestJudge(t *testing.T) {
	if *judgeGlob == "" {
		t.Skip("a tool: set -judge")
	}
	paths, err := filepath.Glob(*judgeGlob)
	if err != nil || len(paths) == 0 {
		t.Fatalf("-judge %s matches no trace: %v", *judgeGlob, err)
	}
	for _, p := range paths {
		tr, err := ReadTrace(p)
		if err != nil {
			t.Fatal(err)
		}
		v := judge(t, tr, *criterionMode)
		r, verdict := v.tuner, "meets the bar"
		if len(v.misses) > 0 {
			verdict = v.misses[0].kind.name + ": " + v.misses[0].text
		}
		fmt.Printf("%s: %d OOM events (%d after a raise), %.0f pod-s pending, %d never started, %d changes (%d reversals) | %s\n",
			filepath.Base(p), r.OOMEvents, r.RaiseOOMEvents, r.PodSecondsPending, r.PodsNeverStarted, r.ReplicaChanges, r.Reversals, verdict)
	}
}

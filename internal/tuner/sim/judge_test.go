package sim

import (
	"slices"
	"testing"
	"time"
)

// TestJudgeBars checks that each bar of judge fires, and that a
// domination is classified by where the extra wait went, on replays made
// up by hand: the tuner passes most of them today, so the generated family
// alone would not show that a bar works.
func TestJudgeBars(t *testing.T) {
	h, m := time.Hour, time.Minute
	pod := func(name, wl string, at time.Duration) Pod {
		return Pod{Name: name, Workload: wl, Arrive: at, Run: h, Memory: []MemoryStep{{At: 0, Bytes: gib}}}
	}
	// a is a stranger; b2 comes when b is known; c2 while c is learnt.
	tr := &Trace{MemoryTotalBytes: 8 * gib, InitialReplicas: 2, Duration: 6 * h, Pods: []Pod{
		pod("a", "a", h), pod("b1", "b", h), pod("b2", "b", 3*h), pod("c1", "c", h), pod("c2", "c", h+m),
	}}
	secs := func(s ...int) []time.Duration {
		out := make([]time.Duration, len(s))
		for i, v := range s {
			out[i] = time.Duration(v) * time.Second
		}
		return out
	}
	// base: the tuner waits 100 pod-s in all, every static count waits
	// far more, nothing else happens.
	base := func() verdict {
		v := verdict{tuner: &Result{PodSecondsPending: 100, waits: secs(100, 0, 0, 0, 0)}, evict: &Result{}, dominating: map[int]bool{}}
		for n := 1; n <= 16; n++ {
			v.static[n] = &Result{PodSecondsPending: 1e6, PodsNeverStarted: 1, waits: secs(1e5, 1e5, 1e5, 1e5, 1e5)}
		}
		return v
	}
	// dominated has static:4 wait nothing, the tuner waits.
	dominated := func(v *verdict, waits ...int) {
		v.static[4] = &Result{waits: secs(0, 0, 0, 0, 0)}
		v.tuner.waits = secs(waits...)
		v.tuner.PodSecondsPending = 0
		for _, w := range waits {
			v.tuner.PodSecondsPending += float64(w)
		}
	}
	for _, tc := range []struct {
		name string
		edit func(v *verdict)
		want []missKind
	}{
		{"meets", func(*verdict) {}, nil},
		{"reversal", func(v *verdict) { v.tuner.Reversals = 1 }, []missKind{missReversal}},
		{"never started where static:3 starts all", func(v *verdict) {
			v.tuner.PodsNeverStarted = 1
			v.static[3].PodsNeverStarted = 0
		}, []missKind{missNeverStarted}},
		{"never started where every static leaves one out", func(v *verdict) { v.tuner.PodsNeverStarted = 1 }, nil},
		{"never started where the static that starts all OOMs", func(v *verdict) {
			v.tuner.PodsNeverStarted = 1
			v.static[3].PodsNeverStarted, v.static[3].OOMEvents = 0, 1
		}, nil},
		{"eviction: three in a row", func(v *verdict) { v.evict.MaxOOMsInARow = 3 }, []missKind{missEvictRow}},
		{"eviction: two in a row", func(v *verdict) { v.evict.MaxOOMsInARow = 2 }, nil},
		{"OOM after a raise", func(v *verdict) {
			v.tuner.OOMEvents, v.tuner.RaiseOOMEvents = 1, 1
		}, []missKind{missRaiseOOM, missMoreOOMs}},
		{"stranger", func(v *verdict) { dominated(v, 3600, 0, 0, 0, 0) }, []missKind{missStranger}},
		{"known workload", func(v *verdict) { dominated(v, 0, 0, 3600, 0, 0) }, []missKind{missWait}},
		{"learning", func(v *verdict) { dominated(v, 0, 0, 0, 0, 3600) }, []missKind{missLearning}},
		{"a round", func(v *verdict) { dominated(v, 20, 20, 20, 20, 20) }, []missKind{missRound}},
		{"crash loop", func(v *verdict) {
			dominated(v, 0, 0, 3600, 0, 0)
			v.tuner.MaxOOMsInARow = 3
		}, []missKind{missCrashLoop}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := base()
			tc.edit(&v)
			v.check(tr)
			if got := v.kinds(); !slices.Equal(got, tc.want) {
				t.Errorf("kinds %v, want %v (misses %v)", got, tc.want, v.misses)
			}
		})
	}
}

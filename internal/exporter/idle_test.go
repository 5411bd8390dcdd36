package exporter

import (
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/attribution"
)

func holding(pod, uuid string) attribution.Holding {
	return attribution.Holding{Container: attribution.Container{Namespace: "ml", Pod: pod, Container: "main"}, UUID: uuid, Resource: "nvidia.com/gpu", IDs: 1}
}

func usage(pod, uuid string, procs int, sm float64, hasSM bool) attribution.Usage {
	return attribution.Usage{Container: attribution.Container{Namespace: "ml", Pod: pod, Container: "main"}, UUID: uuid, Processes: procs, SMUtilization: sm, HasSM: hasSM}
}

func hk(pod, uuid string) holderKey {
	return holderKey{containerKey{"ml", pod, "main"}, uuid}
}

// TestIdleTracker walks one tracker through scrapes a minute apart, each
// step checking the idle times reported at that scrape.
func TestIdleTracker(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	both := map[string]bool{"GPU-a": true, "GPU-b": true}
	steps := []struct {
		name string
		res  attribution.Result
		gpus map[string]bool
		want map[holderKey]time.Duration
	}{{
		name: "first sight: every holder starts at 0, busy or not",
		res: attribution.Result{
			Holdings: []attribution.Holding{holding("notebook", "GPU-a"), holding("train", "GPU-a"), holding("mig", "GPU-b")},
			Usage:    []attribution.Usage{usage("train", "GPU-a", 1, 0.4, true), usage("mig", "GPU-b", 1, 0, false)},
		},
		gpus: both,
		want: map[holderKey]time.Duration{hk("notebook", "GPU-a"): 0, hk("train", "GPU-a"): 0, hk("mig", "GPU-b"): 0},
	}, {
		name: "no process, a process that ran no kernel: idle; no SM figure: active",
		res: attribution.Result{
			Holdings: []attribution.Holding{holding("notebook", "GPU-a"), holding("train", "GPU-a"), holding("mig", "GPU-b")},
			Usage:    []attribution.Usage{usage("train", "GPU-a", 1, 0, true), usage("mig", "GPU-b", 1, 0, false)},
		},
		gpus: both,
		want: map[holderKey]time.Duration{hk("notebook", "GPU-a"): time.Minute, hk("train", "GPU-a"): time.Minute, hk("mig", "GPU-b"): 0},
	}, {
		name: "GPU-a not read: its holders are not reported and keep their clocks",
		res: attribution.Result{
			Holdings: []attribution.Holding{holding("notebook", "GPU-a"), holding("train", "GPU-a"), holding("mig", "GPU-b")},
			Usage:    []attribution.Usage{usage("mig", "GPU-b", 1, 0, false)},
		},
		gpus: map[string]bool{"GPU-b": true},
		want: map[holderKey]time.Duration{hk("mig", "GPU-b"): 0},
	}, {
		name: "a kernel again resets the clock; the other keeps counting",
		res: attribution.Result{
			Holdings: []attribution.Holding{holding("notebook", "GPU-a"), holding("train", "GPU-a"), holding("mig", "GPU-b")},
			Usage:    []attribution.Usage{usage("train", "GPU-a", 2, 0.05, true)},
		},
		gpus: both,
		want: map[holderKey]time.Duration{hk("notebook", "GPU-a"): 3 * time.Minute, hk("train", "GPU-a"): 0, hk("mig", "GPU-b"): time.Minute},
	}, {
		name: "a holder that releases its replica is forgotten",
		res: attribution.Result{
			Holdings: []attribution.Holding{holding("train", "GPU-a"), holding("mig", "GPU-b")},
		},
		gpus: both,
		want: map[holderKey]time.Duration{hk("train", "GPU-a"): time.Minute, hk("mig", "GPU-b"): 2 * time.Minute},
	}, {
		name: "coming back under the same name starts again from 0",
		res: attribution.Result{
			Holdings: []attribution.Holding{holding("notebook", "GPU-a"), holding("train", "GPU-a"), holding("mig", "GPU-b")},
		},
		gpus: both,
		want: map[holderKey]time.Duration{hk("notebook", "GPU-a"): 0, hk("train", "GPU-a"): 2 * time.Minute, hk("mig", "GPU-b"): 3 * time.Minute},
	}}
	tr := newIdleTracker()
	for i, s := range steps {
		got := tr.update(s.res, s.gpus, t0.Add(time.Duration(i)*time.Minute))
		if !maps.Equal(got, s.want) {
			t.Fatalf("step %d (%s):\n got %v\nwant %v", i, s.name, got, s.want)
		}
	}
}

// TestIdleAcrossScrapes: on the demo node, a container whose process stops
// running kernels counts up from its last busy scrape, a kubelet outage in
// between hides the series without resetting the clock, and a busy one
// stays at 0.
func TestIdleAcrossScrapes(t *testing.T) {
	d := newDemo(t)
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	d.exp.cfg.Now = func() time.Time { return now }
	idle := func(pod string) []string {
		return lines(t, d.reg, "gpuslice_container_gpu_idle_seconds", `pod="`+pod+`"`)
	}
	d.scrape(t)
	p, err := d.node.Pod("media", "ffmpeg-nvenc-0")
	if err != nil {
		t.Fatal(err)
	}
	for i := range p.Containers[0].Processes {
		p.Containers[0].Processes[i].SM = 0
	}
	if err := d.node.Sync(); err != nil {
		t.Fatal(err)
	}
	now = now.Add(10 * time.Minute)
	d.scrape(t)

	d.node.PodResources().SetError(errors.New("kubelet is restarting"))
	now = now.Add(10 * time.Minute)
	if l := idle("ffmpeg-nvenc-0"); len(l) != 0 {
		t.Errorf("idle series without the kubelet's allocations: %v", l)
	}
	d.node.PodResources().SetError(nil)
	now = now.Add(10 * time.Minute)
	if l := idle("ffmpeg-nvenc-0"); len(l) != 1 || !strings.HasSuffix(l[0], " 1800") {
		t.Errorf("idle ffmpeg after 30 minutes without a kernel: %v", l)
	}
	if l := idle("rife-interp-0"); len(l) != 1 || !strings.HasSuffix(l[0], " 0") {
		t.Errorf("busy rife: %v", l)
	}
}

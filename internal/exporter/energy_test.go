package exporter

import (
	"math"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/attribution"
	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/oom"
)

// TestEnergyMeter walks one meter through readings of two GPUs and checks
// the counters after each, and that a GPU's counters always add up to the
// energy of its power readings.
func TestEnergyMeter(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	dev := func(uuid string, watts float64) gpu.Device { return gpu.Device{UUID: uuid, PowerWatts: watts} }
	noPower := gpu.Device{UUID: "GPU-a", Missing: gpu.ReadingPower}
	type want struct {
		containers   map[holderKey]float64
		unattributed map[string]float64
	}
	steps := []struct {
		name    string
		at      time.Duration
		devices []gpu.Device
		usage   []attribution.Usage
		want    want
	}{{
		name:    "first reading: counters at 0, nothing integrated",
		devices: []gpu.Device{dev("GPU-a", 100), dev("GPU-b", 50)},
		usage:   []attribution.Usage{usage("train", "GPU-a", 1, 0.5, true), usage("serve", "GPU-a", 1, 0.25, true)},
		want: want{
			containers:   map[holderKey]float64{hk("train", "GPU-a"): 0, hk("serve", "GPU-a"): 0},
			unattributed: map[string]float64{"GPU-a": 0, "GPU-b": 0},
		},
	}, {
		// 10 s at a mean of 200 W = 2000 J on GPU-a: half to train, a
		// quarter to serve, the rest (idle SMs) unattributed. GPU-b idles:
		// all of its 500 J is unattributed.
		name:    "apportioned by SM share, the rest unattributed",
		at:      10 * time.Second,
		devices: []gpu.Device{dev("GPU-a", 300), dev("GPU-b", 50)},
		usage:   []attribution.Usage{usage("train", "GPU-a", 1, 0.5, true), usage("serve", "GPU-a", 1, 0.25, true)},
		want: want{
			containers:   map[holderKey]float64{hk("train", "GPU-a"): 1000, hk("serve", "GPU-a"): 500},
			unattributed: map[string]float64{"GPU-a": 500, "GPU-b": 500},
		},
	}, {
		// 10 s at 300 W = 3000 J; shares 0.9 + 0.6 scaled to 0.6 and 0.4;
		// a process without an SM figure gets nothing.
		name:    "shares over 1 are scaled to the whole; no SM figure, no share",
		at:      20 * time.Second,
		devices: []gpu.Device{dev("GPU-a", 300), dev("GPU-b", 50)},
		usage: []attribution.Usage{usage("train", "GPU-a", 1, 0.9, true), usage("serve", "GPU-a", 1, 0.6, true),
			usage("mig", "GPU-b", 1, 0, false)},
		want: want{
			containers:   map[holderKey]float64{hk("train", "GPU-a"): 2800, hk("serve", "GPU-a"): 1700, hk("mig", "GPU-b"): 0},
			unattributed: map[string]float64{"GPU-a": 500, "GPU-b": 1000},
		},
	}, {
		name:    "no power reading: nothing counted, the interval restarts",
		at:      30 * time.Second,
		devices: []gpu.Device{noPower, dev("GPU-b", 50)},
		usage:   []attribution.Usage{usage("train", "GPU-a", 1, 1, true)},
		want: want{
			containers:   map[holderKey]float64{hk("train", "GPU-a"): 2800, hk("serve", "GPU-a"): 1700, hk("mig", "GPU-b"): 0},
			unattributed: map[string]float64{"GPU-a": 500, "GPU-b": 1500},
		},
	}, {
		name:    "first reading after the gap: not integrated",
		at:      40 * time.Second,
		devices: []gpu.Device{dev("GPU-a", 300), dev("GPU-b", 50)},
		usage:   []attribution.Usage{usage("train", "GPU-a", 1, 1, true)},
		want: want{
			containers:   map[holderKey]float64{hk("train", "GPU-a"): 2800, hk("serve", "GPU-a"): 1700, hk("mig", "GPU-b"): 0},
			unattributed: map[string]float64{"GPU-a": 500, "GPU-b": 2000},
		},
	}, {
		name:    "a scrape gap over 5 minutes counts for nobody",
		at:      40*time.Second + 6*time.Minute,
		devices: []gpu.Device{dev("GPU-a", 300), dev("GPU-b", 50)},
		usage:   []attribution.Usage{usage("train", "GPU-a", 1, 1, true)},
		want: want{
			containers:   map[holderKey]float64{hk("train", "GPU-a"): 2800, hk("serve", "GPU-a"): 1700, hk("mig", "GPU-b"): 0},
			unattributed: map[string]float64{"GPU-a": 500, "GPU-b": 2000},
		},
	}, {
		name:    "counters of containers gone for the forget period (6 hours) are dropped",
		at:      40*time.Second + 6*time.Minute + 7*time.Hour,
		devices: []gpu.Device{dev("GPU-b", 50)},
		want: want{
			containers:   map[holderKey]float64{},
			unattributed: map[string]float64{"GPU-a": 500, "GPU-b": 2000},
		},
	}}
	m := newEnergyMeter(oom.DefaultForgetAfter)
	for i, s := range steps {
		m.update(s.devices, attribution.Result{Usage: s.usage}, t0.Add(s.at))
		got := map[holderKey]float64{}
		for k, c := range m.containers {
			got[k] = c.joules
		}
		if !near(got, s.want.containers) || !near(m.unattributed, s.want.unattributed) {
			t.Fatalf("step %d (%s):\n got %v, unattributed %v\nwant %v, unattributed %v", i, s.name, got, m.unattributed, s.want.containers, s.want.unattributed)
		}
	}
}

func near[K comparable](a, b map[K]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || math.Abs(v-w) > 1e-9 {
			return false
		}
	}
	return true
}

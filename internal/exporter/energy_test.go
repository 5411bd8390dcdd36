package exporter

import (
	"math"
	"math/rand/v2"
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

// TestEnergyCountersNeverDecrease: containers whose SM shares fill the GPU
// leave no energy unattributed, and the rounding of their shares must not
// take the unattributed counter down (Prometheus reads any decrease as a
// counter reset), nor lose or make energy. Three busy containers on a GPU
// whose unattributed counter is at 4500 J, over 20,000 scrapes, as a
// reviewer saw it decrease.
func TestEnergyCountersNeverDecrease(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(1, 2))
	m := newEnergyMeter(oom.DefaultForgetAfter)
	busy := func(a, b, c float64) attribution.Result {
		return attribution.Result{Usage: []attribution.Usage{
			usage("train", "GPU-a", 1, a, true), usage("serve", "GPU-a", 1, b, true), usage("tune", "GPU-a", 1, c, true),
		}}
	}
	// The first reading: the counters start, at 0.
	m.update([]gpu.Device{{UUID: "GPU-a", PowerWatts: 300}}, busy(0.5, 0.25, 0.25), t0)
	m.unattributed["GPU-a"] = 4500
	total := func() float64 {
		s := m.unattributed["GPU-a"]
		for _, c := range m.containers {
			s += c.joules
		}
		return s
	}
	lastWatts, energy := 300.0, total()
	for i := 1; i <= 20000; i++ {
		// Shares of the GPU's SMs that add up to 1 in exact arithmetic.
		a := rng.Float64()
		b := rng.Float64() * (1 - a)
		c := 1 - a - b
		watts := 100 + 300*rng.Float64()
		before := map[holderKey]float64{}
		for k, c := range m.containers {
			before[k] = c.joules
		}
		unattributed := m.unattributed["GPU-a"]
		m.update([]gpu.Device{{UUID: "GPU-a", PowerWatts: watts}}, busy(a, b, c), t0.Add(time.Duration(i)*15*time.Second))
		if got := m.unattributed["GPU-a"]; got < unattributed {
			t.Fatalf("scrape %d: shares %v+%v+%v: unattributed counter went down from %v to %v", i, a, b, c, unattributed, got)
		}
		for k, c := range m.containers {
			if c.joules < before[k] {
				t.Fatalf("scrape %d: %v's counter went down from %v to %v", i, k, before[k], c.joules)
			}
		}
		energy += (lastWatts + watts) / 2 * 15
		lastWatts = watts
	}
	// The counters add up to the energy of the power readings, to within
	// the rounding of 20,000 sums near 10 MJ.
	if got := total(); math.Abs(got-energy) > 1e-9*energy {
		t.Errorf("the GPU's counters add up to %v J, its power readings to %v J", got, energy)
	}
}

// TestEnergyCounterStartsAtZero: a container that appears on a GPU between
// two scrapes is first exposed at 0, its share of that interval left
// unattributed, and earns from the next interval on; so the energy
// increase() sees over all of a GPU's counters is the GPU's energy.
func TestEnergyCounterStartsAtZero(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	dev := []gpu.Device{{UUID: "GPU-a", PowerWatts: 200}}
	train := attribution.Result{Usage: []attribution.Usage{usage("train", "GPU-a", 1, 0.75, true)}}
	steps := []struct {
		name                string
		res                 attribution.Result
		train, unattributed float64
		trainExposed        bool
	}{
		{name: "GPU first read, no container", unattributed: 0},
		// 10 s at 200 W: 2000 J, none of it on a counter not yet exposed.
		{name: "container appears: exposed at 0", res: train, trainExposed: true, unattributed: 2000},
		{name: "next interval: three quarters to it", res: train, trainExposed: true, train: 1500, unattributed: 2500},
	}
	m := newEnergyMeter(oom.DefaultForgetAfter)
	for i, s := range steps {
		m.update(dev, s.res, t0.Add(time.Duration(i)*10*time.Second))
		c, exposed := m.containers[hk("train", "GPU-a")]
		if exposed != s.trainExposed {
			t.Fatalf("%s: train's counter exposed %v, want %v", s.name, exposed, s.trainExposed)
		}
		if exposed && math.Abs(c.joules-s.train) > 1e-9 {
			t.Errorf("%s: train's counter %v J, want %v", s.name, c.joules, s.train)
		}
		if got := m.unattributed["GPU-a"]; math.Abs(got-s.unattributed) > 1e-9 {
			t.Errorf("%s: unattributed %v J, want %v", s.name, got, s.unattributed)
		}
	}
}

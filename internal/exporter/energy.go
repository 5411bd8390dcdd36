package exporter

import (
	"time"

	"github.com/gpuslice/gpuslice/internal/attribution"
	"github.com/gpuslice/gpuslice/internal/gpu"
)

// maxEnergyInterval is the longest time between two power readings of a GPU
// that is integrated. Over a longer gap (scrapes missed, the GPU failed to
// read) neither the power nor who used the SMs in between is known, and
// spreading a gap's energy by the SM shares of one late sample would bill
// the wrong pods: the gap counts for nobody.
const maxEnergyInterval = 5 * time.Minute

type powerReading struct {
	at    time.Time
	watts float64
}

type energyCount struct {
	joules   float64
	lastSeen time.Time
}

// energyMeter estimates each GPU's energy from its power readings (the
// trapezoid between two scrapes: mean power × time) and apportions it to
// the containers with processes on it by their SM utilization over the
// same period, which the backend reports since its previous reading. What
// the containers' SM shares do not cover (idle power, processes outside
// pods, processes without a per-process figure, and a container's first
// interval, before its counter was exposed at 0) is the GPU's unattributed
// energy, so the containers' and the unattributed counters of a GPU add up
// to its estimated total. NVML's total energy counter would measure the
// GPU's part more exactly, but the split by SM share would remain an
// estimate either way: time-slicing gives no per-process power.
//
// A container's counter is dropped once it has had no process on the GPU
// for forgetAfter, the exporter's one forget period (oom.Tracker).
type energyMeter struct {
	forgetAfter  time.Duration
	last         map[string]powerReading // by UUID
	containers   map[holderKey]*energyCount
	unattributed map[string]float64 // by UUID
}

func newEnergyMeter(forgetAfter time.Duration) *energyMeter {
	return &energyMeter{forgetAfter: forgetAfter, last: map[string]powerReading{}, containers: map[holderKey]*energyCount{}, unattributed: map[string]float64{}}
}

// update integrates the readings of devices (the GPUs read in this scrape)
// taken at now.
func (m *energyMeter) update(devices []gpu.Device, res attribution.Result, now time.Time) {
	onGPU := map[string][]*attribution.Usage{}
	for i := range res.Usage {
		u := &res.Usage[i]
		onGPU[u.UUID] = append(onGPU[u.UUID], u)
	}
	read := make(map[string]bool, len(devices))
	for _, d := range devices {
		if d.Missing.Has(gpu.ReadingPower) {
			continue
		}
		read[d.UUID] = true
		prev, ok := m.last[d.UUID]
		m.last[d.UUID] = powerReading{at: now, watts: d.PowerWatts}
		if _, ok := m.unattributed[d.UUID]; !ok {
			m.unattributed[d.UUID] = 0
		}
		// A container's counter is first exposed at 0 and earns from the
		// interval after: a counter series that appears above 0 has no
		// earlier sample, so rate() and increase() never see its first
		// interval (as with the OOM counters, oom.Tracker). That interval's
		// share stays unattributed, which keeps the GPU's counters adding
		// up to its energy in what PromQL sees, not only in their values.
		counts := make([]*energyCount, len(onGPU[d.UUID]))
		for i, u := range onGPU[d.UUID] {
			k := holderKey{containerKey{u.Namespace, u.Pod, u.Container.Container}, u.UUID}
			c := m.containers[k]
			if c == nil {
				m.containers[k] = &energyCount{lastSeen: now}
				continue
			}
			c.lastSeen = now
			counts[i] = c
		}
		dt := now.Sub(prev.at)
		if !ok || dt <= 0 || dt > maxEnergyInterval {
			continue
		}
		joules := (prev.watts + d.PowerWatts) / 2 * dt.Seconds()
		sum := 0.0
		for _, u := range onGPU[d.UUID] {
			if u.HasSM {
				sum += u.SMUtilization
			}
		}
		// Each container's share is capped at 1, but their sum is not
		// (samples of processes overlap): scale it down to the whole.
		scale := 1.0
		if sum > 1 {
			scale = 1 / sum
		}
		shares := make([]float64, len(counts))
		given, largest := 0.0, -1
		for i, u := range onGPU[d.UUID] {
			if u.HasSM && counts[i] != nil {
				shares[i] = joules * u.SMUtilization * scale
				given += shares[i]
				if largest < 0 || shares[i] > shares[largest] {
					largest = i
				}
			}
		}
		rest := joules - given
		if rest < 0 && largest >= 0 {
			// Shares that fill the GPU can round to a hair more than its
			// energy, and adding that tiny negative rest would take the
			// unattributed counter down, which Prometheus reads as a
			// counter reset. Taking it off the largest share instead keeps
			// every counter growing and their sum the GPU's energy.
			shares[largest] = max(shares[largest]+rest, 0)
			rest = 0
		}
		for i, c := range counts {
			if c != nil {
				c.joules += shares[i]
			}
		}
		m.unattributed[d.UUID] += rest
	}
	// A GPU that gave no power reading starts a new interval at its next
	// one; the gap is not integrated.
	for uuid := range m.last {
		if !read[uuid] {
			delete(m.last, uuid)
		}
	}
	for k, c := range m.containers {
		if now.Sub(c.lastSeen) > m.forgetAfter {
			delete(m.containers, k)
		}
	}
}

func (m *energyMeter) emit(em emitter, index map[string]string) {
	for k, c := range m.containers {
		em.counter(containerEnergy, c.joules, k.ns, k.pod, k.container, index[k.uuid], k.uuid)
	}
	for uuid, j := range m.unattributed {
		em.counter(unattributedEnergy, j, index[uuid], uuid)
	}
}

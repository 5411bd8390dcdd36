package signals

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// MetricContainerIdle is the exporter's idle-holder gauge: how long a
// container that holds replica IDs of a GPU has run no kernel there.
const MetricContainerIdle = "gpuslice_container_gpu_idle_seconds"

// IdleHolder is a container holding replica IDs of a GPU, as of the latest
// look, with how long it has run no kernel there (0 while it does).
type IdleHolder struct {
	Namespace, Pod, Container string
	// GPU is the GPU's index on its node, UUID its UUID.
	GPU, UUID string
	Idle      time.Duration
}

// IdleSource is a Source that also knows the replica holders of each node
// and how long each has been idle: what the tuner names when it explains a
// pod waiting for a replica. Both sources implement it.
type IdleSource interface {
	// IdleHolders returns, per node name, its holders as of the latest
	// look at or before now, longest idle first; a node not looked at
	// recently is absent.
	IdleHolders(ctx context.Context, now time.Time) (map[string][]IdleHolder, error)
}

// sortIdle orders holders longest idle first, then by name.
func sortIdle(hs []IdleHolder) {
	slices.SortFunc(hs, func(a, b IdleHolder) int {
		return cmp.Or(cmp.Compare(b.Idle, a.Idle), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod),
			cmp.Compare(a.Container, b.Container), cmp.Compare(a.UUID, b.UUID))
	})
}

func seconds(v float64) time.Duration {
	if math.IsNaN(v) || v <= 0 {
		return 0
	}
	return time.Duration(min(v, float64(math.MaxInt64/int64(time.Second))) * float64(time.Second))
}

// idleStale is how many scrape intervals an exporter's last holders stay
// current: one that stops answering stops being explained.
const idleStale = 3

// IdleHolders implements IdleSource from the latest scrape of each node's
// exporter.
func (e *Exporters) IdleHolders(_ context.Context, now time.Time) (map[string][]IdleHolder, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string][]IdleHolder{}
	for node, l := range e.idle {
		if now.Sub(l.at) > idleStale*e.o.Interval || l.at.After(now) {
			continue
		}
		out[node] = append(out[node], l.holders...)
	}
	for _, hs := range out {
		sortIdle(hs)
	}
	return out, nil
}

// idleLook is one scrape's holders.
type idleLook struct {
	at      time.Time
	holders []IdleHolder
}

// holders lists a reading's idle gauges.
func (r Reading) holders() []IdleHolder {
	var out []IdleHolder
	for uuid, g := range r {
		for _, h := range g.Idle {
			h.GPU, h.UUID = g.Index, uuid
			out = append(out, h)
		}
	}
	return out
}

// IdleQuery is the PromQL IdleHolders runs.
func (p *Prometheus) IdleQuery() string {
	n := p.o.Config.NodeLabel
	sel := "{" + n + `!=""`
	if p.o.Config.Selector != "" {
		sel += ", " + p.o.Config.Selector
	}
	sel += "}"
	return "max by (" + n + ", namespace, pod, container, gpu, uuid) (" + MetricContainerIdle + sel + ")"
}

// IdleHolders implements IdleSource with one instant query at now; a series
// Prometheus has not scraped within its lookback delta is not in the answer.
func (p *Prometheus) IdleHolders(ctx context.Context, now time.Time) (map[string][]IdleHolder, error) {
	ctx, cancel := context.WithTimeout(ctx, p.o.Config.Timeout)
	defer cancel()
	v, _, err := p.api.Query(ctx, p.IdleQuery(), now, v1.WithTimeout(p.o.Config.Timeout))
	if err != nil {
		return nil, fmt.Errorf("prometheus query %s: %w", p.IdleQuery(), err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("prometheus query %s: got %s, want a vector", p.IdleQuery(), v.Type())
	}
	nl := model.LabelName(p.o.Config.NodeLabel)
	out := map[string][]IdleHolder{}
	for _, s := range vec {
		m := s.Metric
		node := string(m[nl])
		out[node] = append(out[node], IdleHolder{Namespace: string(m["namespace"]), Pod: string(m["pod"]), Container: string(m["container"]),
			GPU: string(m["gpu"]), UUID: string(m["uuid"]), Idle: seconds(float64(s.Value))})
	}
	for _, hs := range out {
		sortIdle(hs)
	}
	return out, nil
}

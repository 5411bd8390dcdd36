package exporter

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpuslice/gpuslice/internal/gpu"
)

func TestEmitXids(t *testing.T) {
	devices := []gpu.Device{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b"}}
	xids := []gpu.XidCount{
		{UUID: "GPU-a", Index: 0, Xid: 79, Count: 2}, // alerted, counted
		{UUID: "GPU-b", Index: 1, Xid: 13, Count: 5}, // an application Xid
		{UUID: "GPU-c", Index: 2, Xid: 48, Count: 1}, // a GPU that failed this scrape
	}
	set := newSeriesSet()
	set.begin()
	emitXids(emitter{set: set}, devices, xids)
	set.finish()
	ch := make(chan prometheus.Metric, 100)
	set.send(ch)
	close(ch)
	got := map[string]float64{}
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{}
		for _, l := range pb.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		k := labels["uuid"] + "/" + labels["xid"]
		if _, dup := got[k]; dup {
			t.Errorf("%s sent twice", k)
		}
		got[k] = pb.GetCounter().GetValue()
	}
	want := map[string]float64{"GPU-a/79": 2, "GPU-b/13": 5, "GPU-c/48": 1}
	for _, d := range devices {
		for _, x := range AlertedXids {
			k := d.UUID + "/" + strconv.FormatUint(x, 10)
			if _, ok := want[k]; !ok {
				want[k] = 0
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("sent %d series, want %d", len(got), len(want))
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (sent %v), want %v", k, g, ok, v)
		}
	}
}

// TestAlertedXidsAreAlertedOn: the Xids created at 0 are ones
// GPUSliceXidCritical fires for, not ones it ignores as an application's.
func TestAlertedXidsAreAlertedOn(t *testing.T) {
	path := filepath.Join("..", "..", "alerts", "gpuslice-rules.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`xid!~"([^"]+)"`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s: no xid!~ matcher", path)
	}
	ignored := regexp.MustCompile("^(?:" + string(m[1]) + ")$") // PromQL regexes are anchored
	for _, x := range AlertedXids {
		if ignored.MatchString(strconv.FormatUint(x, 10)) {
			t.Errorf("Xid %d is created at 0 but the alert ignores it (%s)", x, m[1])
		}
	}
}

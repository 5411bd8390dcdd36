package signals

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/oom"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

const exposition = `# HELP gpuslice_gpu_memory_total_bytes Total memory of the GPU.
# TYPE gpuslice_gpu_memory_total_bytes gauge
gpuslice_gpu_memory_total_bytes{gpu="0",uuid="GPU-a"} 5.152702464e+10
gpuslice_gpu_memory_total_bytes{gpu="1",uuid="GPU-b"} 1.6e+10
# TYPE gpuslice_gpu_memory_used_bytes gauge
gpuslice_gpu_memory_used_bytes{gpu="0",uuid="GPU-a"} 1.2e+10
gpuslice_gpu_memory_used_bytes{gpu="1",uuid="GPU-b"} 0
gpuslice_gpu_memory_used_bytes{gpu="2",uuid="GPU-failed"} 7
# TYPE gpuslice_container_gpu_memory_used_bytes gauge
gpuslice_container_gpu_memory_used_bytes{container="main",gpu="0",namespace="ml",pod="yolo",uuid="GPU-a"} 4e+09
gpuslice_container_gpu_memory_used_bytes{container="enc",gpu="0",namespace="media",pod="ffmpeg",uuid="GPU-a"} 5e+08
# TYPE gpuslice_gpu_replicas gauge
gpuslice_gpu_replicas{gpu="0",resource="nvidia.com/gpu",uuid="GPU-a"} 4
gpuslice_gpu_replicas{gpu="0",resource="nvidia.com/gpu.shared",uuid="GPU-a"} 2
gpuslice_gpu_replicas{gpu="1",resource="nvidia.com/gpu",uuid="GPU-b"} 1
# TYPE gpuslice_gpu_replicas_allocated gauge
gpuslice_gpu_replicas_allocated{gpu="0",resource="nvidia.com/gpu",uuid="GPU-a"} 3
# TYPE gpuslice_gpu_oom_events_total counter
gpuslice_gpu_oom_events_total{container="main",gpu="0",namespace="ml",pod="yolo",source="log",uuid="GPU-a"} 2
gpuslice_gpu_oom_events_total{container="main",gpu="0",namespace="ml",pod="yolo",source="termination",uuid="GPU-a"} 1
gpuslice_gpu_oom_events_total{container="train",gpu="0",kind="process-cap",namespace="ml",pod="llm",source="log",uuid="GPU-a"} 1
# TYPE gpuslice_container_gpu_idle_seconds gauge
gpuslice_container_gpu_idle_seconds{container="main",gpu="0",namespace="ml",pod="yolo",uuid="GPU-a"} 0
gpuslice_container_gpu_idle_seconds{container="jupyter",gpu="0",namespace="lab",pod="nb",uuid="GPU-a"} 7260.5
gpuslice_container_gpu_idle_seconds{container="x",gpu="9",namespace="lab",pod="gone",uuid="GPU-failed"} 60
# TYPE go_goroutines gauge
go_goroutines 12
`

func TestParseExposition(t *testing.T) {
	got, err := ParseExposition(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	want := Reading{
		"GPU-a": {
			Index: "0", MemoryTotalBytes: 51527024640, MemoryUsedBytes: 12e9,
			Containers:         map[string]uint64{"ml/yolo/main": 4e9, "media/ffmpeg/enc": 5e8},
			ReplicasAdvertised: 6, ReplicasAllocated: 3,
			OOMCounters: map[string]float64{"ml/yolo/main/log/": 2, "ml/yolo/main/termination/": 1, "ml/llm/train/log/process-cap": 1},
			OOMSeries: map[string]policy.OOM{"ml/yolo/main/log/": {Container: "ml/yolo/main"}, "ml/yolo/main/termination/": {Container: "ml/yolo/main"},
				"ml/llm/train/log/process-cap": {Container: "ml/llm/train", Kind: policy.OOMCap}},
			Idle: map[string]IdleHolder{
				"ml/yolo/main":   {Namespace: "ml", Pod: "yolo", Container: "main"},
				"lab/nb/jupyter": {Namespace: "lab", Pod: "nb", Container: "jupyter", Idle: 7260500 * time.Millisecond},
			},
		},
		"GPU-b": {Index: "1", MemoryTotalBytes: 16e9, ReplicasAdvertised: 1, Containers: map[string]uint64{}, OOMCounters: map[string]float64{}, OOMSeries: map[string]policy.OOM{},
			Idle: map[string]IdleHolder{}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("reading (-want +got):\n%s", d)
	}

	if _, err := ParseExposition(strings.NewReader("gpuslice_gpu_memory_total_bytes{uuid=\"x\" 1\n")); err == nil {
		t.Error("a broken exposition parsed")
	}
}

func TestOOMTracker(t *testing.T) {
	// nil: GPU-a is not in the reading.
	reading := func(counters map[string]float64) Reading {
		if counters == nil {
			return Reading{}
		}
		return Reading{"GPU-a": {OOMCounters: counters}}
	}
	for _, tc := range []struct {
		name  string
		steps []map[string]float64
		want  []int
	}{
		{"first look is a baseline", []map[string]float64{{"c/log": 3}, {"c/log": 3}}, []int{0, 0}},
		{"increase", []map[string]float64{{"c/log": 3}, {"c/log": 5}, {"c/log": 5}}, []int{0, 2, 0}},
		{"a series appearing later counts whole", []map[string]float64{{}, {"c/log": 1}, {"c/log": 1, "d/log": 2}}, []int{0, 1, 2}},
		{"reset counts the new value", []map[string]float64{{"c/log": 4}, {"c/log": 1}}, []int{0, 1}},
		{"a series absent for a while keeps its value", []map[string]float64{{"c/log": 4}, {}, {"c/log": 4}, {"c/log": 5}}, []int{0, 0, 0, 1}},
		{"sources add up", []map[string]float64{{"c/log": 1, "c/termination": 1}, {"c/log": 2, "c/termination": 2}}, []int{0, 2}},
		// A GPU that NVML could not read at the first look (absent from
		// the reading) has its baseline when it comes.
		{"a GPU absent at first is a baseline when it comes", []map[string]float64{nil, {"c/log": 7}, {"c/log": 8}}, []int{0, 0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newOOMTracker()
			t0 := time.Unix(1000, 0)
			for i, step := range tc.steps {
				got := tr.events(reading(step), t0.Add(time.Duration(i)*time.Second))["GPU-a"]
				if len(got) != tc.want[i] {
					t.Errorf("step %d: %d events, want %d", i, len(got), tc.want[i])
				}
			}
		})
	}
}

// An exporter that restarted counts no history: its counters begin again,
// at 0 or at a new event's 1. Its process start time says so, and a 1 after
// a 1 is then an event; the same 1 from the same process is not. A GPU
// gone for longer than forgetCounter is a baseline again when it comes.
func TestOOMTrackerExporterRestart(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	r := func(v float64) Reading {
		return Reading{"GPU-a": {OOMCounters: map[string]float64{"c/log/unknown": v}}}
	}
	tr := newOOMTracker()
	steps := []struct {
		start float64
		r     Reading
		at    time.Time
		want  int
	}{
		{100, r(0), at(0), 0},
		{100, r(1), at(15), 1},
		{100, r(1), at(30), 0},
		{500, Reading{"GPU-a": {}}, at(45), 0}, // restarted: the counter is not there yet
		{500, r(1), at(60), 1},                 // and comes with a new event
		{0, r(1), at(75), 0},                   // no start time: nothing changes
		{500, r(1), at(90), 0},
		{500, Reading{}, at(105), 0},
		{500, r(4), at(105).Add(3 * forgetCounter), 0}, // GPU-a back after long: a baseline
	}
	for i, s := range steps {
		tr.started(s.start)
		if got := len(tr.events(s.r, s.at)["GPU-a"]); got != s.want {
			t.Errorf("step %d: %d events, want %d", i, got, s.want)
		}
	}
}

// A sample that is not a number is dropped, not read as a huge count or
// a full card.
func TestParseExpositionSkipsNaN(t *testing.T) {
	text := "gpuslice_gpu_memory_total_bytes{gpu=\"0\",uuid=\"GPU-a\"} 2.5e+10\n" +
		"gpuslice_gpu_memory_total_bytes{gpu=\"1\",uuid=\"GPU-b\"} +Inf\n" +
		"gpuslice_gpu_replicas{gpu=\"0\",uuid=\"GPU-a\",resource=\"nvidia.com/gpu\"} NaN\n" +
		"process_start_time_seconds 1.7e+09\n"
	r, start, err := parseExposition(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(r) != 1 || r["GPU-a"] == nil || r["GPU-a"].ReplicasAdvertised != 0 {
		t.Errorf("reading %+v, want GPU-a alone with no replicas read", r)
	}
	if start != 1.7e9 {
		t.Errorf("process start %v, want 1.7e9", start)
	}
}

// Each event keeps the container and kind of its series, so the policy can
// tell a per-process cap from a full GPU and a crash loop from many pods.
func TestOOMTrackerKeepsContainerAndKind(t *testing.T) {
	r0, err := ParseExposition(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	r1, _ := ParseExposition(strings.NewReader(strings.ReplaceAll(exposition, `uuid="GPU-a"} 1`+"\n", `uuid="GPU-a"} 2`+"\n")))
	tr := newOOMTracker()
	tr.events(r0, time.Unix(1000, 0))
	got := tr.events(r1, time.Unix(1015, 0))["GPU-a"]
	slices.SortFunc(got, func(a, b policy.OOM) int { return strings.Compare(a.Container, b.Container) })
	want := []policy.OOM{{Container: "ml/llm/train", Kind: policy.OOMCap}, {Container: "ml/yolo/main"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
}

func TestWindow(t *testing.T) {
	t0 := time.Unix(10000, 0)
	w := NewWindow(time.Minute)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	sample := func(s int, used uint64) policy.Sample { return policy.Sample{Time: at(s), MemoryUsedBytes: used} }
	for s := 0; s <= 90; s += 10 {
		w.Add("n1", map[string]policy.Sample{"GPU-a": sample(s, uint64(s)), "GPU-b": sample(s, 1)})
	}
	w.Add("n1", map[string]policy.Sample{"GPU-a": sample(85, 999)}) // out of order: dropped
	w.Add("n2", map[string]policy.Sample{"GPU-c": sample(90, 5)})

	obs, err := w.Observe(context.Background(), at(90), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	times := func(ss []policy.Sample) []int {
		var out []int
		for _, s := range ss {
			out = append(out, int(s.Time.Sub(t0)/time.Second))
		}
		return out
	}
	if len(obs["n1"]) != 2 || obs["n1"][0].UUID != "GPU-a" || obs["n1"][1].UUID != "GPU-b" {
		t.Fatalf("n1 = %+v, want GPU-a then GPU-b", obs["n1"])
	}
	if got := times(obs["n1"][0].Samples); !cmp.Equal(got, []int{60, 70, 80, 90}) {
		t.Errorf("GPU-a samples at %v, want 60..90", got)
	}
	if len(obs["n2"]) != 1 {
		t.Errorf("n2 = %+v", obs["n2"])
	}

	// What Observe returned does not change under later Adds.
	before := obs["n1"][0].Samples
	w.Add("n1", map[string]policy.Sample{"GPU-a": sample(100, 7)})
	if len(before) != 4 || cap(before) != 4 {
		t.Errorf("observed slice len %d cap %d, want 4 and 4", len(before), cap(before))
	}

	// Keep is one minute: 40 and older fall out on the next Add.
	obs, _ = w.Observe(context.Background(), at(100), time.Hour)
	if got := times(obs["n1"][0].Samples); got[0] != 40 {
		t.Errorf("GPU-a kept from %ds, want 40s", got[0])
	}
	// Prune forgets nodes without recent samples.
	w.Prune(at(155))
	obs, _ = w.Observe(context.Background(), at(155), time.Hour)
	if _, ok := obs["n2"]; ok {
		t.Error("n2 survived a prune past its last sample")
	}
	if got := times(obs["n1"][0].Samples); !cmp.Equal(got, []int{100}) {
		t.Errorf("after prune GPU-a has %v, want [100]", got)
	}
}

// The kinds the policy reads are the OOM matcher's, by value: the `kind`
// label carries internal/oom's Kind.Label ("unknown" for KindUnknown); an
// exporter without the label gives "".
func TestOOMKindsAreTheMatchers(t *testing.T) {
	for _, tc := range []struct {
		label  string
		policy policy.OOMKind
	}{
		{oom.KindDevice.Label(), policy.OOMDevice},
		{oom.KindProcessCap.Label(), policy.OOMCap},
		{oom.KindEncoderSession.Label(), policy.OOMEncoderSession},
		{oom.KindUnknown.Label(), policy.OOMUnknown},
		{"", policy.OOMUnknown},
		{"something-new", policy.OOMUnknown},
	} {
		if got := oomOf(map[string]string{"kind": tc.label}).Kind; got != tc.policy {
			t.Errorf("kind %q reads as %q, want %q", tc.label, got, tc.policy)
		}
	}
}

// TestExporterOOMSeries reads the exporter's own exposition (its golden
// scrape): a container has one counter per source, of the kind of a plain
// GPU OOM, all read, and an OOM of each kind comes out once with its kind:
// the device OOM the golden holds, then a process-cap one (an MPS client
// at its pinned limit) on the same container, whose counter the exporter
// makes at its first event.
func TestExporterOOMSeries(t *testing.T) {
	golden, err := os.ReadFile(filepath.Join("..", "..", "exporter", "testdata", "demo.prom"))
	if err != nil {
		t.Fatal(err)
	}
	const esrgan = `gpuslice_gpu_oom_events_total{container="esrgan",gpu="0",kind="%s",namespace="media",pod="esrgan-upscale-0",source="log",uuid="GPU-f090b70b-b060-ca81-43cd-331f3657848d"} %d`
	line := func(kind string, n int) string { return fmt.Sprintf(esrgan, kind, n) }
	if !strings.Contains(string(golden), line("device", 1)) || strings.Contains(string(golden), `kind="process-cap"`) {
		t.Fatalf("the golden lacks esrgan's device OOM, or has process-cap counters:\n%s", golden)
	}
	before := strings.Replace(string(golden), line("device", 1), line("device", 0), 1)
	after := strings.Replace(string(golden), line("device", 1), line("device", 1)+"\n"+line("process-cap", 1), 1)
	var readings []Reading
	for _, text := range []string{before, string(golden), after} {
		r, err := ParseExposition(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		readings = append(readings, r)
	}
	const uuid = "GPU-f090b70b-b060-ca81-43cd-331f3657848d"
	if n := len(readings[1][uuid].OOMCounters); n != 4*2 {
		t.Errorf("%d OOM counters, want 8 (4 containers × 2 sources)", n)
	}
	tr := newOOMTracker()
	t0 := time.Unix(1000, 0)
	tr.events(readings[0], t0)
	want := [][]policy.OOM{
		{{Container: "media/esrgan-upscale-0/esrgan", Kind: policy.OOMDevice}},
		{{Container: "media/esrgan-upscale-0/esrgan", Kind: policy.OOMCap}},
	}
	for i, r := range readings[1:] {
		got := tr.events(r, t0.Add(time.Duration(i+1)*15*time.Second))[uuid]
		if d := cmp.Diff(want[i], got); d != "" {
			t.Errorf("step %d: events (-want +got):\n%s", i+1, d)
		}
	}
}

// One exporter pod per node is scraped: a ready one before one that is
// not, then the oldest, then by name.
func TestPreferredExporterPod(t *testing.T) {
	t0 := metav1.NewTime(time.Unix(1000, 0))
	t1 := metav1.NewTime(time.Unix(2000, 0))
	pod := func(name string, created metav1.Time, ready bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: created}}
		if ready {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		return p
	}
	for _, tc := range []struct {
		name string
		a, b *corev1.Pod
		want bool
	}{
		{"older", pod("x", t0, true), pod("y", t1, true), true},
		{"newer", pod("x", t1, true), pod("y", t0, true), false},
		{"ready before older", pod("x", t1, true), pod("y", t0, false), true},
		{"not ready after newer", pod("x", t0, false), pod("y", t1, true), false},
		{"same age: by name", pod("a", t0, true), pod("b", t0, true), true},
	} {
		if got := preferred(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: preferred %v, want %v", tc.name, got, tc.want)
		}
	}
}

package status

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/tuner/controller"
)

func TestParseScrapeNamesItsSource(t *testing.T) {
	_, err := ParseScrape("http://node-1:9846/metrics", strings.NewReader("gpuslice_gpu_info{gpu=\"0\" 1\n"))
	if err == nil || !strings.Contains(err.Error(), "http://node-1:9846/metrics") {
		t.Errorf("err = %v, want one naming the exporter", err)
	}
}

// TestBuildEdges: an unreadable annotation is not a decision, a scrape
// error is the node's, and series of a GPU without a total (a failed NVML
// reading) are not shown as a GPU of their own.
func TestBuildEdges(t *testing.T) {
	nodes := []corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "b", Annotations: map[string]string{controller.AnnotationLastDecision: "{not json"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "a"}},
	}
	s, err := ParseScrape("a", strings.NewReader(`gpuslice_container_gpu_memory_used_bytes{namespace="ml",pod="p",container="c",gpu="1",uuid="GPU-gone"} 5
gpuslice_gpu_memory_total_bytes{gpu="0",uuid="GPU-x"} 100
`))
	if err != nil {
		t.Fatal(err)
	}
	r := Build(nodes, map[string]Scrape{"a": s}, map[string]error{"b": errors.New("connection refused")})
	if len(r.Nodes) != 2 || r.Nodes[0].Name != "a" || r.Nodes[1].Name != "b" {
		t.Fatalf("nodes = %+v", r.Nodes)
	}
	if g := r.Nodes[0].GPUs; len(g) != 1 || g[0].UUID != "GPU-x" || len(g[0].Containers) != 0 {
		t.Errorf("GPUs of a = %+v", g)
	}
	if b := r.Nodes[1]; b.LastDecision != nil || b.ExporterError != "connection refused" {
		t.Errorf("b = %+v", b)
	}
	// The tuner leaves a node whose record does not parse alone: status
	// says so, with the error, rather than "none recorded".
	if b := r.Nodes[1]; !strings.Contains(b.LastDecisionError, "invalid character") {
		t.Errorf("b's lastDecisionError = %q, want the parse error", b.LastDecisionError)
	}
	var text strings.Builder
	if err := r.Text(&text, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "last decision: cannot be read (annotation gpuslice.io/last-decision: invalid character") ||
		strings.Count(text.String(), "none recorded") != 1 {
		t.Errorf("text:\n%s\nwant b's record told unreadable, with its error, and a's as none recorded", text.String())
	}
}

// TestOOMKinds: a container's OOMs are summed over the counters' sources
// and kinds, and split by kind where there were any; an exporter without
// the kind label gives kind "".
func TestOOMKinds(t *testing.T) {
	s, err := ParseScrape("a", strings.NewReader(`gpuslice_gpu_memory_total_bytes{gpu="0",uuid="GPU-x"} 100
gpuslice_container_gpu_memory_used_bytes{namespace="ml",pod="capped",container="c",gpu="0",uuid="GPU-x"} 5
gpuslice_gpu_oom_events_total{namespace="ml",pod="capped",container="c",gpu="0",uuid="GPU-x",source="log",kind="process-cap"} 2
gpuslice_gpu_oom_events_total{namespace="ml",pod="capped",container="c",gpu="0",uuid="GPU-x",source="termination",kind="process-cap"} 1
gpuslice_gpu_oom_events_total{namespace="ml",pod="capped",container="c",gpu="0",uuid="GPU-x",source="log",kind="device"} 1
gpuslice_gpu_oom_events_total{namespace="ml",pod="capped",container="c",gpu="0",uuid="GPU-x",source="log",kind="encoder-session"} 0
gpuslice_gpu_oom_events_total{namespace="ml",pod="old",container="c",gpu="0",uuid="GPU-x",source="log"} 1
`))
	if err != nil {
		t.Fatal(err)
	}
	r := Build([]corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}}, map[string]Scrape{"a": s}, nil)
	got := map[string]Container{}
	for _, c := range r.Nodes[0].GPUs[0].Containers {
		got[c.Pod] = c
	}
	if c := got["capped"]; c.OOMs != 4 || !maps.Equal(c.OOMKinds, map[string]float64{"process-cap": 3, "device": 1}) {
		t.Errorf("capped: %v OOMs by kind %v, want 4, process-cap 3 and device 1", c.OOMs, c.OOMKinds)
	}
	if c := got["old"]; c.OOMs != 1 || !maps.Equal(c.OOMKinds, map[string]float64{"": 1}) {
		t.Errorf("old: %v OOMs by kind %v, want 1 of kind \"\"", c.OOMs, c.OOMKinds)
	}
}

// TestUnlisted: the --exporter names the API server does not list, each
// once and sorted.
func TestUnlisted(t *testing.T) {
	nodes := []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1"}}, {ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-2"}}}
	for _, tc := range []struct {
		name  string
		names []string
		want  []string
	}{
		{"all listed", []string{"gpu-node-2", "gpu-node-1"}, nil},
		{"a typo", []string{"gpu-node-1", "gpu-nod-2"}, []string{"gpu-nod-2"}},
		{"sorted, once", []string{"z", "gpu-node-1", "a", "z"}, []string{"a", "z"}},
		{"none given", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Unlisted(nodes, tc.names); !slices.Equal(got, tc.want) {
				t.Errorf("Unlisted(%q) = %q, want %q", tc.names, got, tc.want)
			}
		})
	}
}

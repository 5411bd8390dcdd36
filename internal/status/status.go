// Package status builds the terminal view of GPU sharing that
// `gpuslice-tuner status` prints: per node and GPU the replicas advertised
// and allocated, the memory used, each container's memory, SM share, OOMs
// and idle time, and the tuner's last decision with its reason. It joins
// what the API server says (nodes, the gpuslice.io/last-decision
// annotation) with one scrape of each node's gpuslice-exporter; Build is
// pure, so the view is tested from fixed inputs, and Text and JSON render
// the same Report.
package status

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/tuner/controller"
)

// Report is the whole view.
type Report struct {
	Nodes []Node `json:"nodes"`
	// RecentOOMs is set when the OOM counts of the last hour came from
	// Prometheus (SetRecentOOMs): then each container's OOMsLastHour is
	// set and the text view shows it instead of the counts since start.
	RecentOOMs bool `json:"recentOOMs,omitempty"`
}

// Node is one node: its GPU resources as the API server has them, the
// tuner's last decision, and the GPUs its exporter reported.
type Node struct {
	Name string `json:"name"`
	// Allocatable holds the node's GPU resources (names containing
	// "nvidia.com/gpu") from Node.status.allocatable.
	Allocatable  map[string]int64   `json:"allocatable"`
	LastDecision *controller.Record `json:"lastDecision,omitempty"`
	// LastDecisionError says why the node's last-decision annotation
	// cannot be read: the tuner leaves such a node alone until it parses,
	// which "none recorded" would hide.
	LastDecisionError string `json:"lastDecisionError,omitempty"`
	// ExporterError says why the node has no GPU detail: no exporter
	// given for it, or its scrape failed.
	ExporterError string `json:"exporterError,omitempty"`
	GPUs          []GPU  `json:"gpus"`
}

// GPU is one physical GPU as its exporter reported it.
type GPU struct {
	Index            string         `json:"index"`
	UUID             string         `json:"uuid"`
	MemoryUsedBytes  uint64         `json:"memoryUsedBytes"`
	MemoryTotalBytes uint64         `json:"memoryTotalBytes"`
	Replicas         map[string]int `json:"replicas"`
	Allocated        map[string]int `json:"allocated"`
	Containers       []Container    `json:"containers"`
}

// Container is one container holding or using the GPU.
type Container struct {
	Namespace   string `json:"namespace"`
	Pod         string `json:"pod"`
	Container   string `json:"container"`
	MemoryBytes uint64 `json:"memoryBytes"`
	// SMUtilization is absent where the GPU gives no per-process figure.
	SMUtilization *float64 `json:"smUtilization,omitempty"`
	// IdleSeconds is absent for a container that holds no replica ID.
	IdleSeconds *float64 `json:"idleSeconds,omitempty"`
	// OOMs counts the container's GPU OOM events since its exporter
	// started (the exporter's counters; Prometheus has the history).
	OOMs float64 `json:"ooms"`
	// OOMKinds splits OOMs by the counters' kind label: device (the GPU
	// ran out), process-cap (a limit of the container's own: a framework's
	// memory fraction, a CUDA MPS client's pinned limit), encoder-session,
	// unknown; "" from an exporter without the label. Only kinds with
	// events are listed.
	OOMKinds map[string]float64 `json:"oomKinds,omitempty"`
	// OOMsLastHour counts its GPU OOM events in the last hour, from
	// Prometheus (`gpuslice-tuner status --prometheus`); absent without.
	OOMsLastHour *float64 `json:"oomsLastHour,omitempty"`
}

// OOMKey names one container on one GPU of one node, for SetRecentOOMs.
type OOMKey struct{ Node, UUID, Namespace, Pod, Container string }

// SetRecentOOMs sets every container's OOMsLastHour from counts (0 for a
// container counts lacks), and lists a container counts has that the
// exporter no longer shows (it ended within the hour) with its count.
func (r *Report) SetRecentOOMs(counts map[OOMKey]float64) {
	r.RecentOOMs = true
	used := map[OOMKey]bool{}
	for i := range r.Nodes {
		n := &r.Nodes[i]
		for j := range n.GPUs {
			g := &n.GPUs[j]
			for k := range g.Containers {
				c := &g.Containers[k]
				key := OOMKey{n.Name, g.UUID, c.Namespace, c.Pod, c.Container}
				v := counts[key]
				c.OOMsLastHour = &v
				used[key] = true
			}
			for key, v := range counts {
				if used[key] || key.Node != n.Name || key.UUID != g.UUID || v == 0 {
					continue
				}
				g.Containers = append(g.Containers, Container{Namespace: key.Namespace, Pod: key.Pod, Container: key.Container, OOMsLastHour: &v})
				used[key] = true
			}
			sortContainers(g.Containers)
		}
	}
}

func sortContainers(cs []Container) {
	slices.SortFunc(cs, func(a, b Container) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Pod, b.Pod), strings.Compare(a.Container, b.Container))
	})
}

// Scrape is one exporter's /metrics, parsed.
type Scrape map[string]*dto.MetricFamily

// ParseScrape reads an exporter's /metrics in the Prometheus text format;
// source names it in the error.
func ParseScrape(source string, r io.Reader) (Scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", source, err)
	}
	return fams, nil
}

// Unlisted returns, sorted, the names that no node in nodes has. Build
// shows a scrape only under a node the API server lists, so the status
// command checks its --exporter names with it first: an exporter given
// under a mistyped name would otherwise vanish, and the node meant would
// read "no exporter given".
func Unlisted(nodes []corev1.Node, names []string) []string {
	listed := make(map[string]bool, len(nodes))
	for i := range nodes {
		listed[nodes[i].Name] = true
	}
	var out []string
	for _, n := range names {
		if !listed[n] {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Build joins the nodes and their scrapes. Nodes without a GPU resource
// and without a scrape are left out; errs holds a scrape failure by node.
// A scrape or error of a node that nodes lacks is not shown (see Unlisted).
func Build(nodes []corev1.Node, scrapes map[string]Scrape, errs map[string]error) Report {
	var r Report
	for i := range nodes {
		n := &nodes[i]
		out := Node{Name: n.Name, Allocatable: map[string]int64{}, GPUs: []GPU{}}
		for name, q := range n.Status.Allocatable {
			if strings.Contains(string(name), "nvidia.com/gpu") {
				out.Allocatable[string(name)] = q.Value()
			}
		}
		rec, err := controller.ParseRecord(n.Annotations[controller.AnnotationLastDecision])
		out.LastDecision = rec
		if err != nil {
			out.LastDecisionError = err.Error()
		}
		s, ok := scrapes[n.Name]
		switch {
		case errs[n.Name] != nil:
			out.ExporterError = errs[n.Name].Error()
		case !ok && len(out.Allocatable) == 0:
			continue
		case !ok:
			out.ExporterError = "no exporter given for this node"
		default:
			out.GPUs = gpus(s)
		}
		r.Nodes = append(r.Nodes, out)
	}
	slices.SortFunc(r.Nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	return r
}

func gpus(s Scrape) []GPU {
	byUUID := map[string]*GPU{}
	each := func(name string, f func(l map[string]string, v float64)) {
		fam := s[name]
		if fam == nil {
			return
		}
		// ExtractSamples reads gauges, counters and untyped series alike.
		samples, _ := expfmt.ExtractSamples(&expfmt.DecodeOptions{}, fam)
		for _, smp := range samples {
			l := make(map[string]string, len(smp.Metric))
			for k, v := range smp.Metric {
				l[string(k)] = string(v)
			}
			f(l, float64(smp.Value))
		}
	}
	each("gpuslice_gpu_memory_total_bytes", func(l map[string]string, v float64) {
		byUUID[l["uuid"]] = &GPU{Index: l["gpu"], UUID: l["uuid"], MemoryTotalBytes: uint64(v),
			Replicas: map[string]int{}, Allocated: map[string]int{}, Containers: []Container{}}
	})
	gpu := func(l map[string]string) *GPU { return byUUID[l["uuid"]] }
	each("gpuslice_gpu_memory_used_bytes", func(l map[string]string, v float64) {
		if g := gpu(l); g != nil {
			g.MemoryUsedBytes = uint64(v)
		}
	})
	each("gpuslice_gpu_replicas", func(l map[string]string, v float64) {
		if g := gpu(l); g != nil {
			g.Replicas[l["resource"]] = int(math.Round(v))
		}
	})
	each("gpuslice_gpu_replicas_allocated", func(l map[string]string, v float64) {
		if g := gpu(l); g != nil {
			g.Allocated[l["resource"]] = int(math.Round(v))
		}
	})
	type key struct{ uuid, ns, pod, c string }
	containers := map[key]*Container{}
	container := func(l map[string]string) *Container {
		if gpu(l) == nil {
			return nil
		}
		k := key{l["uuid"], l["namespace"], l["pod"], l["container"]}
		c := containers[k]
		if c == nil {
			c = &Container{Namespace: k.ns, Pod: k.pod, Container: k.c}
			containers[k] = c
		}
		return c
	}
	each("gpuslice_container_gpu_allocation", func(l map[string]string, _ float64) { container(l) })
	each("gpuslice_container_gpu_memory_used_bytes", func(l map[string]string, v float64) {
		if c := container(l); c != nil {
			c.MemoryBytes = uint64(v)
		}
	})
	each("gpuslice_container_gpu_utilization_ratio", func(l map[string]string, v float64) {
		if c := container(l); c != nil {
			c.SMUtilization = &v
		}
	})
	each("gpuslice_container_gpu_idle_seconds", func(l map[string]string, v float64) {
		if c := container(l); c != nil {
			c.IdleSeconds = &v
		}
	})
	// OOM counters exist from 0 for every watched container, including
	// ones that ended minutes ago: only those that counted one are shown.
	each("gpuslice_gpu_oom_events_total", func(l map[string]string, v float64) {
		if v == 0 {
			return
		}
		if c := container(l); c != nil {
			c.OOMs += v
			if c.OOMKinds == nil {
				c.OOMKinds = map[string]float64{}
			}
			c.OOMKinds[l["kind"]] += v
		}
	})
	for k, c := range containers {
		g := byUUID[k.uuid]
		g.Containers = append(g.Containers, *c)
	}
	out := make([]GPU, 0, len(byUUID))
	for _, g := range byUUID {
		sortContainers(g.Containers)
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b GPU) int {
		return cmp.Or(cmp.Compare(len(a.Index), len(b.Index)), strings.Compare(a.Index, b.Index))
	})
	return out
}

// JSON writes the report as one indented JSON document.
func (r Report) JSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Text writes the report as aligned plain text: per node its allocatable
// GPU resources, the tuner's last decision, a table of its GPUs and a table
// of the containers on them. now dates the decision. OOMS counts since each
// exporter started, OOMS(1H) (with RecentOOMs) the last hour; IDLE is the time since the container last ran a kernel
// on the GPU ("-" for a container that holds no replica of it).
func (r Report) Text(w io.Writer, now time.Time) error {
	for i, n := range r.Nodes {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "NODE %s  allocatable %s\n", n.Name, resources(n.Allocatable))
		switch d := n.LastDecision; {
		case n.LastDecisionError != "":
			fmt.Fprintf(w, "  last decision: cannot be read (annotation %s: %s); the tuner leaves this node alone until it parses\n",
				controller.AnnotationLastDecision, n.LastDecisionError)
		case d != nil:
			fmt.Fprintf(w, "  last decision %s ago: replicas %d (recommended %d), %s: %s\n",
				age(now.Sub(d.Time)), d.Replicas, d.Recommended, d.Reason, d.Message)
		default:
			fmt.Fprintln(w, "  last decision: none recorded")
		}
		if n.ExporterError != "" {
			fmt.Fprintf(w, "  exporter: %s\n", n.ExporterError)
			continue
		}
		gpus := [][]string{{"GPU", "UUID", "REPLICAS", "MEMORY"}}
		oomHeader := "OOMS"
		if r.RecentOOMs {
			oomHeader = "OOMS(1H)"
		}
		pods := [][]string{{"GPU", "POD", "CONTAINER", "MEMORY", "SM", oomHeader, "IDLE"}}
		for _, g := range n.GPUs {
			gpus = append(gpus, []string{g.Index, g.UUID, replicas(g), gib(g.MemoryUsedBytes) + " / " + gib(g.MemoryTotalBytes)})
			for _, c := range g.Containers {
				ooms := c.OOMs
				if r.RecentOOMs && c.OOMsLastHour != nil {
					ooms = *c.OOMsLastHour
				}
				pods = append(pods, []string{g.Index, c.Namespace + "/" + c.Pod, c.Container, gib(c.MemoryBytes),
					optional(c.SMUtilization, func(v float64) string { return fmt.Sprintf("%.0f%%", v*100) }),
					fmt.Sprintf("%.0f", ooms),
					optional(c.IdleSeconds, func(v float64) string { return age(time.Duration(v) * time.Second) })})
			}
		}
		if err := table(w, gpus); err != nil {
			return err
		}
		if len(pods) > 1 {
			if err := table(w, pods); err != nil {
				return err
			}
		}
	}
	return nil
}

// table writes rows aligned, indented by two spaces.
func table(w io.Writer, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, "  "+strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func resources(m map[string]int64) string {
	if len(m) == 0 {
		return "no GPU resource"
	}
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s=%d", n, m[n])
	}
	return strings.Join(parts, " ")
}

// replicas is "allocated/advertised" per resource.
func replicas(g GPU) string {
	names := make([]string, 0, len(g.Replicas))
	for n := range g.Replicas {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%d/%d", g.Allocated[n], g.Replicas[n])
		if len(names) > 1 {
			parts[i] += " " + n
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func gib(b uint64) string { return fmt.Sprintf("%.1fGiB", float64(b)/(1<<30)) }

func optional(v *float64, f func(float64) string) string {
	if v == nil {
		return "-"
	}
	return f(*v)
}

// age prints a duration the way kubectl's AGE column does, roughly.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

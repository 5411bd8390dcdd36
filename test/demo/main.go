// Command demo runs gpuslice on a simulated GPU node: no GPU, no cluster.
// It lays out the node (one RTX A6000 shared by four pods and a host
// process), serves a fake kubelet (PodResources over a unix socket, /pods over
// HTTP), starts the real gpuslice-exporter against it, runs the tuner's signal
// gathering and policy on the exporter's metrics (raising the replica count on
// headroom, then lowering it when a pod logs a CUDA out-of-memory error), and
// prints what the exporter reports and where to look. `make demo` runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpuslice/gpuslice/internal/tuner/policy"
	"github.com/gpuslice/gpuslice/test/simnode"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	bin := fs.String("exporter", "bin/gpuslice-exporter", "gpuslice-exporter binary")
	listen := fs.String("listen", "127.0.0.1:9846", "exporter listen address")
	dir := fs.String("dir", "", "where the simulated node's files go (default: a temporary directory)")
	once := fs.Bool("once", false, "print the report and exit instead of running until interrupted")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The exporter and the fake kubelet stop when run returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if *dir == "" {
		d, err := os.MkdirTemp("", "gpuslice-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		*dir = d
	}
	node, err := simnode.Demo("gpu-node-1", *dir)
	if err != nil {
		return err
	}
	// A notebook that imported its framework (a CUDA context, 0.5 GiB) and
	// has run nothing since: it holds a fifth replica without using it.
	g := node.GPUs[0]
	g.Replicas = 5
	node.Pods = append(node.Pods, &simnode.Pod{Namespace: "lab", Name: "jupyter-0", Containers: []*simnode.Container{{
		Name: "notebook", Replicas: map[string][]int{g.UUID: {4}},
		Processes: []simnode.Process{{PID: 2601, GPU: g.UUID, MemoryBytes: 512 << 20}},
	}}})
	if err := node.Start(ctx); err != nil {
		return err
	}

	exp := exec.CommandContext(ctx, *bin,
		"--web.listen-address="+*listen,
		"--gpu.backend=sim", "--sim.file="+node.SimFile(),
		"--path.procfs="+node.Procfs(), "--path.pod-logs="+node.PodLogs(),
		"--kubelet.pod-resources-socket="+node.PodResourcesSocket(),
		"--pods.source=kubelet", "--kubelet.url="+node.KubeletURL(), "--kubelet.token-file=",
		"--kubelet.pods-interval=1s", "--node-name=gpu-node-1", "--log.level=warn")
	logPath := filepath.Join(*dir, "exporter.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	exp.Stdout, exp.Stderr = logf, logf
	exp.Cancel = func() error { return exp.Process.Signal(os.Interrupt) }
	exp.WaitDelay = 5 * time.Second
	if err := exp.Start(); err != nil {
		return fmt.Errorf("starting %s (run `make build` first): %w", *bin, err)
	}
	defer func() {
		cancel()
		_ = exp.Wait()
	}()

	url := "http://" + *listen + "/metrics"
	if _, err := waitScrape(ctx, url, func(m map[string]*dto.MetricFamily) bool {
		return m["gpuslice_container_gpu_memory_used_bytes"] != nil
	}); err != nil {
		return fmt.Errorf("%w (exporter log: %s)", err, logPath)
	}
	fmt.Fprintf(out, "gpuslice-exporter is up at %s on a simulated RTX A6000 shared 5 ways.\n", url)

	// The tuner watches the node; every replica is taken and 30 GiB are
	// free, so after one window of headroom it raises the count.
	loop, err := newTunerLoop(node, url, out)
	if err != nil {
		return err
	}
	go func() { _ = loop.src.Run(ctx) }()
	fmt.Fprintf(out, "gpuslice-tuner watches it (window %s, cooldown %s: the defaults are 10m and 15m).\n", loop.cfg.Window, loop.cfg.Cooldown)
	if _, err := loop.until(ctx, 40*time.Second, func(d policy.Decision) bool { return d.Direction == "up" }); err != nil {
		return err
	}

	// A sixth pod takes the new replica and grows far past the footprints
	// seen so far; then the Real-ESRGAN pod runs out of GPU memory.
	node.Pods = append(node.Pods, &simnode.Pod{Namespace: "batch", Name: "llm-finetune-0", Containers: []*simnode.Container{{
		Name: "train", Replicas: map[string][]int{g.UUID: {4}},
		Processes: []simnode.Process{{PID: 2501, GPU: g.UUID, MemoryBytes: 28 * simnode.GiB, SM: 0.6}},
	}}})
	if err := node.Sync(); err != nil {
		return err
	}
	fmt.Fprintln(out, "A fine-tuning job takes the new replica and grows to 28 GiB; Real-ESRGAN then logs a CUDA OOM:")
	p, err := node.Pod("media", "esrgan-upscale-0")
	if err != nil {
		return err
	}
	if err := node.AppendLog(p, p.Containers[0], "Traceback (most recent call last):", simnode.PyTorchOOM); err != nil {
		return err
	}
	fmt.Fprintf(out, "  %s\n", simnode.PyTorchOOM[:76]+"…")
	if _, err := waitScrape(ctx, url, func(m map[string]*dto.MetricFamily) bool {
		return m["gpuslice_gpu_oom_events_total"] != nil
	}); err != nil {
		return fmt.Errorf("%w (exporter log: %s)", err, logPath)
	}
	if _, err := loop.until(ctx, 20*time.Second, func(d policy.Decision) bool { return d.Direction == "down" }); err != nil {
		return err
	}
	m, err := scrape(ctx, url)
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	report(out, m)
	fmt.Fprintln(out, "\nlab/jupyter-0 holds a replica and has run no kernel since the exporter first saw it (IDLE):")
	fmt.Fprintln(out, "  gpuslice_container_gpu_idle_seconds counts it; GPUSliceIdleGPUHolder fires once it has idled 4h on a full GPU,")
	fmt.Fprintln(out, "  and the tuner names it in the WaitingForReplica Event of a pod waiting for a replica.")
	fmt.Fprintf(out, "\nThe exporter is at %s\n", url)
	fmt.Fprintf(out, "  curl -s %s | grep ^gpuslice_container\n", url)
	fmt.Fprintf(out, "Simulated node files: %s (edit sim.yaml: the exporter re-reads it at every scrape)\n", *dir)
	if *once {
		return nil
	}
	fmt.Fprintln(out, "Press Ctrl-C to stop.")
	<-ctx.Done()
	return nil
}

func waitScrape(ctx context.Context, url string, ok func(map[string]*dto.MetricFamily) bool) (map[string]*dto.MetricFamily, error) {
	deadline := time.Now().Add(30 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		m, err := scrape(ctx, url)
		if err == nil && ok(m) {
			return m, nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if lastErr == nil {
		lastErr = errors.New("expected series did not appear")
	}
	return nil, fmt.Errorf("scraping %s: %w", url, lastErr)
}

func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func report(w io.Writer, m map[string]*dto.MetricFamily) {
	gib := func(v float64) string { return fmt.Sprintf("%.1f GiB", v/(1<<30)) }
	for _, s := range m["gpuslice_gpu_memory_total_bytes"].GetMetric() {
		l := labels(s)
		used := 0.0
		for _, u := range m["gpuslice_gpu_memory_used_bytes"].GetMetric() {
			if labels(u)["uuid"] == l["uuid"] {
				used = u.GetGauge().GetValue()
			}
		}
		fmt.Fprintf(w, "GPU %s %s: %s of %s used\n", l["gpu"], l["uuid"], gib(used), gib(s.GetGauge().GetValue()))
	}
	type row struct{ ns, pod, ctr, mem, sm, slots, ooms, idle string }
	rows := map[string]*row{}
	get := func(l map[string]string) *row {
		k := l["namespace"] + "/" + l["pod"] + "/" + l["container"]
		if rows[k] == nil {
			rows[k] = &row{ns: l["namespace"], pod: l["pod"], ctr: l["container"], mem: "-", sm: "-", slots: "-", ooms: "0", idle: "-"}
		}
		return rows[k]
	}
	for _, s := range m["gpuslice_container_gpu_memory_used_bytes"].GetMetric() {
		get(labels(s)).mem = gib(s.GetGauge().GetValue())
	}
	for _, s := range m["gpuslice_container_gpu_utilization_ratio"].GetMetric() {
		get(labels(s)).sm = fmt.Sprintf("%.0f%%", 100*s.GetGauge().GetValue())
	}
	for _, s := range m["gpuslice_container_gpu_allocation"].GetMetric() {
		get(labels(s)).slots = fmt.Sprintf("%g", s.GetGauge().GetValue())
	}
	for _, s := range m["gpuslice_container_gpu_idle_seconds"].GetMetric() {
		get(labels(s)).idle = (time.Duration(s.GetGauge().GetValue()) * time.Second).String()
	}
	ooms := map[*row]float64{} // summed over the sources and kinds
	for _, s := range m["gpuslice_gpu_oom_events_total"].GetMetric() {
		r := get(labels(s))
		ooms[r] += s.GetCounter().GetValue()
		r.ooms = fmt.Sprintf("%g", ooms[r])
	}
	keys := make([]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tPOD\tCONTAINER\tGPU MEMORY\tSM\tREPLICAS HELD\tGPU OOMS\tIDLE")
	for _, k := range keys {
		r := rows[k]
		fmt.Fprintln(tw, strings.Join([]string{r.ns, r.pod, r.ctr, r.mem, r.sm, r.slots, r.ooms, r.idle}, "\t"))
	}
	_ = tw.Flush()
	for _, s := range m["gpuslice_unattributed_gpu_memory_used_bytes"].GetMetric() {
		fmt.Fprintf(w, "Outside any pod on GPU %s: %s\n", labels(s)["gpu"], gib(s.GetGauge().GetValue()))
	}
}

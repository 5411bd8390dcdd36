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
	"net"
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
	listen := fs.String("listen", "", "exporter listen address (default: a free port on 127.0.0.1)")
	dir := fs.String("dir", "", "where the simulated node's files go (default: a temporary directory)")
	once := fs.Bool("once", false, "print the report and exit instead of running until interrupted")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The exporter and the fake kubelet stop when run returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A temporary directory goes when run returns: the exporter's log in it
	// is then shown on failure rather than pointed to.
	keepDir := *dir != ""
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
	addr, err := listenAddr(*listen)
	if err != nil {
		return err
	}

	exp := exec.CommandContext(ctx, *bin,
		"--web.listen-address="+addr,
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
	// The exporter may exit at any time (a taken port, a bad flag, a
	// crash). expCtx then ends with why, so that whatever waits on it (the
	// readiness scrape, the tuner, Ctrl-C) stops at once instead of polling
	// a dead address, or another server on it, until its deadline.
	expCtx, exited := context.WithCancelCause(ctx)
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		err := exp.Wait()
		if err == nil {
			err = errors.New("exit status 0")
		}
		exited(fmt.Errorf("%s exited: %w", *bin, err))
	}()
	defer func() {
		cancel()
		<-waited
	}()

	err = scenario(expCtx, node, scrapeURL(addr), *dir, *once, out)
	if ctx.Err() != nil {
		return err // interrupted: the exporter was told to stop
	}
	if cause := context.Cause(expCtx); cause != nil {
		err = cause // whatever failed, failed because the exporter was gone
	}
	if err == nil {
		return nil
	}
	// Read the log now: the deferred RemoveAll deletes a temporary one.
	where := "last lines"
	if keepDir {
		where = logPath
	}
	return fmt.Errorf("%w\nexporter log (%s):\n%s", err, where, logTail(logPath, 20))
}

// scenario is the demo proper, once the exporter runs at url. ctx ends when
// the exporter exits.
func scenario(ctx context.Context, node *simnode.Node, url, dir string, once bool, out io.Writer) error {
	if _, err := waitScrape(ctx, url, func(m map[string]*dto.MetricFamily) bool {
		return m["gpuslice_container_gpu_memory_used_bytes"] != nil
	}); err != nil {
		return err
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
	g := node.GPUs[0]
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
		return err
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
	fmt.Fprintf(out, "Simulated node files: %s (edit sim.yaml: the exporter re-reads it at every scrape)\n", dir)
	if once {
		return nil
	}
	fmt.Fprintln(out, "Press Ctrl-C to stop.")
	<-ctx.Done()
	return nil // run tells Ctrl-C from the exporter's exit
}

// listenAddr is the address the exporter listens on. By default a free
// loopback port, not the exporter's own 9846: that one may be held on this
// machine, by a real exporter (whose data the demo would then report) or
// anything else. A given address is bound once here, so that a taken one
// fails at once and says so, rather than as a scrape of whatever holds it.
// Between the check and the exporter's bind another process may still take
// the port; the exporter then exits and run reports why.
func listenAddr(want string) (string, error) {
	if want == "" {
		want = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", want)
	if err != nil {
		return "", fmt.Errorf("exporter listen address: %w (pass a free one with --listen, or none for any free port)", err)
	}
	defer l.Close()
	if _, port, _ := net.SplitHostPort(want); port == "0" {
		return l.Addr().String(), nil
	}
	return want, nil
}

// scrapeURL is the exporter's metrics URL on addr, which the demo prints for
// curl: an unspecified host (":9846", "0.0.0.0:…") is reached on loopback.
func scrapeURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/metrics"
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/metrics"
}

// logTail is the last n lines of the file at path, indented, or why it
// cannot be read.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "  " + err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return "  (empty)"
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
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
			return nil, context.Cause(ctx)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if lastErr == nil {
		lastErr = errors.New("expected series did not appear")
	}
	return nil, fmt.Errorf("scraping %s: %w", url, lastErr)
}

// client bounds each scrape: a server that accepts and never answers (the
// exporter wedged, or something else on the port) would otherwise hold the
// demo forever. The simulated node answers in milliseconds.
var client = &http.Client{Timeout: 5 * time.Second}

func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
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

// Command scrapecost measures what a scrape of gpuslice-exporter costs next
// to a scrape of Prometheus's node_exporter, in one run on one machine, so
// that the noise of a shared machine falls on both alike.
//
// It starts the big simulated node (test/simnode: 8 GPUs × 64 processes,
// 110 pods, scaled with -procs and -replicas), node_exporter with its
// default collectors, and gpuslice-exporter on the simulated node; scrapes
// each in turn (the order alternating) in rounds; and prints per scrape the
// CPU time each process spent (from /proc/<pid>/stat), the wall time, the
// lines served, and afterwards each one's resident memory. The simulated
// GPU backend reads and compares its YAML file at every scrape, work that
// NVML does not cost a user; it is measured separately in this process and
// subtracted, so the last row is the exporter's own cost.
//
//	make bench-scrape              # builds the exporter, installs node_exporter if missing
//	go run ./test/bench/scrapecost -exporter bin/gpuslice-exporter -scrapes 1000
//	go run ./test/bench/scrapecost -as-prometheus   # OpenMetrics and gzip, as Prometheus asks
package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuslice/gpuslice/internal/gpu/sim"
	"github.com/gpuslice/gpuslice/test/simnode"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat. The kernel
// reports them in USER_HZ, which is 100 on every Linux architecture's
// user-space ABI whatever the kernel's own tick rate.
const userHZ = 100

type options struct {
	exporter, nodeExporter string
	scrapes, rounds        int
	warmup                 int
	scale                  simnode.Scale
	asPrometheus           bool
}

// Headers of a scrape: the text format uncompressed, or, with
// -as-prometheus, what Prometheus 2 and 3 send by default (OpenMetrics
// first, gzip).
const (
	acceptText           = "text/plain;version=0.0.4"
	acceptPrometheus     = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
	encodingPrometheus   = "gzip"
	encodingUncompressed = "identity"
)

func main() {
	var o options
	flag.StringVar(&o.exporter, "exporter", "bin/gpuslice-exporter", "gpuslice-exporter binary to measure.")
	flag.StringVar(&o.nodeExporter, "node-exporter", "/usr/bin/prometheus-node-exporter", "node_exporter binary to compare with.")
	flag.IntVar(&o.scrapes, "scrapes", 1000, "Scrapes of each exporter, in all rounds together.")
	flag.IntVar(&o.rounds, "rounds", 5, "Rounds the scrapes are split into; each round is reported, to show the noise.")
	flag.IntVar(&o.warmup, "warmup", 20, "Scrapes of each before measuring (caches, connections, heap growth).")
	flag.IntVar(&o.scale.Processes, "procs", 1, "Multiply the simulated node's GPU processes (and their pods) by this.")
	flag.IntVar(&o.scale.Replicas, "replicas", 1, "Multiply the replicas each simulated GPU advertises by this.")
	flag.BoolVar(&o.asPrometheus, "as-prometheus", false, "Scrape with Prometheus's default Accept (OpenMetrics first) and Accept-Encoding (gzip) instead of the uncompressed text format.")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "scrapecost:", err)
		os.Exit(1)
	}
}

// target is one exporter process being measured.
type target struct {
	name string
	cmd  *exec.Cmd
	url  string
	// want is a string every scrape must contain: an exporter that
	// answers with errors must not look cheap.
	want string
	// accept and encoding are the request's Accept and Accept-Encoding.
	accept, encoding string

	cpuTicks uint64
	wall     time.Duration
	lines    int
	bytes    int
}

func run(o options) error {
	if o.scrapes < o.rounds || o.rounds < 1 || o.warmup < 0 {
		return fmt.Errorf("need -scrapes >= -rounds >= 1 and -warmup >= 0 (got %d, %d, %d)", o.scrapes, o.rounds, o.warmup)
	}
	for _, bin := range []string{o.exporter, o.nodeExporter} {
		if err := evict(bin); err != nil {
			return fmt.Errorf("binary: %w", err)
		}
	}
	dir, err := os.MkdirTemp("", "scrapecost-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node, err := simnode.BigScaled(filepath.Join(dir, "node"), o.scale)
	if err != nil {
		return fmt.Errorf("simulated node: %w", err)
	}
	if err := node.Start(ctx); err != nil {
		return fmt.Errorf("simulated node: %w", err)
	}
	if err := node.Age(time.Hour); err != nil {
		return fmt.Errorf("simulated node: %w", err)
	}

	neAddr, err := freeAddr()
	if err != nil {
		return err
	}
	ne := &target{name: "node_exporter", url: "http://" + neAddr + "/metrics", want: "node_cpu_seconds_total{",
		cmd: exec.CommandContext(ctx, o.nodeExporter, "--web.listen-address="+neAddr, "--log.level=error")}
	gsAddr, err := freeAddr()
	if err != nil {
		return err
	}
	gs := &target{name: "gpuslice-exporter", url: "http://" + gsAddr + "/metrics", want: "gpuslice_container_gpu_memory_used_bytes{",
		cmd: exec.CommandContext(ctx, o.exporter, "--web.listen-address="+gsAddr, "--gpu.backend=sim", "--sim.file="+node.SimFile(),
			"--path.procfs="+node.Procfs(), "--path.pod-logs="+node.PodLogs(), "--kubelet.pod-resources-socket="+node.PodResourcesSocket(),
			"--pods.source=kubelet", "--kubelet.url="+node.KubeletURL(), "--kubelet.token-file=", "--log.level=error")}
	targets := []*target{ne, gs}
	for _, t := range targets {
		t.accept, t.encoding = acceptText, encodingUncompressed
		if o.asPrometheus {
			t.accept, t.encoding = acceptPrometheus, encodingPrometheus
		}
	}
	// node_exporter logs every failing collector at every scrape (systemd
	// without D-Bus, here); gpuslice-exporter logs only errors.
	ne.cmd.Stderr = io.Discard
	gs.cmd.Stderr = os.Stderr
	for _, t := range targets {
		if err := t.cmd.Start(); err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		defer func() { cancel(); _ = t.cmd.Wait() }()
	}
	client := &http.Client{Timeout: 30 * time.Second}
	for _, t := range targets {
		if err := t.ready(client, 30*time.Second); err != nil {
			return err
		}
		for i := 0; i < o.warmup; i++ {
			if err := t.scrape(client); err != nil {
				return err
			}
		}
		t.wall, t.lines, t.bytes = 0, 0, 0
	}

	fmt.Printf("side by side: %d scrapes each in %d rounds, node: %d GPUs, %d GPU processes, %d pods, %d replicas per GPU\n",
		o.scrapes, o.rounds, len(node.GPUs), countProcs(node), len(node.Pods), node.GPUs[0].Replicas)
	fmt.Printf("Accept: %s; Accept-Encoding: %s\n", ne.accept, ne.encoding)
	fmt.Printf("%-6s %18s %18s %8s\n", "round", ne.name+" CPU ms", gs.name+" CPU ms", "ratio")
	for r := 0; r < o.rounds; r++ {
		n := o.scrapes / o.rounds
		if r < o.scrapes%o.rounds {
			n++
		}
		before := make([]uint64, len(targets))
		for i, t := range targets {
			if before[i], err = cpuTicks(t.cmd.Process.Pid); err != nil {
				return err
			}
		}
		for i := 0; i < n; i++ {
			// Alternate who goes first, so neither always scrapes right
			// after the other's burst of work.
			for j := range targets {
				if err := targets[(i+j)%len(targets)].scrape(client); err != nil {
					return err
				}
			}
		}
		round := make([]float64, len(targets))
		for i, t := range targets {
			after, err := cpuTicks(t.cmd.Process.Pid)
			if err != nil {
				return err
			}
			t.cpuTicks += after - before[i]
			round[i] = ticksMs(after-before[i]) / float64(n)
		}
		fmt.Printf("%-6d %18.2f %18.2f %8.2f\n", r+1, round[0], round[1], round[1]/round[0])
	}

	simMs, err := simCost(node.SimFile(), o.scrapes)
	if err != nil {
		return err
	}
	fmt.Println()
	fmt.Printf("%-30s %9s %9s %7s %9s %9s %9s %9s %6s\n",
		"per scrape", "CPU ms", "wall ms", "lines", "KiB", "RSS MiB", "RssAnon", "RssFile", "ratio")
	neCPU := ticksMs(ne.cpuTicks) / float64(o.scrapes)
	for _, t := range targets {
		m, err := memory(t.cmd.Process.Pid)
		if err != nil {
			return err
		}
		cpu := ticksMs(t.cpuTicks) / float64(o.scrapes)
		fmt.Printf("%-30s %9.2f %9.2f %7d %9.1f %9.1f %9.1f %9.1f %6.2f\n", t.name, cpu,
			float64(t.wall.Microseconds())/1e3/float64(o.scrapes), t.lines/o.scrapes, float64(t.bytes)/1024/float64(o.scrapes),
			m["VmRSS"], m["RssAnon"], m["RssFile"], cpu/neCPU)
	}
	gsCPU := ticksMs(gs.cpuTicks) / float64(o.scrapes)
	fmt.Printf("%-30s %9.2f\n", "  of which sim backend", simMs)
	fmt.Printf("%-30s %9.2f %59s %6.2f\n", "gpuslice-exporter without sim", gsCPU-simMs, "", (gsCPU-simMs)/neCPU)
	for _, t := range targets {
		if fi, err := os.Stat(t.cmd.Path); err == nil {
			fmt.Printf("binary %s: %.1f MiB\n", t.name, float64(fi.Size())/(1<<20))
		}
	}
	return nil
}

// evict drops a binary's pages from the page cache, so that both programs
// start as on a node that has not run them yet: a file just written (a
// fresh build) sits in the cache in large folios that are mapped whole at
// the first touch, and RssFile would then show the whole binary instead of
// the pages the program uses.
func evict(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	// Dirty pages are not dropped: write a fresh build back first.
	if err := f.Sync(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("%s: dropping its cached pages: %w", path, err)
	}
	return nil
}

func countProcs(n *simnode.Node) int {
	c := 0
	for _, p := range n.Pods {
		for _, ctr := range p.Containers {
			c += len(ctr.Processes)
		}
	}
	return c
}

func (t *target) ready(client *http.Client, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := t.scrape(client)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer in %s: %w", t.name, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// scrape fetches the metrics once with the target's headers, and counts
// the samples; KiB are those sent, compressed or not.
func (t *target) scrape(client *http.Client) error {
	start := time.Now()
	req, err := http.NewRequest(http.MethodGet, t.url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", t.accept)
	req.Header.Set("Accept-Encoding", t.encoding)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", t.name, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	sent := len(body)
	if err == nil && resp.Header.Get("Content-Encoding") == "gzip" {
		var zr *gzip.Reader
		if zr, err = gzip.NewReader(bytes.NewReader(body)); err == nil {
			body, err = io.ReadAll(zr)
		}
	}
	t.wall += time.Since(start)
	if err != nil {
		return fmt.Errorf("%s: %w", t.name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", t.name, resp.Status)
	}
	if !bytes.Contains(body, []byte(t.want)) {
		return fmt.Errorf("%s: the scrape has no %s series", t.name, strings.TrimSuffix(t.want, "{"))
	}
	t.bytes += sent
	for line := range bytes.Lines(body) {
		if len(line) > 0 && line[0] != '#' {
			t.lines++
		}
	}
	return nil
}

// cpuTicks is the user plus system CPU time of pid, in USER_HZ ticks
// (fields 14 and 15 of /proc/<pid>/stat, counted after the command name,
// which may hold spaces and parentheses).
func cpuTicks(pid int) (uint64, error) {
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no command name", path)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: %d fields", path, len(f)+2)
	}
	var sum uint64
	for _, s := range f[11:13] { // fields 14 (utime) and 15 (stime)
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		sum += v
	}
	return sum, nil
}

func ticksMs(t uint64) float64 { return float64(t) * 1000 / userHZ }

// memory reads the resident set lines of /proc/<pid>/status, in MiB.
func memory(pid int) (map[string]float64, error) {
	path := "/proc/" + strconv.Itoa(pid) + "/status"
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || !strings.HasPrefix(key, "VmRSS") && !strings.HasPrefix(key, "Rss") {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, key, err)
		}
		m[key] = kb / 1024
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if _, ok := m["RssAnon"]; !ok {
		return nil, errors.New(path + ": no RssAnon line")
	}
	return m, nil
}

// simCost is the CPU milliseconds the sim backend spends per scrape (one
// Snapshot and one Xids, as the exporter calls them), measured in this
// process, which is otherwise idle now.
func simCost(file string, n int) (float64, error) {
	b := sim.New(file)
	ctx := context.Background()
	if _, err := b.Snapshot(ctx); err != nil {
		return 0, err
	}
	before, err := selfCPU()
	if err != nil {
		return 0, err
	}
	for i := 0; i < n; i++ {
		if _, err := b.Snapshot(ctx); err != nil {
			return 0, err
		}
		b.Xids()
	}
	after, err := selfCPU()
	if err != nil {
		return 0, err
	}
	return float64((after - before).Microseconds()) / 1e3 / float64(n), nil
}

func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

package exporter

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpuslice/gpuslice/dashboards/metricnames"
	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/test/simnode"
)

// TestMPS: on a GPU shared through MPS the server's memory is its own
// series, the clients' memory is their containers', no container has a
// utilization there, and each container's pinned limit comes from its
// processes' environment; a time-sliced GPU beside it is unchanged. An
// out-of-memory of a client with a pinned limit, CUDA's ordinary message,
// counts as kind process-cap, also when its processes have exited by the
// time the line is read; one of a client without a limit, or of the
// time-sliced container, as device.
func TestMPS(t *testing.T) {
	n, err := simnode.New("mps-node", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	g0, g1 := simnode.GPUUUID("mps-node", 0), simnode.GPUUUID("mps-node", 1)
	n.GPUs = []*simnode.GPU{
		{UUID: g0, MemoryBytes: 48 << 30, Replicas: 4, Utilization: 0.9,
			HostProcesses: []simnode.Process{{PID: 900, GPU: g0, MemoryBytes: 66 << 20, SM: 0.9, MPSServer: true}}},
		{UUID: g1, MemoryBytes: 48 << 30, Replicas: 2, Utilization: 0.3},
	}
	limit := "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=12288M"
	n.Pods = []*simnode.Pod{
		{Namespace: "ml", Name: "train", Containers: []*simnode.Container{{Name: "torch", Replicas: map[string][]int{g0: {0}},
			Processes: []simnode.Process{
				{PID: 3001, GPU: g0, MemoryBytes: 5 << 30, Environ: []string{"PATH=/bin", limit}},
				{PID: 3002, GPU: g0, MemoryBytes: 1 << 30, Environ: []string{limit}},
			}}}},
		{Namespace: "ml", Name: "nolimit", Containers: []*simnode.Container{{Name: "jax", Replicas: map[string][]int{g0: {1}},
			Processes: []simnode.Process{{PID: 3101, GPU: g0, MemoryBytes: 2 << 30}}}}},
		{Namespace: "ml", Name: "sliced", Containers: []*simnode.Container{{Name: "app", Replicas: map[string][]int{g1: {0}},
			Processes: []simnode.Process{{PID: 3201, GPU: g1, MemoryBytes: 3 << 30, SM: 0.25}}}}},
		// A client that fails at its limit as it starts: no scrape ever
		// sees its process (as on a real H200 under make test-gpu).
		{Namespace: "ml", Name: "fresh", Containers: []*simnode.Container{{Name: "torch", Replicas: map[string][]int{g0: {2}}}}},
	}
	_, reg := exporterWithOOM(t, n)

	want := fmt.Sprintf(`
# HELP gpuslice_container_gpu_memory_limit_bytes %[3]s
# TYPE gpuslice_container_gpu_memory_limit_bytes gauge
gpuslice_container_gpu_memory_limit_bytes{container="torch",gpu="0",namespace="ml",pod="train",uuid="%[1]s"} 2.5769803776e+10
# HELP gpuslice_container_gpu_memory_used_bytes GPU memory used by the container's processes on this physical GPU, counted once however many replica IDs it holds.
# TYPE gpuslice_container_gpu_memory_used_bytes gauge
gpuslice_container_gpu_memory_used_bytes{container="app",gpu="1",namespace="ml",pod="sliced",uuid="%[2]s"} 3.221225472e+09
gpuslice_container_gpu_memory_used_bytes{container="jax",gpu="0",namespace="ml",pod="nolimit",uuid="%[1]s"} 2.147483648e+09
gpuslice_container_gpu_memory_used_bytes{container="torch",gpu="0",namespace="ml",pod="train",uuid="%[1]s"} 6.442450944e+09
# HELP gpuslice_container_gpu_utilization_ratio Share of the GPU's SMs the container's processes kept busy since the previous reading, over the window of gpuslice_gpu_utilization_ratio (0..1); a GPU's containers add up to no more than it.
# TYPE gpuslice_container_gpu_utilization_ratio gauge
gpuslice_container_gpu_utilization_ratio{container="app",gpu="1",namespace="ml",pod="sliced",uuid="%[2]s"} 0.25
# HELP gpuslice_gpu_mps_server_memory_used_bytes %[4]s
# TYPE gpuslice_gpu_mps_server_memory_used_bytes gauge
gpuslice_gpu_mps_server_memory_used_bytes{gpu="0",uuid="%[1]s"} 6.9206016e+07
# HELP gpuslice_unattributed_gpu_memory_used_bytes GPU memory used by processes that belong to no known pod container (host processes, pods not known yet).
# TYPE gpuslice_unattributed_gpu_memory_used_bytes gauge
gpuslice_unattributed_gpu_memory_used_bytes{gpu="0",uuid="%[1]s"} 0
gpuslice_unattributed_gpu_memory_used_bytes{gpu="1",uuid="%[2]s"} 0
`, g0, g1, containerMemLimit.help, gpuMPSServerMem.help)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"gpuslice_container_gpu_memory_limit_bytes", "gpuslice_container_gpu_memory_used_bytes", "gpuslice_container_gpu_utilization_ratio",
		"gpuslice_gpu_mps_server_memory_used_bytes", "gpuslice_unattributed_gpu_memory_used_bytes"); err != nil {
		t.Error(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, name := range metricnames.ExporterMPS {
		if !got[name] {
			t.Errorf("dashboards/metricnames.ExporterMPS lists %s, which the MPS node's scrape lacks", name)
		}
	}

	// The capped client exits at its limit before the OOM line is read:
	// its processes are gone, the container's cap is remembered.
	train, _ := n.Pod("ml", "train")
	train.Containers[0].Processes = nil
	if err := n.Sync(); err != nil {
		t.Fatal(err)
	}
	logAndScrape(t, n, reg, []podLine{
		{"train", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 114.20 GiB is free."},
		{"nolimit", "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 21474836480 bytes."},
		{"sliced", simnode.PyTorchOOM},
		{"fresh", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 52.60 GiB. GPU 0 has a total capacity of 139.80 GiB of which 130.20 GiB is free."},
	})
	if l := lines(t, reg, "gpuslice_container_gpu_memory_limit_bytes"); len(l) != 0 {
		t.Errorf("a limit series for a container without processes: %v", l)
	}
	for _, c := range []struct{ pod, gpu, kind string }{{"train", g0, "process-cap"}, {"nolimit", g0, "device"}, {"sliced", g1, "device"}, {"fresh", g0, "process-cap"}} {
		all := lines(t, reg, "gpuslice_gpu_oom_events_total", `pod="`+c.pod+`"`, `uuid="`+c.gpu+`"`)
		if len(all) != 2 || !strings.Contains(all[0], `kind="`+c.kind+`"`) || !strings.Contains(all[1], `kind="`+c.kind+`"`) {
			t.Errorf("%s: OOM series %v, want 2 (log, termination) of kind %s", c.pod, all, c.kind)
		}
		for _, l := range all {
			want := " 0"
			if strings.Contains(l, `source="log"`) && strings.Contains(l, `kind="`+c.kind+`"`) {
				want = " 1"
			}
			if !strings.HasSuffix(l, want) {
				t.Errorf("%s: %s, want%s", c.pod, l, want)
			}
		}
	}
}

func TestMPSServerByCmdline(t *testing.T) {
	procfs := t.TempDir()
	for pid, argv0 := range map[int]string{10: "/usr/bin/nvidia-cuda-mps-server", 11: "nvidia-cuda-mps-control", 12: "python3"} {
		dir := filepath.Join(procfs, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(argv0+"\x00-d\x00"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e := &Exporter{cfg: Config{Procfs: procfs}, proc: newProcReader(procfs, slog.New(slog.DiscardHandler))}
	for pid, want := range map[int]bool{10: true, 11: false, 12: false, 13: false} {
		if got := e.isMPSServer(gpu.Process{PID: pid}); got != want {
			t.Errorf("isMPSServer(%d) = %v, want %v", pid, got, want)
		}
	}
}

// A process the reader follows has its command line read once in its
// life; one it does not follow, at every ask.
func TestProgramReadOncePerProcess(t *testing.T) {
	p := newProcReader("/proc", slog.New(slog.DiscardHandler))
	defer p.forget(nil)
	self := os.Getpid()
	if _, _, err := p.read([]gpu.Device{{Processes: []gpu.Process{{PID: self}}}}); err != nil {
		t.Fatal(err)
	}
	if p.known[self] == nil {
		t.Skip("this /proc lets the reader follow no process")
	}
	reads := 0
	test := func(cmdline []byte) bool { reads++; return len(cmdline) > 0 }
	for range 3 {
		if !p.program(self, test) {
			t.Fatal("own command line read as empty")
		}
	}
	if reads != 1 {
		t.Errorf("command line read %d times for a followed process, want 1", reads)
	}
	p.forget(nil)
	p.program(self, test)
	p.program(self, test)
	if reads != 3 {
		t.Errorf("command line read %d times in all, want 3 (twice once the process is not followed)", reads)
	}
}

func TestParsePinnedLimitEnv(t *testing.T) {
	for _, tc := range []struct {
		env     string
		want    uint64
		known   limitKnown
		invalid bool
	}{
		{"A=1\x00CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10G\x00", 10 << 30, limitPinned, false},
		{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-a=1G,0=2G\x00", 1 << 30, limitPinned, false},
		{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1G,1=2G\x00", 0, limitNone, false}, // limits on other GPUs
		{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=junk\x00", 0, limitUnknown, true},    // a limit, of unknown size
		{"XCUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1G\x00", 0, limitNone, false},
		{"A=1\x00", 0, limitNone, false},
	} {
		got, known, err := parsePinnedLimitEnv([]byte(tc.env), "GPU-a")
		if got != tc.want || known != tc.known || (err != nil) != tc.invalid {
			t.Errorf("parsePinnedLimitEnv(%q) = %d, %v, %v; want %d, %v (an error: %v)", tc.env, got, known, err, tc.want, tc.known, tc.invalid)
		}
	}
}

// TestMPSClientSeenExiting: a client NVML still lists as it exits, whose
// /proc entry is a zombie's (state Z, an empty environ), says nothing of
// its limit: its container is neither capped nor uncapped by it, and its
// OOM on a GPU running an MPS server counts as process-cap, as for a
// client never seen (a real H200 under make test-gpu scraped one so, and
// the OOM was counted as kind device).
func TestMPSClientSeenExiting(t *testing.T) {
	n, err := simnode.New("mps-node", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	g0 := simnode.GPUUUID("mps-node", 0)
	n.GPUs = []*simnode.GPU{{UUID: g0, MemoryBytes: 48 << 30, Replicas: 4, Utilization: 0.9,
		HostProcesses: []simnode.Process{{PID: 900, GPU: g0, MemoryBytes: 66 << 20, SM: 0.9, MPSServer: true}}}}
	n.Pods = []*simnode.Pod{
		{Namespace: "ml", Name: "dying", Containers: []*simnode.Container{{Name: "torch", Replicas: map[string][]int{g0: {0}},
			Processes: []simnode.Process{{PID: 3301, GPU: g0, MemoryBytes: 500 << 20,
				Environ: []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=12288M"}}}}}},
		{Namespace: "ml", Name: "open", Containers: []*simnode.Container{{Name: "jax", Replicas: map[string][]int{g0: {1}},
			Processes: []simnode.Process{{PID: 3401, GPU: g0, MemoryBytes: 2 << 30}}}}},
	}
	_, reg := exporterWithOOM(t, n)

	// The kernel's view of an exiting process: its memory (and with it the
	// environment) gone, its state Z until its parent reaps it.
	dir := filepath.Join(n.Procfs(), "3301")
	if err := os.WriteFile(filepath.Join(dir, "environ"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(strings.Replace(string(stat), ") S ", ") Z ", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if l := lines(t, reg, "gpuslice_container_gpu_memory_limit_bytes"); len(l) != 0 {
		t.Errorf("a limit series from a zombie's empty environment: %v", l)
	}
	logAndScrape(t, n, reg, []podLine{
		{"dying", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 52.60 GiB. GPU 0 has a total capacity of 47.99 GiB of which 45.20 GiB is free."},
		{"open", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 52.60 GiB. GPU 0 has a total capacity of 47.99 GiB of which 45.20 GiB is free."},
	})
	for _, c := range []struct{ pod, kind string }{{"dying", "process-cap"}, {"open", "device"}} {
		got := lines(t, reg, "gpuslice_gpu_oom_events_total", `pod="`+c.pod+`"`, `source="log"`, `kind="`+c.kind+`"`)
		if len(got) != 1 || !strings.HasSuffix(got[0], " 1") {
			t.Errorf("%s: %v, want one OOM of kind %s", c.pod, got, c.kind)
		}
	}
}

// podLine is a line a pod of namespace ml writes to its first container's
// log.
type podLine struct{ pod, line string }

// logAndScrape writes each line to its pod's log and scrapes reg once.
func logAndScrape(t *testing.T, n *simnode.Node, reg *prometheus.Registry, lines []podLine) {
	t.Helper()
	for _, l := range lines {
		p, _ := n.Pod("ml", l.pod)
		if err := n.AppendLog(p, p.Containers[0], l.line); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

// TestMPSServerStartedBetweenScrapes: a client that fails at its limit as
// it starts is never seen by a scrape, and may be the first the GPU's MPS
// server serves since the last one (the control daemon starts the server
// for its first client). The OOM watch reads its log before the next
// scrape: the OOM counts as process-cap, the GPU asked whether it runs a
// server then; one read while none runs stays device. On a real H200 the
// watch had counted such an OOM as device, by the last scrape's reading.
func TestMPSServerStartedBetweenScrapes(t *testing.T) {
	n, err := simnode.New("mps-node", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	g0 := simnode.GPUUUID("mps-node", 0)
	n.GPUs = []*simnode.GPU{{UUID: g0, MemoryBytes: 48 << 30, Replicas: 4}}
	n.Pods = []*simnode.Pod{
		{Namespace: "ml", Name: "before", Containers: []*simnode.Container{{Name: "torch", Replicas: map[string][]int{g0: {0}}}}},
		{Namespace: "ml", Name: "after", Containers: []*simnode.Container{{Name: "torch", Replicas: map[string][]int{g0: {1}}}}},
	}
	e, reg := exporterWithOOM(t, n)
	if _, err := reg.Gather(); err != nil { // no server yet
		t.Fatal(err)
	}
	ctx := context.Background()
	e.watchOnce(ctx)
	oomLine := func(pod string) {
		t.Helper()
		p, _ := n.Pod("ml", pod)
		if err := n.AppendLog(p, p.Containers[0], "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 52.60 GiB."); err != nil {
			t.Fatal(err)
		}
		e.watchOnce(ctx)
	}
	oomLine("before")
	n.GPUs[0].HostProcesses = []simnode.Process{{PID: 900, GPU: g0, MemoryBytes: 66 << 20, MPSServer: true}}
	if err := n.Sync(); err != nil {
		t.Fatal(err)
	}
	oomLine("after")
	for _, c := range []struct{ pod, kind string }{{"before", "device"}, {"after", "process-cap"}} {
		got := lines(t, reg, "gpuslice_gpu_oom_events_total", `pod="`+c.pod+`"`, `source="log"`, `kind="`+c.kind+`"`)
		if len(got) != 1 || !strings.HasSuffix(got[0], " 1") {
			t.Errorf("%s: %v, want one OOM of kind %s", c.pod, got, c.kind)
		}
	}
}

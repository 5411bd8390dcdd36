package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"gopkg.in/yaml.v3"

	"github.com/gpuslice/gpuslice/internal/gpu"
	nvmlbackend "github.com/gpuslice/gpuslice/internal/gpu/nvml"
	"github.com/gpuslice/gpuslice/internal/gpu/sim"
	"github.com/gpuslice/gpuslice/internal/testproc"
)

// hackBuild runs a hack/ build script and returns the path it made.
func hackBuild(t testing.TB, script string) string { return testproc.Hack(t, script) }

// simLibraryDir builds libnvidia-ml.so.1 from the simulated GPU when it is
// missing or stale and returns its directory, for LD_LIBRARY_PATH.
func simLibraryDir(t testing.TB) string {
	return filepath.Dir(hackBuild(t, "libnvml.sh"))
}

// writeSim writes f as a sim file at path, atomically.
func writeSim(t testing.TB, path string, f *sim.File) {
	t.Helper()
	b, err := yaml.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

// libnvmlScenario is a node with what both backends must agree on: a busy
// GPU with processes (one without an SM sample) and Xid events, an idle
// GPU with memory used outside any process, and a GPU in error.
func libnvmlScenario() *sim.File {
	return &sim.File{
		DriverVersion: "580.95.05",
		GPUs: []sim.GPU{
			{UUID: "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348", Name: "NVIDIA RTX A6000", MemoryTotalBytes: 51527024640,
				Utilization: 0.42, TemperatureCelsius: 61, PowerWatts: 180.25,
				XidEvents: []sim.XidEvent{{Xid: 79}, {Xid: 13}, {Xid: 79}},
				Processes: []sim.Process{
					{PID: 4242, UsedMemoryBytes: 4 << 30, SMUtilization: ptr(0.3)},
					{PID: 4343, UsedMemoryBytes: 1 << 30},
					{PID: 4444, UsedMemoryBytes: 2 << 30, SMUtilization: ptr(0.0)},
				}},
			{UUID: "GPU-0c3f7a64-11aa-4b2e-9d1c-0123456789ab", Name: "NVIDIA RTX A6000", MemoryTotalBytes: 51527024640,
				MemoryUsedBytes: ptr(uint64(512 << 20)), TemperatureCelsius: 35, PowerWatts: 22,
				// A card without a power sensor: NOT_SUPPORTED through the
				// library, no series from either backend.
				Unsupported: []string{"power"}},
			{UUID: "GPU-deadbeef-0000-4000-8000-000000000002", Name: "NVIDIA RTX A6000", MemoryTotalBytes: 51527024640,
				Error: "GPU has fallen off the bus", XidEvents: []sim.XidEvent{{Xid: 79}}},
		},
	}
}

// TestLibnvmlExporterMatchesSim runs gpuslice-exporter twice on one sim
// file, once with --gpu.backend=sim and once with --gpu.backend=nvml over
// the simulated libnvidia-ml, and checks that every gpuslice_ series but
// the collectors' durations is the same, before and after the file
// changes; then it scrapes the nvml one 1,000 times from 4 clients (two Go
// runtimes in one process, under load) and compares again.
func TestLibnvmlExporterMatchesSim(t *testing.T) {
	libDir := simLibraryDir(t)
	exporter := binary(t, "cmd/exporter")
	simFile := filepath.Join(t.TempDir(), "gpus.yaml")
	f := libnvmlScenario()
	writeSim(t, simFile, f)

	urls := map[string]string{}
	for _, backend := range []string{"sim", "nvml"} {
		addr := freeAddr(t)
		startEnv(t, []string{"GPUSLICE_SIM_FILE=" + simFile, "LD_LIBRARY_PATH=" + libDir}, exporter,
			"--web.listen-address="+addr, "--gpu.backend="+backend, "--sim.file="+simFile,
			"--kubelet.pod-resources-socket=", "--pods.source=none", "--path.pod-logs="+t.TempDir())
		urls[backend] = "http://" + addr + "/metrics"
	}
	same := func(want map[string]float64) func() string {
		return func() string {
			got := map[string]string{}
			for backend, url := range urls {
				m, err := scrape(url)
				if err != nil {
					return err.Error()
				}
				got[backend] = seriesText(m)
				if backend != "nvml" {
					continue
				}
				for series, v := range want {
					if !strings.Contains(got[backend], fmt.Sprintf("%s %g\n", series, v)) {
						return fmt.Sprintf("nvml exporter lacks %s %g:\n%s", series, v, got[backend])
					}
				}
			}
			if got["sim"] != got["nvml"] {
				return fmt.Sprintf("series differ:\n--- sim\n%s--- nvml\n%s", got["sim"], got["nvml"])
			}
			return ""
		}
	}
	g0, g1, bad := f.GPUs[0].UUID, f.GPUs[1].UUID, f.GPUs[2].UUID
	eventually(t, 20*time.Second, same(map[string]float64{
		`gpuslice_gpu_info{driver_version=580.95.05,gpu=0,name=NVIDIA RTX A6000,uuid=` + g0 + `}`: 1,
		`gpuslice_gpu_memory_used_bytes{gpu=0,uuid=` + g0 + `}`:                                   7 << 30,
		`gpuslice_gpu_power_watts{gpu=0,uuid=` + g0 + `}`:                                         180.25,
		`gpuslice_gpu_xid_errors_total{gpu=0,uuid=` + g0 + `,xid=79}`:                             2,
		`gpuslice_gpu_xid_errors_total{gpu=2,uuid=` + bad + `,xid=79}`:                            1,
		`gpuslice_exporter_collect_success{collector=gpu}`:                                        0,
	}))

	// The file changes under both: new Xids, a process gone, the GPU in
	// error back.
	f.GPUs[1].XidEvents = []sim.XidEvent{{Xid: 31}, {Xid: 31}}
	f.GPUs[0].Processes = f.GPUs[0].Processes[:1]
	f.GPUs[2].Error = ""
	writeSim(t, simFile, f)
	eventually(t, 20*time.Second, same(map[string]float64{
		`gpuslice_gpu_xid_errors_total{gpu=1,uuid=` + g1 + `,xid=31}`: 2,
		`gpuslice_gpu_memory_used_bytes{gpu=0,uuid=` + g0 + `}`:       4 << 30,
		`gpuslice_gpu_memory_total_bytes{gpu=2,uuid=` + bad + `}`:     51527024640,
		`gpuslice_exporter_collect_success{collector=gpu}`:            1,
	}))

	const clients, scrapes = 4, 250
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for range clients {
		wg.Go(func() {
			for range scrapes {
				m, err := scrape(urls["nvml"])
				if err == nil && len(m["gpuslice_gpu_info"].GetMetric()) != 3 {
					err = fmt.Errorf("scrape with %d gpuslice_gpu_info series, want 3", len(m["gpuslice_gpu_info"].GetMetric()))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("scraping the nvml exporter %d times: %v", clients*scrapes, err)
	}
	eventually(t, 5*time.Second, same(nil))
}

// seriesText renders every gpuslice_ series of a scrape but the collect
// durations and energy counters (which differ between any two processes),
// one sorted line each.
func seriesText(m metrics) string {
	var lines []string
	for name := range m {
		// Durations and energy (power × the time between this process's own
		// scrapes) differ between two processes whatever their backend.
		if !strings.HasPrefix(name, "gpuslice_") || name == "gpuslice_exporter_collect_duration_seconds" ||
			strings.HasSuffix(name, "_energy_joules_total") {
			continue
		}
		lines = append(lines, strings.Split(m.dump(name), "\n")...)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n") + "\n"
}

// TestLibnvmlBackendMatchesSim loads the simulated libnvidia-ml into this
// test process through go-nvml (the nvml backend's real dlopen path) and
// checks that the nvml backend's snapshots and Xid counts equal the sim
// backend's on the same file, from 4 goroutines at once.
func TestLibnvmlBackendMatchesSim(t *testing.T) {
	libDir := simLibraryDir(t)
	simFile := filepath.Join(t.TempDir(), "gpus.yaml")
	writeSim(t, simFile, libnvmlScenario())
	// The library reads its environment when it is loaded, at Init.
	t.Setenv("GPUSLICE_SIM_FILE", simFile)
	nb, err := nvmlbackend.New(nvml.New(nvml.WithLibraryPath(filepath.Join(libDir, "libnvidia-ml.so.1"))),
		nvmlbackend.Options{XidPollTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := nb.Close(); err != nil {
			t.Error(err)
		}
	}()
	sb := sim.New(simFile)
	ctx := context.Background()

	compare := func() error {
		want, err := sb.Snapshot(ctx)
		if err != nil {
			return err
		}
		got, err := nb.Snapshot(ctx)
		if err != nil {
			return err
		}
		if len(want.Devices) == 0 || len(want.Failed) == 0 {
			return fmt.Errorf("scenario lost its GPUs: %+v", want)
		}
		nvmlSampleSemantics(want.Devices)
		if !reflect.DeepEqual(got.Devices, want.Devices) || got.DriverVersion != want.DriverVersion {
			return fmt.Errorf("nvml snapshot\n%+v\nwant (sim)\n%+v", got, want)
		}
		if len(got.Failed) != len(want.Failed) {
			return fmt.Errorf("nvml failed GPUs %v, want (sim) %v", got.Failed, want.Failed)
		}
		for i := range want.Failed {
			if got.Failed[i].Index != want.Failed[i].Index || got.Failed[i].UUID != want.Failed[i].UUID ||
				!strings.Contains(got.Failed[i].Error(), "GPU is lost") {
				return fmt.Errorf("nvml failed GPU %v, want (sim) %v, lost", &got.Failed[i], &want.Failed[i])
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			for range 250 {
				if err := compare(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() string {
		got, want := nb.Xids(), sb.Xids()
		if len(want) != 3 || !reflect.DeepEqual(got, want) {
			return fmt.Sprintf("nvml Xids %+v, want (sim) %+v", got, want)
		}
		return ""
	})
}

// nvmlSampleSemantics applies NVML's rule for per-process utilization to
// the sim backend's reading, which reports the file as written: NVML returns
// samples only for processes that used the SMs in the period, so on a GPU
// that gives samples at all, a listed process without one used none (0),
// while a GPU that gives none has no figure for any process.
func nvmlSampleSemantics(devices []gpu.Device) {
	for i := range devices {
		d := &devices[i]
		sampled := false
		for _, p := range d.Processes {
			sampled = sampled || p.HasSMUtilization
		}
		for j := range d.Processes {
			if sampled && !d.Processes[j].HasSMUtilization {
				d.Processes[j].HasSMUtilization, d.Processes[j].SMUtilization = true, 0
			}
		}
	}
}

// TestLibnvmlInitFailsOnBadFile checks that a sim file that cannot be read
// fails NVML's init with a message that names the file, and that the
// exporter then does what it does on a node without NVML: it keeps serving
// (GPU collector at 0) and logs the failure, instead of exiting into a crash
// loop that hides the message.
func TestLibnvmlInitFailsOnBadFile(t *testing.T) {
	libDir := simLibraryDir(t)
	exporter := binary(t, "cmd/exporter")
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	addr := freeAddr(t)
	p := startEnv(t, []string{"GPUSLICE_SIM_FILE=" + missing, "LD_LIBRARY_PATH=" + libDir}, exporter,
		"--gpu.backend=nvml", "--web.listen-address="+addr, "--kubelet.pod-resources-socket=", "--pods.source=none")
	eventually(t, 30*time.Second, func() string {
		m, err := scrape("http://" + addr + "/metrics")
		if err != nil {
			return err.Error()
		}
		ok := false
		for _, s := range m["gpuslice_exporter_collect_success"].GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "collector" && l.GetValue() == "gpu" && s.GetGauge().GetValue() == 0 {
					ok = true
				}
			}
		}
		if !ok {
			return "gpuslice_exporter_collect_success{collector=\"gpu\"} is not 0"
		}
		if out := p.Output(); !strings.Contains(out, "Driver Not Loaded") || !strings.Contains(out, missing) {
			return "exporter output does not say NVML init failed on " + missing + ":\n" + out
		}
		return ""
	})
}

// TestLibnvmlListsGrowAndShrink reads a GPU whose process list grows past
// the buffers sized from the previous reading, then shrinks, through the
// library: each reading must be whole (the backend sizes its buffers from
// the last reading and asks again when NVML says they are too small).
func TestLibnvmlListsGrowAndShrink(t *testing.T) {
	libDir := simLibraryDir(t)
	simFile := filepath.Join(t.TempDir(), "gpus.yaml")
	node := func(n int) *sim.File {
		g := sim.GPU{UUID: "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348", Name: "NVIDIA RTX A6000", MemoryTotalBytes: 51527024640, Utilization: 1}
		for i := range n {
			// Whole percents, as NVML gives them, adding up to less than
			// the GPU's (more would be scaled to fit it).
			g.Processes = append(g.Processes, sim.Process{PID: 1000 + i, UsedMemoryBytes: uint64(i+1) << 20, SMUtilization: ptr(float64(i%5) / 100 * float64(min(1, max(0, 10-i))))})
		}
		return &sim.File{DriverVersion: "580.95.05", GPUs: []sim.GPU{g}}
	}
	writeSim(t, simFile, node(3))
	t.Setenv("GPUSLICE_SIM_FILE", simFile)
	nb, err := nvmlbackend.New(nvml.New(nvml.WithLibraryPath(filepath.Join(libDir, "libnvidia-ml.so.1"))), nvmlbackend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nb.Close()
	sb := sim.New(simFile)
	for _, n := range []int{3, 60, 61, 200, 5, 0, 90} {
		writeSim(t, simFile, node(n))
		want, err := sb.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got, err := nb.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		nvmlSampleSemantics(want.Devices)
		if len(got.Devices) != 1 || len(got.Devices[0].Processes) != n || !reflect.DeepEqual(got.Devices[0].Processes, want.Devices[0].Processes) {
			t.Fatalf("%d processes: nvml read\n%+v\nwant (sim)\n%+v", n, got.Devices, want.Devices)
		}
	}
}

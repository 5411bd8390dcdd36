package simgpu_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/gpu/sim"
	"github.com/gpuslice/gpuslice/internal/testproc"
	"github.com/gpuslice/gpuslice/test/simgpu"
)

const (
	gib  = uint64(1) << 30
	uuid = "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348"
)

func startDriver(t *testing.T) *simgpu.Driver {
	t.Helper()
	d, err := simgpu.Start(t.TempDir(), sim.File{GPUs: []sim.GPU{
		{UUID: uuid, Name: "NVIDIA RTX A6000", MemoryTotalBytes: 8 * gib},
		{UUID: "GPU-00000000-0000-0000-0000-000000000002", MemoryTotalBytes: 4 * gib},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func readSim(t *testing.T, d *simgpu.Driver) *sim.File {
	t.Helper()
	b, err := os.ReadFile(d.SimFile())
	if err != nil {
		t.Fatal(err)
	}
	f, err := sim.Parse(b)
	if err != nil {
		t.Fatalf("the driver wrote a sim file that does not parse: %v\n%s", err, b)
	}
	return f
}

func TestContextsAndOOM(t *testing.T) {
	d := startDriver(t)
	a, err := simgpu.Open(d.Dir(), uuid+"::3")
	if err != nil {
		t.Fatal(err)
	}
	if a.UUID != uuid || a.Total != 8*gib {
		t.Fatalf("open by replica ID: got %s %d", a.UUID, a.Total)
	}
	if err := a.Alloc(6 * gib); err != nil {
		t.Fatal(err)
	}
	b, err := simgpu.Open(d.Dir(), "0")
	if err != nil {
		t.Fatal(err)
	}
	var oom *simgpu.OOMError
	if err := b.Alloc(3 * gib); !errors.As(err, &oom) || oom.Free != 2*gib || !errors.Is(err, simgpu.ErrOutOfMemory) {
		t.Fatalf("3 GiB with 2 GiB free: got %v, want an OOM with 2 GiB free", err)
	}
	if err := b.Alloc(2 * gib); err != nil {
		t.Fatalf("2 GiB with 2 GiB free: %v", err)
	}
	// Both contexts belong to this test process: one process, summed.
	f := readSim(t, d)
	if p := f.GPUs[0].Processes; len(p) != 1 || p[0].PID != os.Getpid() || p[0].UsedMemoryBytes != 8*gib {
		t.Fatalf("processes on GPU 0: %+v, want pid %d with 8 GiB", p, os.Getpid())
	}
	a.Close()
	testproc.Eventually(t, 5*time.Second, 20*time.Millisecond, func() string {
		if got := d.Processes()[uuid][os.Getpid()]; got != 2*gib {
			return "after closing a context the process still holds " + human(got)
		}
		return ""
	})
	if _, err := simgpu.Open(d.Dir(), "GPU-nope"); err == nil || !strings.Contains(err.Error(), `no GPU "GPU-nope"`) {
		t.Fatalf("unknown GPU: %v", err)
	}
}

func TestErroredGPURefusesContexts(t *testing.T) {
	d := startDriver(t)
	if err := d.Update(func(f *sim.File) { f.GPUs[1].Error = "GPU is lost" }); err != nil {
		t.Fatal(err)
	}
	if _, err := simgpu.Open(d.Dir(), "1"); err == nil || !strings.Contains(err.Error(), "GPU is lost") {
		t.Fatalf("open on a failed GPU: %v", err)
	}
	if readSim(t, d).GPUs[1].Error != "GPU is lost" {
		t.Fatal("the sim file lost the GPU's error")
	}
}

// TestFakeCUDA runs the workload as real processes: each is listed under
// its own PID, the one that does not fit prints PyTorch's OOM and exits 1,
// and a process that exits frees its memory.
func TestFakeCUDA(t *testing.T) {
	d := startDriver(t)
	bin := testproc.BuildStatic(t, "test/simgpu/fakecuda")
	env := append(os.Environ(), simgpu.EnvDir+"="+d.Dir(), simgpu.EnvVisibleDev+"="+uuid)

	holder := exec.Command(bin, "-memory", "0s=5Gi", "-sm", "0.25")
	holder.Env = env
	var hout bytes.Buffer
	holder.Stdout, holder.Stderr = &hout, &hout
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	testproc.Eventually(t, 10*time.Second, 20*time.Millisecond, func() string {
		if d.Processes()[uuid][holder.Process.Pid] != 5*gib {
			return "the holder's 5 GiB are not on the GPU: " + hout.String()
		}
		return ""
	})
	f := readSim(t, d)
	if p := f.GPUs[0].Processes; len(p) != 1 || p[0].SMUtilization == nil || *p[0].SMUtilization != 0.25 {
		t.Fatalf("holder's process entry: %+v", p)
	}

	grower := exec.Command(bin, "-memory", "0s=1Gi,200ms=2Gi", "-leak", "1Gi/100ms", "-framework", "pytorch")
	grower.Env = env
	var stderr bytes.Buffer
	grower.Stderr = &stderr
	err := grower.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("the grower should exit 1 on OOM, got %v; stderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 8.00 GiB of which 0.00 GiB is free") {
		t.Fatalf("stderr is not PyTorch's OOM:\n%s", stderr.String())
	}
	testproc.Eventually(t, 5*time.Second, 20*time.Millisecond, func() string {
		if _, ok := d.Processes()[uuid][grower.Process.Pid]; ok {
			return "the exited grower still holds memory"
		}
		return ""
	})

	none := exec.Command(bin)
	none.Env = append(os.Environ(), simgpu.EnvDir+"="+d.Dir(), simgpu.EnvVisibleDev+"=void")
	if out, err := none.CombinedOutput(); err == nil || !strings.Contains(string(out), "Found no NVIDIA driver") {
		t.Fatalf("no GPU given: %v\n%s", err, out)
	}
}

func human(b uint64) string { return fmt.Sprintf("%.2f GiB", float64(b)/float64(gib)) }

// TestMPSPinnedLimit: a client started with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
// fails at its limit while the GPU has memory free, and its neighbour keeps
// what it holds.
func TestMPSPinnedLimit(t *testing.T) {
	d := startDriver(t)
	bin := testproc.BuildStatic(t, "test/simgpu/fakecuda")
	env := append(os.Environ(), simgpu.EnvDir+"="+d.Dir(), simgpu.EnvVisibleDev+"="+uuid)

	neighbour := exec.Command(bin, "-memory", "0s=3Gi")
	neighbour.Env = append(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4G")
	if err := neighbour.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { neighbour.Process.Kill(); neighbour.Wait() })
	testproc.Eventually(t, 10*time.Second, 20*time.Millisecond, func() string {
		if d.Processes()[uuid][neighbour.Process.Pid] != 3*gib {
			return "the neighbour's 3 GiB are not on the GPU"
		}
		return ""
	})

	capped := exec.Command(bin, "-memory", "0s=1Gi,100ms=3Gi", "-framework", "pytorch")
	capped.Env = append(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M")
	var stderr bytes.Buffer
	capped.Stderr = &stderr
	err := capped.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("a client past its 2 GiB limit should exit 1 on OOM with 4 GiB of the GPU free, got %v; stderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "CUDA out of memory") {
		t.Fatalf("stderr is not an OOM:\n%s", stderr.String())
	}
	if got := d.Processes()[uuid][neighbour.Process.Pid]; got != 3*gib {
		t.Errorf("the neighbour holds %s after the capped client's OOM, want 3 GiB", human(got))
	}

	// Without a limit the same script fits the GPU.
	free := exec.Command(bin, "-memory", "0s=1Gi,100ms=3Gi", "-run", "500ms")
	free.Env = env
	if out, err := free.CombinedOutput(); err != nil {
		t.Fatalf("the same client without a limit: %v\n%s", err, out)
	}
}

// TestFakeMPS runs test/simgpu/fakemps as a chart's daemon runs it: the
// control daemon starts its server, which the sim file lists as the GPU's
// MPS server with its own memory and the SM utilization of its clients; a
// fake-CUDA client with CUDA_MPS_PIPE_DIRECTORY finds the daemon, and one
// finds none after quit; nvidia-smi -c succeeds.
func TestFakeMPS(t *testing.T) {
	d := startDriver(t)
	bin := testproc.BuildStatic(t, "test/simgpu/fakemps")
	cuda := testproc.BuildStatic(t, "test/simgpu/fakecuda")
	progs := t.TempDir()
	for _, name := range []string{"nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-smi"} {
		if err := os.Symlink(bin, filepath.Join(progs, name)); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	pipe, logs := filepath.Join(root, "pipe"), filepath.Join(root, "log")
	env := append(os.Environ(), "PATH="+progs+":"+os.Getenv("PATH"), simgpu.EnvDir+"="+d.Dir(), simgpu.EnvVisibleDev+"=all",
		"CUDA_MPS_PIPE_DIRECTORY="+pipe, "CUDA_MPS_LOG_DIRECTORY="+logs)
	run := func(stdin string, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(progs, args[0]), args[1:]...)
		cmd.Env, cmd.Stdin = env, strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("", "nvidia-smi", "-c", "EXCLUSIVE_PROCESS"); err != nil || !strings.Contains(out, "Set compute mode to EXCLUSIVE_PROCESS for GPU "+uuid) {
		t.Fatalf("nvidia-smi -c EXCLUSIVE_PROCESS: %v\n%s", err, out)
	}
	if out, err := run("get_default_active_thread_percentage\n", "nvidia-cuda-mps-control"); err == nil {
		t.Fatalf("the control client answered with no daemon running:\n%s", out)
	}
	if out, err := run("", "nvidia-cuda-mps-control", "-d"); err != nil {
		log, _ := os.ReadFile(filepath.Join(logs, "control.log"))
		t.Fatalf("nvidia-cuda-mps-control -d: %v\n%s\n%s", err, out, log)
	}
	t.Cleanup(func() { _, _ = run("quit\n", "nvidia-cuda-mps-control") })
	if out, err := run("", "nvidia-cuda-mps-control", "-d"); err == nil {
		t.Fatalf("a second daemon on the same pipe directory started:\n%s", out)
	}
	if out, err := run("get_default_active_thread_percentage\n", "nvidia-cuda-mps-control"); err != nil || strings.TrimSpace(out) != "100.0" {
		t.Fatalf("get_default_active_thread_percentage: %v %q", err, out)
	}
	servers := d.MPSServers()
	if len(servers[uuid]) != 1 || len(servers["GPU-00000000-0000-0000-0000-000000000002"]) != 1 {
		t.Fatalf("MPS servers %v, want one on each GPU", servers)
	}
	server := servers[uuid][0]
	if out, err := run("get_server_list\n", "nvidia-cuda-mps-control"); err != nil || strings.TrimSpace(out) != fmt.Sprint(server) {
		t.Fatalf("get_server_list: %v %q, want %d", err, out, server)
	}
	if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", server)); !strings.HasPrefix(string(cmdline), "nvidia-cuda-mps-server\x00") {
		t.Errorf("the server's cmdline is %q", cmdline)
	}

	client := exec.Command(cuda, "-memory", "0s=1Gi", "-sm", "0.3")
	client.Env = append(env, simgpu.EnvVisibleDev+"="+uuid, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G")
	var cout bytes.Buffer
	client.Stdout, client.Stderr = &cout, &cout
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Process.Kill(); client.Wait() })
	testproc.Eventually(t, 10*time.Second, 20*time.Millisecond, func() string {
		if d.Processes()[uuid][client.Process.Pid] != gib {
			return "the client's 1 GiB is not on the GPU: " + cout.String()
		}
		return ""
	})
	if !strings.Contains(cout.String(), fmt.Sprintf("MPS client of server pid %d", server)) {
		t.Errorf("the client's output does not name the server:\n%s", cout.String())
	}
	f := readSim(t, d)
	for _, p := range f.GPUs[0].Processes {
		switch p.PID {
		case server:
			if !p.MPSServer || p.UsedMemoryBytes != 66<<20 || p.SMUtilization == nil || *p.SMUtilization != 0.3 {
				t.Errorf("the server's entry: %+v, want mpsServer, 66 MiB and its client's SM 0.3", p)
			}
		case client.Process.Pid:
			if p.MPSServer || p.SMUtilization != nil {
				t.Errorf("the client's entry: %+v, want no mpsServer and no SM utilization of its own", p)
			}
		default:
			t.Errorf("unexpected process %+v", p)
		}
	}
	client.Process.Kill()
	client.Wait()

	if out, err := run("quit\n", "nvidia-cuda-mps-control"); err != nil {
		t.Fatalf("quit: %v\n%s", err, out)
	}
	testproc.Eventually(t, 10*time.Second, 20*time.Millisecond, func() string {
		if s := d.MPSServers(); len(s) > 0 {
			return fmt.Sprintf("MPS servers %v after quit", s)
		}
		if _, err := os.Stat(filepath.Join(pipe, simgpu.MPSControlSocket)); err == nil {
			return "the control socket is still there after quit"
		}
		return ""
	})
	late := exec.Command(cuda, "-memory", "0s=1Gi", "-run", "100ms")
	late.Env = append(env, simgpu.EnvVisibleDev+"="+uuid)
	if out, err := late.CombinedOutput(); err == nil || !strings.Contains(string(out), "all CUDA-capable devices are busy or unavailable") {
		t.Errorf("a client with no daemon: %v\n%s", err, out)
	}
	log, _ := os.ReadFile(filepath.Join(logs, "control.log"))
	for _, want := range []string{"Cmd: get_default_active_thread_percentage", "Cmd: quit", fmt.Sprintf("Server %d started", server)} {
		if !strings.Contains(string(log), want) {
			t.Errorf("control.log has no %q:\n%s", want, log)
		}
	}
}

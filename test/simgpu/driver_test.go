package simgpu_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
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

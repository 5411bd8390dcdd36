// Command fakecuda is a CUDA application without CUDA: the workload of the
// real test node. It runs in a real container, opens the GPU that the device
// plugin gave it (NVIDIA_VISIBLE_DEVICES) on the simulated driver
// (test/simgpu) under its real PID, follows a memory script, and when an
// allocation does not fit in what the other pods left on the GPU it prints
// the out-of-memory error of the framework it plays, on stderr, and exits 1,
// as the framework's process would. OOMs in tests then come from real
// contention between pods, not from lines a test writes into a log.
//
//	fakecuda -memory 0s=2Gi,30s=6Gi [-leak 256Mi/1s] [-sm 0.4] [-run 10m]
//	         [-framework pytorch|tensorflow|jax|jax-0.4|llamacpp|cupy|onnxruntime|cuda]
//	         [-log-every 5s] [-print-env] [-quiet] [-no-final-newline]
//
// -memory is piecewise constant from the start: at each offset the process
// holds that many bytes (growing allocates, shrinking frees). -leak grows it
// further after the last step. -run ends the process with status 0 after
// that long (0: run until killed). -no-final-newline ends the
// out-of-memory error without its newline, as a C program's fprintf may
// before it exits. The driver's directory comes from
// GPUSLICE_SIM_DIR (default /run/gpuslice-sim).
//
// With CUDA_MPS_PIPE_DIRECTORY set it is a CUDA MPS client: before it opens
// the GPU it asks the control daemon there (test/simgpu/fakemps) for its
// server, and fails as CUDA does when none answers. Its pinned memory limit
// (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) is enforced by the simulated driver.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuslice/gpuslice/internal/mps"
	"github.com/gpuslice/gpuslice/test/simgpu"
)

type step struct {
	at    time.Duration
	bytes uint64
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fakecuda", flag.ContinueOnError)
	fs.SetOutput(stderr)
	memory := fs.String("memory", "0s=1Gi", "memory script: OFFSET=BYTES,… (piecewise constant from the start)")
	leak := fs.String("leak", "", "after the script, grow by BYTES every PERIOD (BYTES/PERIOD), e.g. 256Mi/1s")
	sm := fs.Float64("sm", 0.5, "SM utilization of this process, 0..1")
	runFor := fs.Duration("run", 0, "exit 0 after this long (0: until killed)")
	framework := fs.String("framework", "pytorch", "whose out-of-memory error to print: "+strings.Join(frameworks(), ", "))
	logEvery := fs.Duration("log-every", 0, "print a progress line this often (0: never)")
	printEnv := fs.Bool("print-env", false, "print the NVIDIA_*, CUDA_*, GPUSLICE_* and framework allocator (XLA_*, TF_*, PYTORCH_*) environment at start")
	quiet := fs.Bool("quiet", false, "print nothing but errors (an OOM is then the first line the container writes)")
	noNewline := fs.Bool("no-final-newline", false, "end the out-of-memory error without its newline")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	script, err := parseScript(*memory)
	if err != nil {
		fmt.Fprintf(stderr, "fakecuda: -memory: %v\n", err)
		return 2
	}
	var leakBytes uint64
	var leakEvery time.Duration
	if *leak != "" {
		b, p, ok := strings.Cut(*leak, "/")
		if leakBytes, err = parseBytes(b); err == nil && ok {
			leakEvery, err = time.ParseDuration(p)
		}
		if err != nil || !ok || leakEvery <= 0 {
			fmt.Fprintf(stderr, "fakecuda: -leak %q: want BYTES/PERIOD, e.g. 256Mi/1s\n", *leak)
			return 2
		}
	}
	oom, ok := oomMessages[*framework]
	if !ok {
		fmt.Fprintf(stderr, "fakecuda: -framework %q: want one of %s\n", *framework, strings.Join(frameworks(), ", "))
		return 2
	}
	if *printEnv {
		env := os.Environ()
		sort.Strings(env)
		for _, kv := range env {
			if hasAnyPrefix(kv, "NVIDIA_", "CUDA_", "GPUSLICE_", "XLA_", "TF_", "PYTORCH_") {
				fmt.Fprintln(stdout, "env", kv)
			}
		}
	}

	visible := os.Getenv(simgpu.EnvVisibleDev)
	sel, _, _ := strings.Cut(visible, ",")
	if sel == "" || sel == "void" || sel == "none" {
		// What the CUDA runtime says in a container given no GPU.
		fmt.Fprintf(stderr, "RuntimeError: Found no NVIDIA driver on your system (NVIDIA_VISIBLE_DEVICES=%q)\n", visible)
		return 1
	}
	if sel == "all" {
		sel = "0"
	}
	dir := os.Getenv(simgpu.EnvDir)
	if dir == "" {
		dir = simgpu.DefaultDir
	}
	if pipe := os.Getenv(mps.EnvPipeDirectory); pipe != "" {
		// An MPS client: CUDA connects to the control daemon first, and on
		// an EXCLUSIVE_PROCESS GPU held by the MPS server a client that
		// finds no daemon gets no device.
		pid, err := simgpu.MPSCommand(pipe, "get_server_list")
		if err == nil && pid == "" {
			err = errors.New("the daemon lists no server")
		}
		if err != nil {
			fmt.Fprintf(stderr, "RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable (MPS control daemon at %s: %v)\n", pipe, err)
			return 1
		}
		if !*quiet {
			fmt.Fprintf(stdout, "fakecuda: MPS client of server pid %s (pipe directory %s)\n", pid, pipe)
		}
	}
	ctx, err := simgpu.Open(dir, sel)
	if err != nil {
		fmt.Fprintf(stderr, "RuntimeError: CUDA driver initialization failed: %v\n", err)
		return 1
	}
	defer ctx.Close()
	if err := ctx.SetSM(*sm); err != nil {
		fmt.Fprintf(stderr, "fakecuda: %v\n", err)
		return 1
	}
	if !*quiet {
		fmt.Fprintf(stdout, "fakecuda: pid %d on %s (%s), %s total\n", os.Getpid(), ctx.UUID, sel, human(ctx.Total))
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	start := time.Now()
	var held uint64
	set := func(want uint64) bool {
		switch {
		case want > held:
			if err := ctx.Alloc(want - held); err != nil {
				var o *simgpu.OOMError
				if errors.As(err, &o) {
					msg := oom(oomInfo{want - held, held, ctx.Total, o.Free, os.Getpid()})
					if *noNewline {
						msg = strings.TrimSuffix(msg, "\n")
					}
					fmt.Fprint(stderr, msg)
					return false
				}
				fmt.Fprintf(stderr, "fakecuda: %v\n", err)
				return false
			}
		case want < held:
			if err := ctx.Free(held - want); err != nil {
				fmt.Fprintf(stderr, "fakecuda: %v\n", err)
				return false
			}
		}
		held = want
		return true
	}

	next := 0
	var lastLog, lastLeak time.Duration
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		now := time.Since(start)
		want := held
		for next < len(script) && script[next].at <= now {
			want = script[next].bytes
			next++
			lastLeak = now
		}
		if next == len(script) && leakEvery > 0 && now-lastLeak >= leakEvery {
			want += leakBytes
			lastLeak = now
		}
		if !set(want) {
			return 1
		}
		if *logEvery > 0 && now-lastLog >= *logEvery {
			fmt.Fprintf(stdout, "step t=%s memory=%s\n", now.Truncate(time.Second), human(held))
			lastLog = now
		}
		if *runFor > 0 && now >= *runFor {
			if !*quiet {
				fmt.Fprintln(stdout, "fakecuda: done")
			}
			return 0
		}
		select {
		case <-stop:
			return 0
		case <-tick.C:
		}
	}
}

func parseScript(s string) ([]step, error) {
	var out []step
	for _, part := range strings.Split(s, ",") {
		at, b, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("%q: want OFFSET=BYTES", part)
		}
		d, err := time.ParseDuration(at)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		n, err := parseBytes(b)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		if len(out) > 0 && d < out[len(out)-1].at {
			return nil, fmt.Errorf("%q: offsets must not decrease", part)
		}
		out = append(out, step{d, n})
	}
	return out, nil
}

// parseBytes reads 1024, 512Ki, 6Gi, 2G (Kubernetes quantity suffixes).
func parseBytes(s string) (uint64, error) {
	mult := uint64(1)
	for _, u := range []struct {
		suf string
		m   uint64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSuffix(s, u.suf), u.m
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("bad byte count %q", s)
	}
	return uint64(f * float64(mult)), nil
}

func hasAnyPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

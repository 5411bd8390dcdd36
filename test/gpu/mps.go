package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuslice/gpuslice/internal/mps"
)

// chartTemplate is the chart's MPS control daemon, whose script the MPS
// check runs as it is, only its /mps paths moved under a folder of ours.
const chartTemplate = "deploy/helm/gpuslice/templates/mps-control-daemon.yaml"

// chartDaemonScript takes the shell script of the chart's
// mps-control-daemon container (its args block) and points its /mps paths
// at root.
func chartDaemonScript(template []byte, root string) (string, error) {
	lines := strings.Split(string(template), "\n")
	i := 0
	for ; i < len(lines) && strings.TrimSpace(lines[i]) != "- name: mps-control-daemon"; i++ {
	}
	for ; i < len(lines) && strings.TrimSpace(lines[i]) != "args:"; i++ {
	}
	for ; i < len(lines) && strings.TrimSpace(lines[i]) != "- |"; i++ {
	}
	if i == len(lines) {
		return "", errors.New(chartTemplate + ": no args block under the container mps-control-daemon")
	}
	indent := -1
	var script []string
	for _, l := range lines[i+1:] {
		n := len(l) - len(strings.TrimLeft(l, " "))
		if strings.TrimSpace(l) != "" {
			if indent < 0 {
				indent = n
			}
			if n < indent {
				break
			}
		}
		script = append(script, strings.TrimPrefix(l, strings.Repeat(" ", max(indent, 0))))
	}
	if strings.Contains(strings.Join(script, "\n"), "{{") {
		return "", errors.New(chartTemplate + ": the daemon's script holds a template action; test-gpu runs it as plain shell")
	}
	return strings.ReplaceAll(strings.Join(script, "\n"), "/mps/", root+"/"), nil
}

// checkMPS runs a whole MPS setup on the real GPU: the chart's control
// daemon script, gpuslice-plugin in MPS mode with 4 replicas, two pods
// with the env of the plugin's allocations (pipe directory, pinned memory
// limit, thread percentage). One holds half its limit and keeps busy; the
// other asks past its limit and must get an out-of-memory error while the
// first runs on. The exporter must show both clients' memory as NVML
// lists it, the server's memory as its own series, each client's limit,
// no utilization for the clients (NVML gives only the server's), and the
// second pod's OOM once, of kind process-cap where it labels kinds.
func (e *env) checkMPS(ctx context.Context) []row {
	const daemonRow = "MPS: the chart's control daemon starts"
	if _, err := exec.LookPath("nvidia-cuda-mps-control"); err != nil {
		return []row{{daemonRow, skip, "no nvidia-cuda-mps-control on PATH"}}
	}
	template, err := os.ReadFile(chartTemplate)
	if err != nil {
		return []row{{daemonRow, fail, err.Error()}}
	}
	// The pipe's socket path must stay short (108 bytes): /tmp, not -out.
	root, err := os.MkdirTemp("/tmp", "tgmps")
	if err != nil {
		return []row{{daemonRow, fail, err.Error()}}
	}
	defer os.RemoveAll(root)
	script, err := chartDaemonScript(template, root)
	if err != nil {
		return []row{{daemonRow, fail, err.Error()}}
	}
	_ = os.WriteFile(filepath.Join(e.o.out, "mps-daemon.sh"), []byte(script), 0o644)
	dlog, _ := os.Create(filepath.Join(e.o.out, "mps-daemon.log"))
	defer dlog.Close()
	daemon := exec.Command("sh", "-c", script)
	daemon.Env = append(os.Environ(), "MPS_RESOURCES="+resource, "MPS_EXCLUSIVE=true")
	daemon.Stdout, daemon.Stderr = dlog, dlog
	if err := daemon.Start(); err != nil {
		return []row{{daemonRow, fail, err.Error()}}
	}
	pipe := mps.PipeDir(root, resource)
	defer func() {
		// The script's own trap quits the daemon and puts the GPU back in
		// the default compute mode; then the same again, in case it could
		// not, so that nothing after this check finds the GPU exclusive.
		_ = daemon.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- daemon.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = daemon.Process.Kill()
		}
		quit := exec.Command("nvidia-cuda-mps-control")
		quit.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+pipe)
		quit.Stdin = strings.NewReader("quit\n")
		_ = quit.Run()
		_ = exec.Command("nvidia-smi", "-c", "DEFAULT").Run()
	}()
	if err := waitFile(ctx, mps.StartedFile(root, resource), 30*time.Second); err != nil {
		return []row{{daemonRow, fail, err.Error() + "; log " + dlog.Name()}}
	}
	mode, _ := exec.Command("nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader").Output()
	rows := []row{{daemonRow, pass, "compute mode " + strings.TrimSpace(string(mode)) + ", pipe " + pipe}}

	// gpuslice-plugin in MPS mode: two containers, one replica each.
	plog, _ := os.Create(filepath.Join(e.o.out, "plugin-mps.log"))
	pr, err := runPlugin(ctx, filepath.Join(e.bin, "gpuslice-plugin"), e.o.out, e.node.podResourcesSocket(), pluginRun{
		config: "version: v1\nsharing:\n  mps:\n    resources:\n      - name: " + resource + "\n        replicas: 4\n",
		args:   []string{"--mps-root=" + root},
		allocs: 2,
	}, plog)
	plog.Close()
	const allocRow = "MPS: plugin allocates with a pinned limit"
	if err == nil && len(pr.Allocs) != 2 {
		err = fmt.Errorf("%d devices advertised, %d allocations answered, want 2", len(pr.Devices), len(pr.Allocs))
	}
	if err != nil {
		return append(rows, row{allocRow, fail, err.Error() + "; log " + plog.Name()})
	}
	var envs [2][]string
	var limit uint64
	for i, a := range pr.Allocs {
		env := map[string]string{}
		for k, v := range a.Envs {
			env[k] = v
		}
		// The pipe directory as the container sees it is a mount of the
		// host's; these processes run on the host.
		for _, m := range a.Mounts {
			if m.ContainerPath == env[mps.EnvPipeDirectory] {
				env[mps.EnvPipeDirectory] = m.HostPath
			}
		}
		if env[mps.EnvPipeDirectory] != pipe {
			return append(rows, row{allocRow, fail, fmt.Sprintf("%s=%q, want the daemon's pipe %s mounted", mps.EnvPipeDirectory, a.Envs[mps.EnvPipeDirectory], pipe)})
		}
		limits, err := mps.ParsePinnedLimit(env[mps.EnvPinnedMemLimit])
		if err != nil {
			return append(rows, row{allocRow, fail, err.Error()})
		}
		limit = limits["0"]
		envs[i] = envList(env, "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
	}
	wantLimit := mps.MemoryLimit(e.totalMiB<<20, 4)
	st := pass
	if limit == 0 || limit > wantLimit || wantLimit-limit >= 1<<20 {
		st = fail
	}
	rows = append(rows, row{allocRow, st, fmt.Sprintf("%s=%s (a quarter of %d MiB), %s=%s", mps.EnvPinnedMemLimit, pr.Allocs[0].Envs[mps.EnvPinnedMemLimit], e.totalMiB,
		mps.EnvThreadPercentage, pr.Allocs[0].Envs[mps.EnvThreadPercentage])})
	if limit == 0 {
		return rows
	}

	defer e.node.removePods()
	limitGiB := float64(limit) / (1 << 30)
	holdGiB, overGiB := limitGiB/2, limitGiB*1.5
	const harmRow = "MPS: a client past its limit fails, its neighbour runs on"
	a, err := e.node.addPod("mps-a", envs[0], "hold-busy-torch", strconv.FormatFloat(holdGiB, 'f', 1, 64), "120")
	if err != nil {
		return append(rows, row{harmRow, fail, err.Error()})
	}
	if err := waitLog(ctx, a.logFile, "holding", 120*time.Second); err != nil {
		return append(rows, row{harmRow, fail, err.Error()})
	}
	b, err := e.node.addPod("mps-b", envs[1], "hold-torch", strconv.FormatFloat(overGiB, 'f', 1, 64), "5")
	if err != nil {
		return append(rows, row{harmRow, fail, err.Error()})
	}
	code := b.wait(120 * time.Second)
	alive := a.running()
	st = pass
	if code != 3 || !alive {
		st = fail
	}
	bLog, _ := os.ReadFile(b.logFile)
	rows = append(rows, row{harmRow, st, fmt.Sprintf("%.1f GiB asked past a %.1f GiB limit: exit %d (want 3, %s); %.1f GiB neighbour running: %v",
		overGiB, limitGiB, code, lastOOMLine(b.logFile), holdGiB, alive)})
	_ = bLog

	// The exporter's view, once it has read mps-b's log.
	var m map[string][]series
	var ooms float64
	for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(2 * time.Second) {
		if m, err = e.scrape("mps"); err != nil {
			return append(rows, row{"MPS: exporter", fail, err.Error()})
		}
		if ooms = sum(m, "gpuslice_gpu_oom_events_total", podLabels(b)); ooms >= 1 {
			break
		}
	}
	time.Sleep(5 * time.Second)
	if m, err = e.scrape("mps-again"); err != nil {
		return append(rows, row{"MPS: exporter", fail, err.Error()})
	}
	apps, _ := computeApps()
	var nvmlA float64
	for _, app := range apps {
		if app.PID == a.pid() {
			nvmlA = float64(app.UsedMiB)
		}
	}
	const mib = 1 << 20
	memA, okMem := find(m, "gpuslice_container_gpu_memory_used_bytes", podLabels(a))
	limA, okLim := find(m, "gpuslice_container_gpu_memory_limit_bytes", podLabels(a))
	_, hasUtil := find(m, "gpuslice_container_gpu_utilization_ratio", podLabels(a))
	server, okServer := find(m, "gpuslice_gpu_mps_server_memory_used_bytes", map[string]string{"uuid": e.uuid})
	un, _ := find(m, "gpuslice_unattributed_gpu_memory_used_bytes", map[string]string{"uuid": e.uuid})
	st = pass
	if !okMem || !within(memA, nvmlA*mib, mib) || !okLim || limA != float64(limit) || hasUtil || !okServer || server <= 0 {
		st = fail
	}
	rows = append(rows, row{"MPS: exporter series of the clients and the server", st, fmt.Sprintf(
		"mps-a memory %.0f MiB (nvidia-smi %.0f), limit %.0f MiB (plugin %d), utilization present: %v; server %.0f MiB; unattributed %.0f MiB",
		memA/mib, nvmlA, limA/mib, limit/mib, hasUtil, server/mib, un/mib)})
	var kinds []string
	for _, s := range m["gpuslice_gpu_oom_events_total"] {
		if s.Labels["pod"] == b.Name && s.Value > 0 {
			kinds = append(kinds, s.Labels["kind"])
		}
	}
	again := sum(m, "gpuslice_gpu_oom_events_total", podLabels(b))
	st = pass
	if ooms != 1 || again != 1 || len(kinds) != 1 || kinds[0] != "process-cap" {
		st = fail
	}
	rows = append(rows, row{"MPS: the client's OOM counted once, kind process-cap", st, fmt.Sprintf("counted %.0f then %.0f, kind %q; mps-a: %.0f",
		ooms, again, strings.Join(kinds, ","), sum(m, "gpuslice_gpu_oom_events_total", podLabels(a)))})
	return rows
}

// waitFile waits until file exists.
func waitFile(ctx context.Context, file string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := os.Stat(file); err == nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("%s not there after %s", file, d)
}

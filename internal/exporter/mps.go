package exporter

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/gpuslice/gpuslice/internal/attribution"
	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/mps"
)

// A GPU shared through CUDA MPS (docs/mps.md) looks different to NVML: one
// server process (nvidia-cuda-mps-server) holds the GPU for every client and
// is the only process with per-process utilization, while each client is
// listed with its own memory. The exporter therefore counts the server's
// memory as the GPU's MPS overhead, not as a container's and not as
// unattributed, gives no utilization per container on such a GPU (absent,
// not 0: the clients did run kernels, NVML just does not say how much each),
// and reads each client's pinned memory limit from its environment, so that
// a panel can set used against limit.
var (
	gpuMPSServerMem = gauge(ns+"_gpu_mps_server_memory_used_bytes",
		"GPU memory used by the CUDA MPS server processes on the GPU (their own, not their clients'); part of gpuslice_gpu_memory_used_bytes, in no container's and not in the unattributed memory.", gpuLabels)
	containerMemLimit = gauge(ns+"_container_gpu_memory_limit_bytes",
		"Pinned device-memory limit of the container's CUDA MPS clients on this GPU (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT from their environment, summed over its client processes): what they may allocate there before CUDA reports out of memory. Absent for containers with a client without a readable limit.", containerLabels)
)

// mpsScrape is one scrape's MPS view of the GPUs.
type mpsScrape struct {
	// server is the memory of the MPS servers per GPU UUID;
	// serverUnknown holds the GPUs where the driver gave a server's as
	// not available, whose server series is left out.
	server        map[string]uint64
	serverUnknown map[string]bool
	// clients are the other processes on GPUs that have a server.
	clients map[string][]gpu.Process
}

// splitMPS finds the MPS servers in the GPU reading and leaves sc.in with
// what attribution should see: the servers taken out, and no SM figure for
// the clients of an MPS GPU (NVML's per-process utilization there is the
// server's alone). sc.in.Devices is replaced, never modified in place: the
// GPU backend may share it.
func (e *Exporter) splitMPS(sc *scrape) mpsScrape {
	m := mpsScrape{server: map[string]uint64{}, serverUnknown: map[string]bool{}, clients: map[string][]gpu.Process{}}
	var out []gpu.Device
	for i, d := range sc.in.Devices {
		if !slices.ContainsFunc(d.Processes, e.isMPSServer) {
			continue
		}
		if out == nil {
			out = slices.Clone(sc.in.Devices)
		}
		procs := make([]gpu.Process, 0, len(d.Processes))
		for _, p := range d.Processes {
			if e.isMPSServer(p) {
				m.server[d.UUID] += p.UsedMemoryBytes
				if p.MemoryUnknown {
					m.serverUnknown[d.UUID] = true
				}
				continue
			}
			p.SMUtilization, p.HasSMUtilization = 0, false
			procs = append(procs, p)
		}
		out[i].Processes = procs
		m.clients[d.UUID] = procs
	}
	if out != nil {
		sc.in.Devices = out
	}
	return m
}

// mpsServerNow reads whether GPU uuid runs an MPS server now, for the OOM
// tracker (oom.Tracker.SetMPSProbe), which asks only when an OOM it reads
// between scrapes would otherwise count as device for want of a server
// in the last scrape. The caller holds e.mu.
func (e *Exporter) mpsServerNow(l gpu.ProcessLister, uuid string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	procs, err := l.ComputeProcesses(ctx, uuid)
	if err != nil {
		e.log.Debug("OOM: cannot tell whether the GPU runs an MPS server", "uuid", uuid, "err", err)
		return false
	}
	return slices.ContainsFunc(procs, e.isMPSServer)
}

// isMPSServer tells an MPS server by the backend's word or by the program
// it runs (its comm is cut to 15 characters, "nvidia-cuda-mps", which the
// control daemon shares; the daemon holds no GPU context, but cmdline says
// which one it is). A process runs one program for life, so the answer is
// kept with the process's entry in the procfs reader: on a real H200 with
// 48 GPU processes, reading every cmdline at every scrape was 5 % of the
// exporter's CPU.
func (e *Exporter) isMPSServer(p gpu.Process) bool {
	if p.MPSServer {
		return true
	}
	return e.proc.program(p.PID, isMPSServerCmdline)
}

// isMPSServerCmdline reports whether a /proc/<pid>/cmdline is the MPS
// server's.
func isMPSServerCmdline(cmdline []byte) bool {
	argv0, _, _ := bytes.Cut(cmdline, []byte{0})
	return filepath.Base(string(argv0)) == mps.ServerComm
}

// limitKnown is what a client's environment says of its pinned limit.
type limitKnown int

const (
	limitPinned  limitKnown = iota // a limit on the GPU
	limitNone                      // none on the GPU: the whole GPU is its to take
	limitUnknown                   // the environment could not be read
)

// pinnedLimit reads a client's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for the GPU
// uuid from its environment as it started (/proc/<pid>/environ; the
// exporter needs the right to read it, as root or with CAP_SYS_PTRACE).
//
// A process NVML still lists may have exited by the time /proc is read,
// or be a zombie, whose environ reads empty: such a process, and one
// whose environ cannot be read, says nothing of a limit (limitUnknown),
// rather than passing for a client without one. (This was first taken
// for why a real H200 counted a client's OOM at its limit as device; the
// same failure came again with it fixed, from the OOM watch reading the
// log before any scrape had seen the MPS server: oom.Tracker.SetMPSProbe.)
func (e *Exporter) pinnedLimit(pid int, uuid string) (uint64, limitKnown) {
	dir := filepath.Join(e.cfg.Procfs, strconv.Itoa(pid))
	env, err := os.ReadFile(filepath.Join(dir, "environ"))
	switch {
	case err == nil && len(env) > 0:
		limit, known, perr := parsePinnedLimitEnv(env, uuid)
		if perr != nil && !e.badLimits[pid] {
			// Once per process: every scrape reads it again.
			if len(e.badLimits) >= 1024 {
				clear(e.badLimits)
			}
			e.badLimits[pid] = true
			e.log.Warn("an MPS client's pinned memory limit does not parse: taken as a limit of unknown size", "pid", pid, "err", perr)
		}
		return limit, known
	case !alive(dir):
		return 0, limitUnknown
	case err == nil, errors.Is(err, fs.ErrNotExist):
		// A live process with an empty environment, or a procfs that
		// keeps none (a test node's): no variable, no limit.
		return 0, limitNone
	}
	return 0, limitUnknown
}

// alive reports whether the process of a /proc/<pid> directory is there
// and not a zombie (state Z, or X as it is reaped).
func alive(dir string) bool {
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return false
	}
	// The state follows the command name, which may hold spaces and
	// parentheses: it is the field after the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	state := stat[i+2]
	return state != 'Z' && state != 'X'
}

// parsePinnedLimitEnv finds the limit on uuid in an environ file's
// NUL-separated variables: limitPinned with it; limitNone when no variable
// sets one, or it sets limits on other GPUs only; limitUnknown, with the
// error naming the value, when the variable does not parse (a pod that
// set its own in a form this build does not read has a limit, of unknown
// size, not none).
func parsePinnedLimitEnv(env []byte, uuid string) (uint64, limitKnown, error) {
	prefix := []byte(mps.EnvPinnedMemLimit + "=")
	for kv := range bytes.SplitSeq(env, []byte{0}) {
		v, ok := bytes.CutPrefix(kv, prefix)
		if !ok {
			continue
		}
		limits, err := mps.ParsePinnedLimit(string(v))
		if err != nil {
			return 0, limitUnknown, err
		}
		if limit, ok := mps.LimitFor(limits, uuid); ok {
			return limit, limitPinned, nil
		}
		return 0, limitNone, nil
	}
	return 0, limitNone, nil
}

// emitMPS sends the servers' memory and the containers' limits. The limits
// go through the same join as memory, so a container's limit and its memory
// carry the same labels: each limited client stands in with its limit as
// its memory. A container with any client whose limit cannot be read gets
// no limit series, rather than one that understates what it may take; a
// client whose limit is unknown (it exited, pinnedLimit) says nothing of
// its container's cap.
// The GPUs read go to sc.mpsGPUs, with or without a server, and the
// clients to sc.capped, capped when they have a limit series: their device
// OOMs there are their own limit's (oomCounter).
func (e *Exporter) emitMPS(sc *scrape, m mpsScrape) {
	sc.mpsGPUs = make(map[string]bool, len(sc.in.Devices))
	for _, d := range sc.in.Devices {
		_, sc.mpsGPUs[d.UUID] = m.server[d.UUID]
	}
	for uuid, b := range m.server {
		if !m.serverUnknown[uuid] {
			sc.em.gauge(gpuMPSServerMem, float64(b), sc.index[uuid], uuid)
		}
	}
	if len(m.clients) == 0 || sc.failed[CollectorProcfs] {
		return
	}
	var limited, unlimited, unknown []gpu.Device
	for _, d := range sc.in.Devices {
		procs, ok := m.clients[d.UUID]
		if !ok {
			continue
		}
		l, u := d, d
		l.Processes, u.Processes = nil, nil
		k := d
		k.Processes = nil
		for _, p := range procs {
			switch limit, known := e.pinnedLimit(p.PID, d.UUID); known {
			case limitPinned:
				p.UsedMemoryBytes, p.MemoryUnknown = limit, false
				l.Processes = append(l.Processes, p)
			case limitNone:
				u.Processes = append(u.Processes, p)
			default:
				k.Processes = append(k.Processes, p)
			}
		}
		limited, unlimited, unknown = append(limited, l), append(unlimited, u), append(unknown, k)
	}
	in := sc.in
	without := map[[2]string]bool{}
	in.Devices = unknown
	for _, u := range attribution.Join(in).Usage {
		without[[2]string{u.UUID, u.Namespace + "/" + u.Pod + "/" + u.Container.Container}] = true
	}
	in.Devices = unlimited
	for _, u := range attribution.Join(in).Usage {
		without[[2]string{u.UUID, u.Namespace + "/" + u.Pod + "/" + u.Container.Container}] = true
		sc.capped = append(sc.capped, capped{u.Namespace, u.Pod, u.Container.Container, u.UUID, false})
	}
	in.Devices = limited
	for _, u := range attribution.Join(in).Usage {
		if without[[2]string{u.UUID, u.Namespace + "/" + u.Pod + "/" + u.Container.Container}] {
			continue
		}
		sc.em.gauge(containerMemLimit, float64(u.MemoryBytes), u.Namespace, u.Pod, u.Container.Container, strconv.Itoa(u.GPUIndex), u.UUID)
		sc.capped = append(sc.capped, capped{u.Namespace, u.Pod, u.Container.Container, u.UUID, true})
	}
}

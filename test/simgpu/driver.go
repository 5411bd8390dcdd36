// Package simgpu is the simulated GPU driver of the real test node: the one
// part of the node that is not real.
//
// A real CUDA process opens a context on a GPU through the driver, and the
// driver (so NVML) then lists that process by its host PID with the memory it
// allocated, until the process exits. Driver does the same for the fake-CUDA
// workload (test/simgpu/fakecuda) running in real containers: the workload
// connects to a unix socket that the pod mounts from the host (as the NVIDIA
// container toolkit mounts /dev/nvidia*), the driver learns the connecting
// process's host PID from the kernel (SO_PEERCRED, which translates the PID
// into the driver's PID namespace), and every allocation is checked against
// the GPU's memory: one that does not fit fails, as cudaMalloc does with
// cudaErrorMemoryAllocation. When the process exits, the kernel closes its
// socket and the driver frees its memory, as the real driver frees a dead
// process's context.
//
// MPS: a process whose environment (/proc/<pid>/environ when it opens the
// GPU) carries CUDA_MPS_PINNED_DEVICE_MEM_LIMIT gets that limit, as a real
// MPS client does: an allocation past it fails for that process alone, with
// the GPU's memory still free for the others. A process that sends
// mps-server after opening a GPU is that GPU's MPS server (test/simgpu/fakemps
// plays nvidia-cuda-mps-server): the sim file marks it `mpsServer: true`, and,
// as NVML reports per-process utilization on an MPS GPU for the server alone,
// the SM utilization of the GPU's other processes (its clients) is listed as
// the server's, summed, and not as theirs.
//
// The driver renders the state as the simulated-GPU file of DESIGN.md
// (internal/gpu/sim's format), replaced atomically after every change, so
// that gpuslice's `sim` backend and the libnvidia-ml.so made from the sim
// file (test/libnvml) report the real PIDs of real container processes.
//
// Protocol (one text line each way per request):
//
//	open SELECTOR   -> ok UUID TOTAL FREE       SELECTOR: a GPU UUID, index, or replica ID UUID::N
//	alloc BYTES     -> ok USED | oom FREE       USED: this process's bytes on the GPU after the call
//	free BYTES      -> ok USED
//	sm RATIO        -> ok                       this process's SM utilization, 0..1
//	info            -> ok UUID TOTAL FREE USED
//	mps-server      -> ok                       this process is the GPU's MPS server
package simgpu

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"gopkg.in/yaml.v3"

	"github.com/gpuslice/gpuslice/internal/gpu/sim"
	"github.com/gpuslice/gpuslice/internal/mps"
)

// Default paths, shared by the driver, the workload and test/libnvml: the
// directory a pod mounts as the node's "GPU devices".
const (
	DefaultDir    = "/run/gpuslice-sim"
	SocketName    = "driver.sock"
	SimFileName   = "gpus.yaml"
	EnvDir        = "GPUSLICE_SIM_DIR"
	EnvVisibleDev = "NVIDIA_VISIBLE_DEVICES"
)

// Driver serves the simulated GPUs. Its methods are safe for concurrent use.
type Driver struct {
	dir string
	ln  *net.UnixListener

	mu    sync.Mutex
	base  sim.File              // GPUs as configured, without processes
	procs map[*client]*procInfo // open contexts
	wg    sync.WaitGroup

	// renderMu orders renders: the file last renamed into place holds the
	// newest state, whatever order the clients' goroutines run in.
	renderMu sync.Mutex
}

type client struct {
	conn *net.UnixConn
	pid  int
}

type procInfo struct {
	gpu  int // index in base.GPUs
	used uint64
	sm   *float64
	// limit is the process's MPS pinned memory limit; 0: none.
	limit uint64
	// mpsServer: the process said it is the GPU's MPS server.
	mpsServer bool
}

// Start serves the GPUs of base (their processes are ignored: the driver's
// clients are the processes) on dir/driver.sock and writes dir/gpus.yaml.
// dir is created when missing; a stale socket is replaced.
func Start(dir string, base sim.File) (*Driver, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("simgpu: %w", err)
	}
	sock := filepath.Join(dir, SocketName)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("simgpu: removing stale socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("simgpu: %w", err)
	}
	// Containers run as any user: the socket is the node's device node.
	if err := os.Chmod(sock, 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("simgpu: %w", err)
	}
	d := &Driver{dir: dir, ln: ln, procs: map[*client]*procInfo{}}
	d.setBase(base)
	if err := d.render(); err != nil {
		ln.Close()
		return nil, err
	}
	d.wg.Add(1)
	go d.serve()
	return d, nil
}

// SimFile is the path of the rendered sim file.
func (d *Driver) SimFile() string { return filepath.Join(d.dir, SimFileName) }

// Dir is the directory holding the socket and the sim file.
func (d *Driver) Dir() string { return d.dir }

// Update changes the configured GPUs (utilization, Xid events, errors, …)
// and renders the file again. Processes in the new base are ignored.
func (d *Driver) Update(f func(*sim.File)) error {
	d.mu.Lock()
	f(&d.base)
	d.setBaseLocked(d.base)
	d.mu.Unlock()
	return d.render()
}

// Processes returns the open contexts: host PID → used bytes, per GPU UUID.
func (d *Driver) Processes() map[string]map[int]uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]map[int]uint64{}
	for c, p := range d.procs {
		u := d.base.GPUs[p.gpu].UUID
		if out[u] == nil {
			out[u] = map[int]uint64{}
		}
		out[u][c.pid] += p.used
	}
	return out
}

// MPSServers returns the host PIDs of the MPS servers, per GPU UUID.
func (d *Driver) MPSServers() map[string][]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string][]int{}
	for c, p := range d.procs {
		if p.mpsServer {
			u := d.base.GPUs[p.gpu].UUID
			if !slices.Contains(out[u], c.pid) {
				out[u] = append(out[u], c.pid)
			}
		}
	}
	for _, pids := range out {
		slices.Sort(pids)
	}
	return out
}

// Close stops serving, closes every client and leaves the last file.
func (d *Driver) Close() error {
	err := d.ln.Close()
	d.mu.Lock()
	for c := range d.procs {
		c.conn.Close()
	}
	d.mu.Unlock()
	d.wg.Wait()
	return err
}

func (d *Driver) setBase(f sim.File) {
	d.mu.Lock()
	d.setBaseLocked(f)
	d.mu.Unlock()
}

func (d *Driver) setBaseLocked(f sim.File) {
	gpus := make([]sim.GPU, len(f.GPUs))
	copy(gpus, f.GPUs)
	for i := range gpus {
		gpus[i].Processes = nil
	}
	f.GPUs = gpus
	d.base = f
}

func (d *Driver) serve() {
	defer d.wg.Done()
	for {
		conn, err := d.ln.AcceptUnix()
		if err != nil {
			return
		}
		pid, err := peerPID(conn)
		if err != nil {
			fmt.Fprintf(conn, "err %v\n", err)
			conn.Close()
			continue
		}
		d.wg.Add(1)
		go d.handle(&client{conn: conn, pid: pid})
	}
}

// peerPID is the connecting process's PID in this process's PID namespace.
func peerPID(conn *net.UnixConn) (int, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("SO_PEERCRED: %w", serr)
	}
	if cred.Pid <= 0 {
		return 0, errors.New("SO_PEERCRED: the peer's PID is not visible in the driver's PID namespace")
	}
	return int(cred.Pid), nil
}

func (d *Driver) handle(c *client) {
	defer d.wg.Done()
	defer func() {
		c.conn.Close()
		d.mu.Lock()
		_, had := d.procs[c]
		delete(d.procs, c)
		d.mu.Unlock()
		if had {
			_ = d.render()
		}
	}()
	sc := bufio.NewScanner(c.conn)
	for sc.Scan() {
		reply, changed := d.request(c, sc.Text())
		if changed {
			if err := d.render(); err != nil {
				reply = "err " + err.Error()
			}
		}
		if _, err := fmt.Fprintln(c.conn, reply); err != nil {
			return
		}
	}
}

// request runs one protocol line; changed says the file must be rendered.
func (d *Driver) request(c *client, line string) (reply string, changed bool) {
	verb, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.procs[c]
	if verb != "open" && p == nil {
		return "err no GPU opened: send open first", false
	}
	switch verb {
	case "open":
		if p != nil {
			return "err a GPU is already open on this connection", false
		}
		i, err := d.lookup(arg)
		if err != nil {
			return "err " + err.Error(), false
		}
		if msg := d.base.GPUs[i].Error; msg != "" {
			return "err " + msg, false
		}
		g := d.base.GPUs[i]
		d.procs[c] = &procInfo{gpu: i, limit: pinnedLimit(c.pid, g.UUID)}
		return fmt.Sprintf("ok %s %d %d", g.UUID, g.MemoryTotalBytes, g.MemoryTotalBytes-d.usedLocked(i)), true
	case "alloc", "free":
		n, err := strconv.ParseUint(arg, 10, 64)
		if err != nil {
			return fmt.Sprintf("err %s: bad byte count %q", verb, arg), false
		}
		if verb == "free" {
			p.used -= min(n, p.used)
			return fmt.Sprintf("ok %d", p.used), true
		}
		total := d.base.GPUs[p.gpu].MemoryTotalBytes
		used := d.usedLocked(p.gpu)
		if n > total-used {
			return fmt.Sprintf("oom %d", total-used), false
		}
		if p.limit > 0 && p.used+n > p.limit {
			return fmt.Sprintf("oom %d", p.limit-min(p.used, p.limit)), false
		}
		p.used += n
		return fmt.Sprintf("ok %d", p.used), true
	case "sm":
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return fmt.Sprintf("err sm: bad ratio %q (want 0..1)", arg), false
		}
		p.sm = &r
		return "ok", true
	case "mps-server":
		p.mpsServer = true
		return "ok", true
	case "info":
		g := d.base.GPUs[p.gpu]
		used := d.usedLocked(p.gpu)
		return fmt.Sprintf("ok %s %d %d %d", g.UUID, g.MemoryTotalBytes, g.MemoryTotalBytes-used, p.used), false
	}
	return fmt.Sprintf("err unknown request %q", verb), false
}

// pinnedLimit is the MPS pinned memory limit on the GPU uuid that process
// pid started with, 0 when it has none (or its environment is unreadable).
func pinnedLimit(pid int, uuid string) uint64 {
	env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return 0
	}
	for _, kv := range strings.Split(string(env), "\x00") {
		v, ok := strings.CutPrefix(kv, mps.EnvPinnedMemLimit+"=")
		if !ok {
			continue
		}
		limits, err := mps.ParsePinnedLimit(v)
		if err != nil {
			return 0
		}
		limit, _ := mps.LimitFor(limits, uuid)
		return limit
	}
	return 0
}

// lookup resolves an NVIDIA_VISIBLE_DEVICES entry: a UUID, an index, or a
// replica ID "UUID::N" (what a time-slicing plugin hands out).
func (d *Driver) lookup(sel string) (int, error) {
	sel = strings.TrimSpace(sel)
	if u, _, ok := strings.Cut(sel, "::"); ok {
		sel = u
	}
	for i, g := range d.base.GPUs {
		if g.UUID == sel {
			return i, nil
		}
	}
	if i, err := strconv.Atoi(sel); err == nil && i >= 0 && i < len(d.base.GPUs) {
		return i, nil
	}
	return 0, fmt.Errorf("no GPU %q on this node", sel)
}

func (d *Driver) usedLocked(gpu int) uint64 {
	var used uint64
	for _, p := range d.procs {
		if p.gpu == gpu {
			used += p.used
		}
	}
	return used
}

// render writes the sim file: the base GPUs with one process per host PID
// (a process with several connections to one GPU is listed once, summed).
// On a GPU with an MPS server, the clients' SM utilization is the server's.
func (d *Driver) render() error {
	d.renderMu.Lock()
	defer d.renderMu.Unlock()
	d.mu.Lock()
	f := d.base
	f.GPUs = make([]sim.GPU, len(d.base.GPUs))
	copy(f.GPUs, d.base.GPUs)
	type key struct{ gpu, pid int }
	merged := map[key]*sim.Process{}
	server := map[int]int{} // GPU -> its MPS server's PID
	for c, p := range d.procs {
		if p.mpsServer {
			server[p.gpu] = c.pid
		}
	}
	for c, p := range d.procs {
		k := key{p.gpu, c.pid}
		m := merged[k]
		if m == nil {
			m = &sim.Process{PID: c.pid}
			merged[k] = m
		}
		m.UsedMemoryBytes += p.used
		m.MPSServer = m.MPSServer || p.mpsServer
		if p.sm == nil {
			continue
		}
		if pid, ok := server[p.gpu]; ok && pid != c.pid {
			// NVML samples the MPS server for all of its clients.
			k = key{p.gpu, pid}
			if m = merged[k]; m == nil {
				m = &sim.Process{PID: pid}
				merged[k] = m
			}
		}
		v := *p.sm
		if m.SMUtilization != nil {
			v += *m.SMUtilization
		}
		m.SMUtilization = &v
	}
	for _, m := range merged {
		if m.MPSServer && m.SMUtilization != nil && *m.SMUtilization > 1 {
			v := 1.0
			m.SMUtilization = &v
		}
	}
	d.mu.Unlock()
	keys := make([]key, 0, len(merged))
	for k := range merged {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].gpu != keys[j].gpu {
			return keys[i].gpu < keys[j].gpu
		}
		return keys[i].pid < keys[j].pid
	})
	for _, k := range keys {
		f.GPUs[k.gpu].Processes = append(f.GPUs[k.gpu].Processes, *merged[k])
	}
	data, err := yaml.Marshal(&f)
	if err != nil {
		return fmt.Errorf("simgpu: %w", err)
	}
	return writeAtomic(d.SimFile(), data)
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".gpus-*.yaml")
	if err != nil {
		return fmt.Errorf("simgpu: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("simgpu: writing %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("simgpu: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("simgpu: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("simgpu: %w", err)
	}
	return nil
}

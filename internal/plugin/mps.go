package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/podresources"
)

// CUDA MPS clients read these from their environment. The pinned limit is
// what makes MPS worth choosing over time-slicing: a client that passes it
// gets a clean out-of-memory while the other clients keep their memory.
const (
	// EnvMPSPipeDirectory is where the client finds the control daemon's
	// pipes.
	EnvMPSPipeDirectory = "CUDA_MPS_PIPE_DIRECTORY"
	// EnvMPSPinnedMemLimit caps the device memory the client may
	// allocate: "<ordinal>=<limit>" pairs separated by commas, such as
	// "0=12288M". Ordinals are the client's own CUDA device numbers.
	EnvMPSPinnedMemLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	// EnvMPSThreadPercentage caps the share of the SMs the client's
	// kernels may occupy, in percent.
	EnvMPSThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
)

// The MPS directory layout of NVIDIA's mps-control-daemon (v0.19,
// cmd/mps-control-daemon/mps root.go and daemon.go), kept so that NVIDIA's
// daemon and our chart's daemon serve gpuslice-plugin alike: under a host
// root (its chart's mps.root, /run/nvidia/mps), one directory per resource
// name holding pipe/ and log/, a .started file written once the daemon runs
// with its limits set, and shm/ shared by all resources. Containers see the
// root at /mps and the shm directory at /dev/shm.
const (
	// DefaultMPSRoot is NVIDIA's chart default for mps.root.
	DefaultMPSRoot = "/run/nvidia/mps"
	// MPSContainerRoot is where a container sees the MPS root.
	MPSContainerRoot = "/mps"
	mpsShmContainer  = "/dev/shm"
)

// ErrMPSDaemon is wrapped by errors about a missing or unready MPS control
// daemon.
var ErrMPSDaemon = errors.New("MPS control daemon not ready")

// MPSPipeDir is the pipe directory of resource's daemon under root.
func MPSPipeDir(root, resource string) string { return filepath.Join(root, resource, "pipe") }

// MPSLogDir is the log directory of resource's daemon under root.
func MPSLogDir(root, resource string) string { return filepath.Join(root, resource, "log") }

// MPSStartedFile is the file a daemon writes once it serves resource.
func MPSStartedFile(root, resource string) string { return filepath.Join(root, resource, ".started") }

// MPSShmDir is the host directory mounted at /dev/shm in MPS clients.
func MPSShmDir(root string) string { return filepath.Join(root, "shm") }

// checkMPSDaemon reports whether resource's daemon has started under root
// (as this process sees it): its .started file and its pipe directory. A
// daemon that died leaves them behind; the chart's liveness probe restarts
// it, and the pipe directory is the one the clients need in any case.
func checkMPSDaemon(root, resource string) error {
	started := MPSStartedFile(root, resource)
	if _, err := os.Stat(started); err != nil {
		return fmt.Errorf("%w for %s: %w", ErrMPSDaemon, resource, err)
	}
	pipe := MPSPipeDir(root, resource)
	if st, err := os.Stat(pipe); err != nil {
		return fmt.Errorf("%w for %s: %w", ErrMPSDaemon, resource, err)
	} else if !st.IsDir() {
		return fmt.Errorf("%w for %s: %s is not a directory", ErrMPSDaemon, resource, pipe)
	}
	return nil
}

const mib = 1 << 20

// MPSMemoryLimit is one MPS replica's pinned memory: the GPU's memory
// divided by its replicas, rounded down to MiB, as NVIDIA's daemon computes
// its default limit (perDevicePinnedDeviceMemoryLimits, "%vM").
func MPSMemoryLimit(total uint64, replicas int) uint64 {
	return total / uint64(max(replicas, 1)) / mib * mib
}

// MPSThreadPercentage is one replica's share of the SMs: 100/replicas,
// NVIDIA's activeThreadPercentage.
func MPSThreadPercentage(replicas int) int { return 100 / max(replicas, 1) }

// mpsGrant is what one MPS container gets: its limit per GPU (the same on
// each, the smallest share among them, since the order in which CUDA numbers
// a container's GPUs is not ours to know) and its SM share.
type mpsGrant struct {
	resource string
	gpus     int
	limit    uint64
	percent  int
}

// mpsGrantFor returns the grant of a container holding ids, and false when
// none of them is on a GPU shared through MPS.
func mpsGrantFor(p plan, ids []string) (mpsGrant, bool) {
	var g mpsGrant
	seen := map[string]bool{}
	replicas := 1
	for _, raw := range ids {
		id, err := podresources.ParseDeviceID(raw)
		if err != nil || seen[id.UUID] {
			continue
		}
		seen[id.UUID] = true
		res, ok := p.MPS[id.UUID]
		if !ok {
			continue
		}
		g.resource = res
		g.gpus++
		limit := MPSMemoryLimit(p.GPUs[id.UUID].MemoryTotalBytes, p.Replicas[id.UUID])
		if g.limit == 0 || limit < g.limit {
			g.limit = limit
		}
		replicas = max(replicas, p.Replicas[id.UUID])
	}
	g.percent = MPSThreadPercentage(replicas)
	return g, g.gpus > 0
}

// formatPinnedLimit writes the limit for ordinals 0..gpus-1.
func formatPinnedLimit(gpus int, limit uint64) string {
	parts := make([]string, gpus)
	for i := range parts {
		parts[i] = strconv.Itoa(i) + "=" + strconv.FormatUint(limit/mib, 10) + "M"
	}
	return strings.Join(parts, ",")
}

// ParsePinnedLimit reads a CUDA_MPS_PINNED_DEVICE_MEM_LIMIT value into
// bytes per device key (an ordinal, or whatever the client wrote). Units
// are CUDA's: a number with K, M, G or T (binary multiples, a trailing B
// allowed) or none (bytes).
func ParsePinnedLimit(s string) (map[string]uint64, error) {
	out := map[string]uint64{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		key, val, ok := strings.Cut(part, "=")
		if !ok || key == "" || val == "" {
			return nil, fmt.Errorf("pinned memory limit %q: want <device>=<limit>", part)
		}
		if len(val) > 1 && (val[len(val)-1] == 'B' || val[len(val)-1] == 'b') && (val[len(val)-2] < '0' || val[len(val)-2] > '9') {
			val = val[:len(val)-1] // "512MB"
		}
		mult := uint64(1)
		switch val[len(val)-1] {
		case 'K', 'k':
			mult = 1 << 10
		case 'M', 'm':
			mult = 1 << 20
		case 'G', 'g':
			mult = 1 << 30
		case 'T', 't':
			mult = 1 << 40
		}
		if mult != 1 {
			val = val[:len(val)-1]
		}
		n, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("pinned memory limit %q: %w", part, err)
		}
		out[key] = n * mult
	}
	return out, nil
}

// addMPS adds what an MPS client needs to r: the pipe directory mounted
// where CUDA_MPS_PIPE_DIRECTORY says, the shared memory directory, its
// pinned memory limit and thread percentage.
func addMPS(r *pluginapi.ContainerAllocateResponse, root string, g mpsGrant) {
	if r.Envs == nil {
		r.Envs = map[string]string{}
	}
	pipe := MPSPipeDir(MPSContainerRoot, g.resource)
	r.Envs[EnvMPSPipeDirectory] = pipe
	r.Envs[EnvMPSPinnedMemLimit] = formatPinnedLimit(g.gpus, g.limit)
	r.Envs[EnvMPSThreadPercentage] = strconv.Itoa(g.percent)
	r.Mounts = append(r.Mounts,
		&pluginapi.Mount{ContainerPath: pipe, HostPath: MPSPipeDir(root, g.resource)},
		&pluginapi.Mount{ContainerPath: mpsShmContainer, HostPath: MPSShmDir(root)},
	)
}

// rememberMPS notes the limit the MPS device IDs ids were given.
func (p *Plugin) rememberMPS(resource string, ids []string, limit uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		p.mpsGiven[held{ID: id, Resource: resource}] = limit
	}
}

// mpsSeries is one GPU's MPS metrics.
type mpsSeries struct {
	resource, uuid string
	limit          uint64
	stale          int
}

// mpsSeriesLocked returns, for every GPU shared through MPS, the limit new
// containers get and how many IDs in use were given another one (known for
// the allocations this process made). p.mu is held.
func (p *Plugin) mpsSeriesLocked() []mpsSeries {
	var out []mpsSeries
	inUse := map[held]bool{}
	for _, h := range p.held {
		inUse[h] = true
	}
	for h := range p.recent {
		inUse[h] = true
	}
	for uuid, res := range p.plan.MPS {
		s := mpsSeries{resource: res, uuid: uuid, limit: MPSMemoryLimit(p.plan.GPUs[uuid].MemoryTotalBytes, p.plan.Replicas[uuid])}
		for h, given := range p.mpsGiven {
			id, err := podresources.ParseDeviceID(h.ID)
			if err == nil && id.UUID == uuid && inUse[h] && given != s.limit {
				s.stale++
			}
		}
		out = append(out, s)
	}
	return out
}

package plugin

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/mps"
	"github.com/gpuslice/gpuslice/internal/podresources"
)

// ErrMPSDaemon is wrapped by errors about a missing or unready MPS control
// daemon.
var ErrMPSDaemon = errors.New("MPS control daemon not ready")

// checkMPSDaemon reports whether resource's daemon has started under root
// (as this process sees it): its .started file and its pipe directory. A
// daemon that died leaves them behind; the chart's liveness probe restarts
// it, and the pipe directory is the one the clients need in any case.
func checkMPSDaemon(root, resource string) error {
	started := mps.StartedFile(root, resource)
	if _, err := os.Stat(started); err != nil {
		return fmt.Errorf("%w for %s: %w", ErrMPSDaemon, resource, err)
	}
	pipe := mps.PipeDir(root, resource)
	if st, err := os.Stat(pipe); err != nil {
		return fmt.Errorf("%w for %s: %w", ErrMPSDaemon, resource, err)
	} else if !st.IsDir() {
		return fmt.Errorf("%w for %s: %s is not a directory", ErrMPSDaemon, resource, pipe)
	}
	return nil
}

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
		limit := mps.MemoryLimit(p.GPUs[id.UUID].MemoryTotalBytes, p.Replicas[id.UUID])
		if g.limit == 0 || limit < g.limit {
			g.limit = limit
		}
		replicas = max(replicas, p.Replicas[id.UUID])
	}
	g.percent = mps.ThreadPercentage(replicas)
	return g, g.gpus > 0
}

// addMPS adds what an MPS client needs to r: the pipe directory mounted
// where CUDA_MPS_PIPE_DIRECTORY says, the shared memory directory, its
// pinned memory limit and thread percentage.
func addMPS(r *pluginapi.ContainerAllocateResponse, root string, g mpsGrant) {
	if r.Envs == nil {
		r.Envs = map[string]string{}
	}
	pipe := mps.PipeDir(mps.ContainerRoot, g.resource)
	r.Envs[mps.EnvPipeDirectory] = pipe
	r.Envs[mps.EnvPinnedMemLimit] = mps.FormatPinnedLimit(g.gpus, g.limit)
	r.Envs[mps.EnvThreadPercentage] = strconv.Itoa(g.percent)
	r.Mounts = append(r.Mounts,
		&pluginapi.Mount{ContainerPath: pipe, HostPath: mps.PipeDir(root, g.resource)},
		&pluginapi.Mount{ContainerPath: mps.ShmContainerDir, HostPath: mps.ShmDir(root)},
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
		s := mpsSeries{resource: res, uuid: uuid, limit: mps.MemoryLimit(p.plan.GPUs[uuid].MemoryTotalBytes, p.plan.Replicas[uuid])}
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

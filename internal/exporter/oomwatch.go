package exporter

import (
	"context"
	"errors"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/attribution"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/pods"
)

// DefaultOOMWatchInterval is how often RunOOMWatch looks for OOMs between
// scrapes when the pod source says nothing.
const DefaultOOMWatchInterval = 2 * time.Second

// minWatchGap spaces the scans that pod events start: a node's pods change
// status many times a second under churn, and one scan covers them all.
const minWatchGap = 250 * time.Millisecond

// RunOOMWatch looks for GPU OOM events between scrapes, every interval and
// whenever the pod source reports a change, until ctx ends.
//
// Why scrapes are not enough (seen on a real kubelet): a crash-looping
// container that OOMs 2 s after each start lives through several runs
// between two 60 s scrapes; the kubelet keeps the log of only the newest
// dead instance, removing older ones when it collects dead containers, and
// pod status reports only the last termination, so runs were lost at 15 s
// and 60 s scrape intervals. A restartPolicy: Never pod that OOMs in its
// first second had left the PodResources list (the kubelet lists active
// pods only) before any scrape saw it, so it was never watched at all.
//
// So each scan watches, besides the containers a scrape found holding or
// using a GPU, every container that the kubelet lists with a GPU and every
// container of the node's pods whose limits ask for a GPU resource (the
// resources the kubelet reports GPU devices for, and nvidia.com/*), terminal
// pods included, and reads their new log lines and terminations at once.
func (e *Exporter) RunOOMWatch(ctx context.Context, interval time.Duration) {
	if e.cfg.OOM == nil {
		return
	}
	if interval <= 0 {
		interval = DefaultOOMWatchInterval
	}
	kick := make(chan struct{}, 1)
	if n, ok := e.cfg.Pods.(pods.Notifier); ok {
		n.OnChange(func() {
			select {
			case kick <- struct{}{}:
			default:
			}
		})
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	// The first scan takes the detector's baseline: log files present now
	// are history, files created after it are read from their start.
	e.watchOnce(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-kick:
		}
		e.watchOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(minWatchGap):
		}
	}
}

// watchOnce is one scan between scrapes.
func (e *Exporter) watchOnce(ctx context.Context) {
	var allocs []podresources.Allocation
	var allocatable []podresources.Allocatable
	if e.cfg.Kubelet != nil {
		cctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
		var err, aerr error
		allocs, err = e.cfg.Kubelet.List(cctx)
		allocatable, aerr = e.cfg.Kubelet.Allocatable(cctx)
		cancel()
		if err = errors.Join(err, aerr); err != nil {
			// The scrape's podresources collector reports it; the pod
			// list below still finds the GPU containers.
			e.log.Debug("OOM watch: reading pod resources", "err", err)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// Resources whose devices are GPU IDs, renamed time-slicing resources
	// included: containers asking for them are watched even when they
	// ended before any listing showed them holding one.
	for _, a := range allocatable {
		for _, id := range a.DeviceIDs {
			if _, err := podresources.ParseDeviceID(id); err == nil {
				e.gpuResources[a.Resource] = true
				break
			}
		}
	}
	now := e.cfg.Now()
	byName := podsByName(e.cfg.Pods)
	res := attribution.Join(attribution.Input{Allocations: allocs, Pods: e.cfg.Pods, MIGParents: e.migParent})
	for _, h := range res.Holdings {
		e.gpuResources[h.Resource] = true
	}
	e.ooms.markResult(byName, res, now)
	fallback := e.onlyGPU()
	for _, p := range byName {
		for _, c := range gpuContainers(p, e.gpuResources) {
			e.ooms.mark(byName, p.Namespace, p.Name, c, fallback, now)
		}
	}
	if err := e.ooms.scanWatched(byName, now); err != nil {
		e.log.Debug("OOM watch: scanning", "err", err)
	}
}

// onlyGPU is the node's GPU when it has exactly one: the GPU to blame for
// the OOM of a container that asked for a GPU but was never seen holding
// one (it ended before any listing); "" otherwise.
func (e *Exporter) onlyGPU() string {
	if len(e.index) != 1 {
		return ""
	}
	for u := range e.index {
		return u
	}
	return ""
}

// gpuContainers lists the pod's containers (init containers too) whose
// limits ask for a GPU resource: one the kubelet has listed GPU devices
// for, or any nvidia.com/ resource (NVIDIA's plugin names them so, renamed
// time-slicing resources and MIG profiles included).
func gpuContainers(p *corev1.Pod, known map[string]bool) []string {
	var out []string
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range list {
			for r := range list[i].Resources.Limits {
				name := string(r)
				if known[name] || strings.HasPrefix(name, "nvidia.com/") {
					out = append(out, list[i].Name)
					break
				}
			}
		}
	}
	return out
}

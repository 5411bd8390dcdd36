// Package plugin is gpuslice's kubelet device plugin for NVIDIA GPUs shared
// by time-slicing or CUDA MPS (mps.go: each container a pinned memory limit
// and SM share, through a control daemon per node). It reads NVIDIA's
// device-plugin config (package dpconfig), advertises <uuid>::<n> replica IDs per resource the way NVIDIA's plugin does, and —
// unlike NVIDIA's plugin — applies a new config on the open ListAndWatch
// streams, without stopping its gRPC servers or registering again, so the
// kubelet's allocatable changes within a second and never drops to 0.
//
// Lowering replicas never takes a device from a running pod: the IDs the
// kubelet has given out (its PodResources API, and its device-manager
// checkpoint for those of init containers: checkpoint.go) stay advertised
// until their pods end (see computePlan).
package plugin

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/podresources"
)

// ErrUnsupported means a config asks for something gpuslice-plugin does not
// do (MPS without an MPS root).
var ErrUnsupported = errors.New("not supported by gpuslice-plugin")

// Lister lists the kubelet's device allocations; *podresources.Client is one.
type Lister interface {
	List(ctx context.Context) ([]podresources.Allocation, error)
}

// instanceLister is a Lister that can tell which socket file it is served
// on (*podresources.Client can). A new one is a kubelet restart, seen from
// the PodResources socket, which a starting kubelet may serve before it
// creates kubelet.sock again: its answers may lack pods still running until
// it has read its pods back.
type instanceLister interface {
	Lister
	podresources.InstanceTeller
}

// Options configure a Plugin. Backend and Source are required.
type Options struct {
	Backend gpu.Backend
	Source  Source
	// PodResources tells which IDs are in use, so a shrink keeps them.
	// Nil leaves the kubelet's checkpoint (KubeletCheckpoint), which also
	// lists ended pods until the kubelet's next allocation, and this
	// process's own allocations, for 3 HeldIntervals + 1 min after each.
	PodResources Lister
	// CheckpointHold is how long an ID the kubelet's checkpoint lists and
	// no PodResources answer has is kept advertised after a shrink;
	// default 2 minutes (checkpoint.go says why it is bounded).
	CheckpointHold time.Duration
	// KubeletCheckpoint is the kubelet's device-manager checkpoint, read
	// for the IDs of init containers, which PodResources leaves out
	// (checkpoint.go); default <directory of KubeletSocket>/
	// kubelet_internal_checkpoint. An unreadable one is logged and
	// ignored.
	KubeletCheckpoint string
	// DevicePluginDir holds the plugin sockets; default
	// /var/lib/kubelet/device-plugins.
	DevicePluginDir string
	// KubeletSocket is the kubelet's registration socket; default
	// <DevicePluginDir>/kubelet.sock.
	KubeletSocket string
	Policy        Policy // default Distributed
	// Guardrails names the resources whose allocations get the memory
	// guardrail variables (guardrails.go); nil or empty: none.
	Guardrails map[string]bool
	// HealthInterval is how often GPUs are read (default 5 s);
	// RecoveryInterval how long a GPU must answer well after its last
	// problem to be healthy again (default 1 min); HeldInterval how often
	// the IDs in use are read (default 10 s).
	HealthInterval, RecoveryInterval, HeldInterval time.Duration
	// RestartGrace is how long after the kubelet restarts (its
	// PodResources socket or kubelet.sock created again) a PodResources
	// answer may add IDs in use but not drop any (default 2 min). A real
	// kubelet (v1.37.1) answers PodResources right after a restart, before
	// it has rebuilt its pod list: an ID dropped then would stop being
	// advertised, and the pod holding it would fail re-admission.
	RestartGrace time.Duration
	// RetireAfter is how long an ID dropped from a resource's list (a
	// lowered count, a released ID above it, a renamed resource) stays
	// listed as unhealthy before it goes (default 1 min). The kubelet
	// picks a free healthy ID and calls Allocate without its lock held;
	// when Allocate returns it reads the ID's entry in its device map, and
	// kubelet v1.37.1 dereferences that entry unchecked
	// (devicemanager/manager.go:945): an ID gone from the list between the
	// pick and the return crashes the kubelet. Seen on the real node: with
	// the count lowered 6 → 2 and three IDs held, a pod ended, the
	// scheduler placed a waiting pod at once, and the list that dropped
	// the ended pod's ID reached the kubelet during that pod's Allocate: a
	// nil pointer panic there (test/realnode's
	// TestAllocateRaceOnRealKubelet reproduces it, and shows an ID marked
	// unhealthy instead is safe). An unhealthy ID stays in that map, and
	// the kubelet picks only healthy ones.
	RetireAfter time.Duration
	// MPSRoot is the host directory of the MPS control daemons (NVIDIA's
	// layout, mps.go), seen at the same path by this process; empty
	// refuses configs with sharing.mps, as NVIDIA's plugin refuses MPS
	// without --mps-root.
	MPSRoot string
	// Registerer receives the plugin's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Now is the clock of health recovery; default time.Now.
	Now func() time.Time
}

// Plugin serves one gRPC device plugin per advertised resource.
type Plugin struct {
	o       Options
	log     *slog.Logger
	metrics *metrics

	mu       sync.Mutex
	cfg      *dpconfig.Config
	cfgData  []byte
	health   *healthTracker
	readOnce bool   // the backend answered at least once
	held     []held // from PodResources
	// kubeletRestarted is when the kubelet was last seen starting again:
	// kubelet.sock created, or a PodResources answer from a new socket.
	kubeletRestarted time.Time
	// podResourcesAt is the PodResources socket of the latest answer,
	// asked at podResourcesAsked.
	podResourcesAt    podresources.Instance
	podResourcesAsked time.Time
	recent            map[held]time.Time
	// checkpointHeld are the IDs of the kubelet checkpoint's entries that
	// no PodResources answer has vouched for, as of its last reading;
	// vouched the entries' IDs one has (checkpoint.go).
	checkpointHeld []held
	vouched        map[checkpointKey]bool
	// unvouchedSince is when each entry no answer has vouched for was
	// first read: it counts for CheckpointHold from then (checkpoint.go).
	unvouchedSince map[checkpointKey]time.Time
	// checkpointErr is why the checkpoint could not be read last, so
	// that each reason is logged once.
	checkpointErr string
	// retiring holds the IDs dropped from a list, by resource, with when
	// they were dropped: listed as unhealthy until RetireAfter has passed
	// with no Allocate in flight (Options.RetireAfter says why).
	retiring map[held]time.Time
	plan     plan
	warned   map[string]bool
	// heldFailing is set while the PodResources API does not answer, so
	// that an outage is logged once.
	heldFailing atomic.Bool
	servers     map[string]*resourceServer
	runCtx      context.Context
	wg          sync.WaitGroup
	changed     chan struct{} // closed and replaced on every recompute, for tests

	// mpsDown holds, per MPS resource, why its control daemon is not
	// ready; its devices are unhealthy meanwhile.
	mpsDown map[string]error
	// mpsGiven is the pinned memory limit each MPS device ID was given
	// at its last Allocate: a container keeps the limit it started with
	// when the replica count changes, and the metrics count those that
	// hold another one than new containers get.
	mpsGiven map[held]uint64
}

// New checks the options and builds a Plugin; Run starts it.
func New(o Options) (*Plugin, error) {
	if o.Backend == nil || o.Source == nil {
		return nil, errors.New("plugin: Backend and Source are required")
	}
	if o.DevicePluginDir == "" {
		o.DevicePluginDir = pluginapi.DevicePluginPath
	}
	if o.KubeletSocket == "" {
		o.KubeletSocket = filepath.Join(o.DevicePluginDir, filepath.Base(pluginapi.KubeletSocket))
	}
	if o.KubeletCheckpoint == "" {
		o.KubeletCheckpoint = filepath.Join(filepath.Dir(o.KubeletSocket), kubeletCheckpointName)
	}
	if o.Policy == "" {
		o.Policy = Distributed
	}
	if _, err := ParsePolicy(string(o.Policy)); err != nil {
		return nil, err
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = 5 * time.Second
	}
	if o.RecoveryInterval < 0 {
		return nil, fmt.Errorf("plugin: negative recovery interval %v", o.RecoveryInterval)
	}
	if o.RecoveryInterval == 0 {
		o.RecoveryInterval = time.Minute
	}
	if o.CheckpointHold <= 0 {
		o.CheckpointHold = 2 * time.Minute
	}
	if o.RestartGrace <= 0 {
		o.RestartGrace = 2 * time.Minute
	}
	if o.HeldInterval <= 0 {
		o.HeldInterval = 10 * time.Second
	}
	if o.RetireAfter <= 0 {
		o.RetireAfter = time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	p := &Plugin{
		o: o, log: o.Logger,
		health:         newHealthTracker(o.RecoveryInterval, o.Logger),
		recent:         map[held]time.Time{},
		vouched:        map[checkpointKey]bool{},
		unvouchedSince: map[checkpointKey]time.Time{},
		retiring:       map[held]time.Time{},
		warned:         map[string]bool{},
		servers:        map[string]*resourceServer{},
		changed:        make(chan struct{}),

		mpsDown:  map[string]error{},
		mpsGiven: map[held]uint64{},
	}
	p.metrics = newMetrics(p)
	if o.Registerer != nil {
		if err := o.Registerer.Register(p.metrics); err != nil {
			return nil, fmt.Errorf("plugin: registering metrics: %w", err)
		}
	}
	return p, nil
}

// Run serves until ctx ends, then stops every server and removes its socket.
// It returns an error when it cannot start (no device-plugin directory to
// watch) or the config source fails.
func (p *Plugin) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching for kubelet restarts: %w", err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(p.o.KubeletSocket)); err != nil {
		return fmt.Errorf("watching %s for kubelet restarts: %w", filepath.Dir(p.o.KubeletSocket), err)
	}
	p.mu.Lock()
	p.runCtx = ctx
	p.mu.Unlock()

	errc := make(chan error, 1)
	p.goRun(func() { p.healthLoop(ctx) })
	p.goRun(func() { p.heldLoop(ctx) })
	p.goRun(func() {
		if err := p.o.Source.Run(ctx, p.apply); err != nil && ctx.Err() == nil {
			errc <- fmt.Errorf("config source: %w", err)
		}
	})
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case runErr = <-errc:
			break loop
		case ev, ok := <-w.Events:
			if !ok {
				runErr = errors.New("kubelet socket watcher closed")
				break loop
			}
			if filepath.Clean(ev.Name) == filepath.Clean(p.o.KubeletSocket) && ev.Has(fsnotify.Create) {
				p.log.Info("kubelet socket created: registering again", "socket", p.o.KubeletSocket)
				p.mu.Lock()
				p.kubeletRestarted = time.Now()
				for _, s := range p.servers {
					poke(s.kick)
				}
				p.mu.Unlock()
			}
		case err := <-w.Errors:
			p.log.Warn("kubelet socket watcher", "err", err)
		}
	}
	cancel()
	p.wg.Wait()
	return runErr
}

func (p *Plugin) goRun(f func()) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
}

// apply takes a new config document from the source.
func (p *Plugin) apply(u Update) error {
	err := p.applyConfig(u)
	if err != nil {
		p.metrics.configValid.Set(0)
		p.metrics.reloadFailures.Inc()
		p.log.Error("device-plugin config rejected; keeping the last good one", "err", err)
	}
	return err
}

func (p *Plugin) applyConfig(u Update) error {
	if u.Err != nil {
		return fmt.Errorf("%s: %w", u.Origin, u.Err)
	}
	f, err := dpconfig.Parse(u.Data)
	if err != nil {
		return fmt.Errorf("%s: %w", u.Origin, err)
	}
	cfg := f.Config()
	if cfg.MPS && p.o.MPSRoot == "" {
		return fmt.Errorf("%s: sharing.mps: %w (set --mps-root)", u.Origin, ErrUnsupported)
	}
	p.mu.Lock()
	same := p.cfg != nil && bytes.Equal(p.cfgData, u.Data)
	gpus := p.health.gpus()
	p.mu.Unlock()
	if err := checkSize(cfg, gpus); err != nil {
		return fmt.Errorf("%s: %w", u.Origin, err)
	}
	if same {
		// The config in use again, after a rejected one perhaps.
		p.metrics.configValid.Set(1)
		return nil
	}
	// Read the IDs in use now, not up to HeldInterval ago: a shrink must
	// not drop an ID given out since.
	heldNow, heldErr := p.listHeld()

	p.mu.Lock()
	defer p.mu.Unlock()
	p.setCheckpointLocked(heldNow, heldErr == nil)
	if heldErr == nil {
		p.setHeldLocked(heldNow)
	}
	p.cfg, p.cfgData = &cfg, bytes.Clone(u.Data)
	p.metrics.reloads.Inc()
	p.metrics.configValid.Set(1)
	p.log.Info("device-plugin config applied", "origin", u.Origin, "replicas", cfg.Replicas(), "resources", len(cfg.Resources))
	p.recomputeLocked()
	return nil
}

// heldAnswer is one PodResources answer: the IDs in use; when the question
// was asked (the answer covers every Allocate that returned before); and
// the kubelet socket read right after it, zero when the Lister cannot tell.
// With it, the kubelet's checkpoint read just before the question.
type heldAnswer struct {
	ids     []held
	started time.Time
	socket  podresources.Instance
	// tells: the Lister tells sockets apart (socket unknown then means
	// it was gone right after the answer).
	tells bool
	// checkpoint holds the checkpoint's entries, or checkpointErr why it
	// could not be read.
	checkpoint    []checkpointEntry
	checkpointErr error
}

// listHeld reads the device IDs the kubelet has given out: its checkpoint,
// then its PodResources API. The answer's error is PodResources'; the
// checkpoint's is in the answer.
func (p *Plugin) listHeld() (heldAnswer, error) {
	var a heldAnswer
	// First: an answer vouches for an entry only if it was asked after
	// the entry was read (checkpoint.go).
	a.checkpoint, a.checkpointErr = readCheckpoint(p.o.KubeletCheckpoint)
	if p.o.PodResources == nil {
		return a, errNoPodResources
	}
	a.started = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	allocs, err := p.o.PodResources.List(ctx)
	if err != nil {
		if !p.heldFailing.Swap(true) {
			p.log.Warn("cannot read the IDs in use from the kubelet; using the last known ones", "err", err)
		}
		return a, err
	}
	if il, ok := p.o.PodResources.(instanceLister); ok {
		// Read after the answer: if the kubelet restarted at any moment
		// since the last answer, the socket read now is new.
		a.socket, a.tells = il.Instance(), true
	}
	if p.heldFailing.Swap(false) {
		p.log.Info("reading the IDs in use from the kubelet again")
	}
	for _, al := range allocs {
		if !strings.HasPrefix(al.Resource, "nvidia.com/") {
			continue
		}
		for _, id := range al.DeviceIDs {
			a.ids = append(a.ids, held{ID: id, Resource: al.Resource})
		}
	}
	return a, nil
}

var errNoPodResources = errors.New("no PodResources API configured")

// setHeldLocked records a PodResources answer. p.mu is held.
func (p *Plugin) setHeldLocked(a heldAnswer) {
	ids, started := a.ids, a.started
	if a.tells && !started.Before(p.podResourcesAsked) {
		// A kubelet that starts again serves PodResources before it has
		// read its pods from the API server, and can do so before it
		// creates kubelet.sock: so this answer may be the first sign of
		// the restart. (On the real node, kubelet v1.37.1, the plugin once
		// registered again 6 ms after kubelet.sock appeared already
		// without an ID still held, and no failed PodResources call was
		// logged: most likely an answer of the new kubelet had come
		// first.) A socket gone right after the answer is a kubelet going
		// away or starting again too. An answer asked before the latest
		// one applied (applyConfig and heldLoop both ask) says nothing
		// newer about the socket.
		if p.podResourcesAt.Known() && !a.socket.Same(p.podResourcesAt) {
			what := "new"
			if !a.socket.Known() {
				what = "gone"
			}
			p.log.Info("the kubelet's PodResources socket is "+what+": the kubelet restarted; IDs in use are kept through the restart grace", "grace", p.o.RestartGrace)
			if started.After(p.kubeletRestarted) {
				p.kubeletRestarted = started
			}
		}
		if a.socket.Known() {
			p.podResourcesAt = a.socket
		}
		p.podResourcesAsked = started
	}
	if !p.kubeletRestarted.IsZero() && started.Sub(p.kubeletRestarted) < p.o.RestartGrace {
		// The kubelet may not know every pod yet: keep what it said
		// before, and what this process gave out since, whose record
		// goes below.
		for _, h := range p.held {
			if !slices.Contains(ids, h) {
				ids = append(ids, h)
			}
		}
		for _, h := range sortedHeld(maps.Keys(p.recent)) {
			if !slices.Contains(ids, h) {
				ids = append(ids, h)
			}
		}
	}
	p.held = ids
	for h := range p.mpsGiven {
		if _, recent := p.recent[h]; !recent && !slices.Contains(ids, h) && !slices.Contains(p.checkpointHeld, h) {
			delete(p.mpsGiven, h)
		}
	}
	for h, at := range p.recent {
		// The kubelet records an allocation as soon as Allocate
		// returns; a second of margin covers clock steps.
		if at.Before(started.Add(-time.Second)) {
			delete(p.recent, h)
		}
	}
}

// setCheckpointLocked records the checkpoint read with an answer
// (answered: PodResources answered too) and reports whether the IDs it
// adds changed. p.mu is held.
func (p *Plugin) setCheckpointLocked(a heldAnswer, answered bool) bool {
	if err := a.checkpointErr; err != nil {
		if err.Error() != p.checkpointErr {
			p.checkpointErr = err.Error()
			msg := "cannot read the kubelet's device-manager checkpoint; IDs held by init containers are not known, only those PodResources lists"
			if errors.Is(err, os.ErrNotExist) {
				// Normal until the kubelet first writes it.
				p.log.Info(msg, "err", err)
			} else {
				p.log.Warn(msg, "err", err)
			}
		}
		// As before the checkpoint was read: PodResources alone. What
		// was vouched for stays so.
		changed := len(p.checkpointHeld) > 0
		p.checkpointHeld = nil
		return changed
	}
	if p.checkpointErr != "" {
		p.checkpointErr = ""
		p.log.Info("reading the kubelet's device-manager checkpoint", "path", p.o.KubeletCheckpoint)
	}
	listed := map[held]bool{}
	if answered {
		for _, h := range a.ids {
			listed[h] = true
		}
	}
	vouched := map[checkpointKey]bool{}
	unvouched := map[held]bool{}
	since := map[checkpointKey]time.Time{}
	now := p.o.Now()
	for _, e := range a.checkpoint {
		for _, id := range e.IDs {
			k := checkpointKey{podUID: e.PodUID, container: e.Container, held: held{ID: id, Resource: e.Resource}}
			if p.vouched[k] || listed[k.held] {
				vouched[k] = true
				continue
			}
			first, seen := p.unvouchedSince[k]
			if !seen {
				first = now
			}
			since[k] = first
			if now.Sub(first) < p.o.CheckpointHold {
				unvouched[k.held] = true
			}
		}
	}
	p.vouched, p.unvouchedSince = vouched, since
	ids := sortedHeld(maps.Keys(unvouched))
	changed := !slices.Equal(ids, p.checkpointHeld)
	p.checkpointHeld = ids
	return changed
}

func sortedHeld(hs iter.Seq[held]) []held {
	return slices.SortedFunc(hs, func(a, b held) int {
		return cmp.Or(cmp.Compare(a.Resource, b.Resource), cmp.Compare(a.ID, b.ID))
	})
}

func (p *Plugin) heldLoop(ctx context.Context) {
	t := time.NewTicker(p.o.HeldInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a, err := p.listHeld()
		p.mu.Lock()
		checkpointChanged := p.setCheckpointLocked(a, err == nil)
		if err == nil {
			heldChanged, nRecent := !slices.Equal(a.ids, p.held), len(p.recent)
			p.setHeldLocked(a)
			if heldChanged || checkpointChanged || len(p.recent) != nRecent || len(p.retiring) > 0 {
				p.recomputeLocked()
			}
		} else if checkpointChanged || len(p.recent) > 0 || len(p.retiring) > 0 {
			p.recomputeLocked() // expires old records and retired IDs
		}
		p.mu.Unlock()
	}
}

func (p *Plugin) healthLoop(ctx context.Context) {
	t := time.NewTicker(p.o.HealthInterval)
	defer t.Stop()
	warnedRead := false
	for {
		rctx, cancel := context.WithTimeout(ctx, max(p.o.HealthInterval, 5*time.Second))
		snap, err := p.o.Backend.Snapshot(rctx)
		cancel()
		if err != nil && ctx.Err() != nil {
			return
		}
		xids := p.o.Backend.Xids()
		p.mu.Lock()
		if err != nil && !p.readOnce && !warnedRead {
			warnedRead = true
			p.log.Warn("cannot read GPUs yet; nothing is advertised until they answer", "err", err)
		}
		changed := p.health.observe(p.o.Now(), snap, err, xids)
		if err == nil && !p.readOnce {
			p.readOnce, changed = true, true
		}
		if p.checkMPSLocked() {
			changed = true
		}
		if changed {
			p.recomputeLocked()
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// recomputeLocked rebuilds the plan and sends every changed list. p.mu is
// held.
func (p *Plugin) recomputeLocked() {
	if p.cfg == nil || !p.readOnce {
		return
	}
	gpus := p.health.gpus()
	if err := checkSize(*p.cfg, gpus); err != nil {
		// GPUs found since the config was applied (it may come before the
		// first reading) take it over the limit: send no new list rather
		// than one the kubelet cannot take, until a config that fits
		// comes.
		if !p.warned[err.Error()] {
			p.warned[err.Error()] = true
			p.log.Error("device-plugin config in use is too large for this node's GPUs; the device lists stay as they are", "err", err)
		}
		p.metrics.configValid.Set(0)
		return
	}
	now := time.Now()
	ids := slices.Concat(p.held, p.checkpointHeld)
	for h, at := range p.recent {
		// Without a PodResources answer since (none at all when there
		// is no PodResources API), this process's own allocations stand
		// in for it for a while; the kubelet's checkpoint has them too
		// once it is written.
		if now.Sub(at) > 3*p.o.HeldInterval+time.Minute {
			delete(p.recent, h)
			continue
		}
		ids = append(ids, h)
	}
	p.plan = computePlan(*p.cfg, gpus, ids)
	p.checkMPSLocked() // a new plan may name new MPS resources
	p.markMPSDownLocked()
	for _, w := range p.plan.Warnings {
		if !p.warned[w] {
			p.warned[w] = true
			p.log.Warn("device-plugin config", "warning", w)
		}
	}
	lists := make(map[string][]*pluginapi.Device, len(p.plan.Resources))
	for name, devs := range p.plan.Resources {
		lists[name] = apiDevices(devs)
	}
	p.retireLocked(now, lists)
	for name, devs := range lists {
		p.serverLocked(name, devs)
	}
	for name, s := range p.servers {
		if _, ok := lists[name]; !ok {
			s.setDevices(nil)
		}
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// retireLocked adds to the new lists, as unhealthy, the IDs the kubelet was
// last sent that they drop, until RetireAfter has passed since they were
// dropped and no Allocate of their resource is in flight
// (Options.RetireAfter says why). An ID listed again stops retiring. p.mu is
// held.
func (p *Plugin) retireLocked(now time.Time, lists map[string][]*pluginapi.Device) {
	inList := map[held]bool{}
	for name, devs := range lists {
		for _, d := range devs {
			inList[held{ID: d.ID, Resource: name}] = true
		}
	}
	for name, s := range p.servers {
		sent, _ := s.current()
		for _, d := range sent {
			h := held{ID: d.ID, Resource: name}
			if _, ok := p.retiring[h]; !ok && !inList[h] {
				p.retiring[h] = now
			}
		}
	}
	var keep []held
	for h, since := range p.retiring {
		s := p.servers[h.Resource]
		switch {
		case inList[h]:
			delete(p.retiring, h)
		case now.Sub(since) >= p.o.RetireAfter && (s == nil || s.allocating.Load() == 0):
			delete(p.retiring, h)
		default:
			keep = append(keep, h)
		}
	}
	slices.SortFunc(keep, func(a, b held) int { return cmp.Or(cmp.Compare(a.Resource, b.Resource), cmp.Compare(a.ID, b.ID)) })
	for _, h := range keep {
		lists[h.Resource] = append(lists[h.Resource], &pluginapi.Device{ID: h.ID, Health: pluginapi.Unhealthy})
	}
}

// serverLocked gives a resource's server its devices, starting the server
// on first use with them already set: started first, it could register and
// answer the kubelet's first ListAndWatch with no devices, and the node
// would advertise none until the next list.
func (p *Plugin) serverLocked(resource string, devs []*pluginapi.Device) {
	if s, ok := p.servers[resource]; ok {
		s.setDevices(devs)
		return
	}
	s := newResourceServer(p, resource)
	s.setDevices(devs)
	p.servers[resource] = s
	if p.runCtx != nil {
		ctx := p.runCtx
		p.goRun(func() { s.run(ctx) })
	}
}

// SocketName is the socket file of a resource's server:
// gpuslice-<resource with / as ->.sock.
func SocketName(resource string) string {
	return "gpuslice-" + strings.ReplaceAll(resource, "/", "-") + ".sock"
}

// remember notes IDs this process just allocated.
func (p *Plugin) remember(resource string, ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for _, id := range ids {
		p.recent[held{ID: id, Resource: resource}] = now
	}
}

// removeStale removes a socket file left by an earlier run.
func removeStale(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// checkMPSLocked reads whether the control daemon of every MPS resource in
// the plan is ready, and reports whether that changed. p.mu is held.
func (p *Plugin) checkMPSLocked() bool {
	if p.o.MPSRoot == "" {
		return false
	}
	changed := false
	seen := map[string]bool{}
	for _, res := range p.plan.MPS {
		if seen[res] {
			continue
		}
		seen[res] = true
		err := checkMPSDaemon(p.o.MPSRoot, res)
		before, was := p.mpsDown[res]
		switch {
		case err != nil && !was:
			p.log.Warn("MPS control daemon not ready; its devices are unhealthy", "resource", res, "err", err)
			p.mpsDown[res], changed = err, true
		case err != nil:
			p.mpsDown[res] = err
			changed = changed || err.Error() != before.Error()
		case was:
			p.log.Info("MPS control daemon ready", "resource", res)
			delete(p.mpsDown, res)
			changed = true
		}
	}
	for res := range p.mpsDown {
		if !seen[res] {
			delete(p.mpsDown, res)
			changed = true
		}
	}
	return changed
}

// markMPSDownLocked advertises the devices of MPS resources whose daemon is
// not ready as unhealthy: the kubelet then places no new pod there, rather
// than pods whose CUDA calls would fail. p.mu is held.
func (p *Plugin) markMPSDownLocked() {
	for res, devs := range p.plan.Resources {
		if _, down := p.mpsDown[res]; !down {
			continue
		}
		marked := make([]advertised, len(devs))
		for i, d := range devs {
			if _, mps := p.plan.MPS[d.GPU]; mps {
				d.Healthy = false
			}
			marked[i] = d
		}
		p.plan.Resources[res] = marked
	}
}

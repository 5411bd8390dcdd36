package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/podresources/podresourcestest"
)

const gpuRes = "nvidia.com/gpu"

// config is a time-slicing config with replicas for every GPU (1: none).
func config(replicas int, extra ...string) string {
	if replicas == 1 {
		return "version: v1\n"
	}
	s := fmt.Sprintf("version: v1\nsharing:\n  timeSlicing:\n%s    resources:\n    - name: nvidia.com/gpu\n      replicas: %d\n",
		strings.Join(extra, ""), replicas)
	return s
}

// want renders device IDs the way render does: sorted, space-separated.
func want(parts ...string) string {
	var all []string
	for _, p := range parts {
		all = append(all, strings.Fields(p)...)
	}
	slices.Sort(all)
	return strings.Join(all, " ")
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type harness struct {
	t       testing.TB
	kubelet *fakeKubelet
	gpus    *gputest.Fake
	pods    *podresourcestest.Server
	cfgPath string
	plugin  *Plugin
	reg     *prometheus.Registry
	clock   *fakeClock
}

type setup struct {
	config string
	gpus   []gputest.GPUSpec
	pods   bool // serve a fake PodResources API
	policy Policy
	// guardrails are the resources with memory guardrails.
	guardrails map[string]bool
	source     Source // default: a FileSource on config
	mpsRoot    string // Options.MPSRoot
	quiet      bool   // no logs (benchmarks)
	// logs, when set, also receives every record logged.
	logs slog.Handler
	// retire is Options.RetireAfter; default 1 ms, so that a dropped ID
	// leaves the list at the next held read and tests see the final list.
	retire time.Duration
}

var quietLogger = slog.New(slog.DiscardHandler)

func twoSpecs() []gputest.GPUSpec {
	return []gputest.GPUSpec{gputest.GPU(uuid0, 48<<30), gputest.GPU(uuid1, 48<<30)}
}

func start(t testing.TB, s setup) *harness {
	t.Helper()
	dir := shortDir(t)
	h := &harness{t: t, kubelet: startKubelet(t, dir), gpus: gputest.NewFake(s.gpus...), reg: prometheus.NewRegistry(),
		clock: &fakeClock{now: time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)}}
	h.cfgPath = filepath.Join(shortDir(t), "config.yaml")
	h.writeConfig(s.config)
	var lister Lister
	if s.pods {
		sock := filepath.Join(shortDir(t), "pod-resources.sock")
		srv, err := podresourcestest.Start(t, sock)
		if err != nil {
			t.Fatal(err)
		}
		h.pods = srv
		client, err := podresources.NewClient(sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		lister = client
	}
	log := testLogger(t)
	if s.quiet {
		log = quietLogger
	}
	if s.logs != nil {
		log = slog.New(teeHandler{log.Handler(), s.logs})
	}
	src := s.source
	if src == nil {
		src = &FileSource{Path: h.cfgPath, Logger: log}
	}
	retire := s.retire
	if retire == 0 {
		retire = time.Millisecond
	}
	p, err := New(Options{
		Backend: h.gpus, Source: src, PodResources: lister, RetireAfter: retire,
		DevicePluginDir: dir, Policy: s.policy, Guardrails: s.guardrails, MPSRoot: s.mpsRoot,
		HealthInterval: 10 * time.Millisecond, HeldInterval: 20 * time.Millisecond, RecoveryInterval: time.Minute,
		Registerer: h.reg, Logger: log, Now: h.clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.plugin = p
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return h
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// writeConfig replaces the config file atomically, as a ConfigMap volume
// or an editor's save does.
func (h *harness) writeConfig(s string) {
	h.t.Helper()
	tmp := h.cfgPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, h.cfgPath); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) waitMetric(name string, c prometheus.Collector, want float64) {
	h.t.Helper()
	h.kubelet.waitFor(fmt.Sprintf("%s == %v", name, want), func() bool { return testutil.ToFloat64(c) == want })
}

func TestRegistrationAndList(t *testing.T) {
	h := start(t, setup{config: config(4), gpus: twoSpecs()})
	e := h.kubelet.endpoint(gpuRes)
	if e.req.Endpoint != "gpuslice-nvidia.com-gpu.sock" || !e.req.Options.GetGetPreferredAllocationAvailable() {
		t.Errorf("registration = %v", e.req)
	}
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))
	opts, err := e.client.GetDevicePluginOptions(t.Context(), &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable || opts.PreStartRequired {
		t.Errorf("GetDevicePluginOptions = %v, %v", opts, err)
	}
	if _, err := e.client.PreStartContainer(t.Context(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{rid(uuid0, 0)}}); err != nil {
		t.Errorf("PreStartContainer: %v", err)
	}
	if got := testutil.ToFloat64(h.plugin.metrics.reloads); got != 1 {
		t.Errorf("reloads = %v, want 1", got)
	}
}

func TestConfigFileChangeUpdatesTheOpenStream(t *testing.T) {
	h := start(t, setup{config: config(4), gpus: twoSpecs()})
	e := h.kubelet.endpoint(gpuRes)
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))
	for _, n := range []int{2, 6, 1, 3} {
		h.writeConfig(config(n))
		wantList := want(ids(uuid0, 0, n), ids(uuid1, 0, n))
		if n == 1 {
			wantList = want(uuid0, uuid1)
		}
		h.kubelet.waitList(gpuRes, wantList)
	}
	if h.kubelet.endpoint(gpuRes) != e || e.streamErr() != nil || h.kubelet.registrationCount(gpuRes) != 1 {
		t.Errorf("the config changes were not sent on the first stream: %s", h.kubelet.describe())
	}
	if got := testutil.ToFloat64(h.plugin.metrics.reloads); got != 5 {
		t.Errorf("reloads = %v, want 5", got)
	}
}

func TestRenamedResourcesGetTheirOwnServer(t *testing.T) {
	h := start(t, setup{config: config(2, "    renameByDefault: true\n"), gpus: twoSpecs()})
	h.kubelet.waitList(gpuRes+".shared", want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))
	if n := h.kubelet.registrationCount(gpuRes); n != 0 {
		t.Errorf("%s registered %d times with nothing to advertise", gpuRes, n)
	}
	h.writeConfig(config(1))
	h.kubelet.waitList(gpuRes, want(uuid0, uuid1))
	h.kubelet.waitList(gpuRes+".shared", "")
	if e := h.kubelet.endpoint(gpuRes + ".shared"); e.req.Endpoint != "gpuslice-nvidia.com-gpu.shared.sock" {
		t.Errorf("shared endpoint %q", e.req.Endpoint)
	}
}

func TestKubeletRestartRegistersAgain(t *testing.T) {
	h := start(t, setup{config: config(2), gpus: twoSpecs()})
	first := h.kubelet.endpoint(gpuRes)
	list := want(ids(uuid0, 0, 2), ids(uuid1, 0, 2))
	h.kubelet.waitList(gpuRes, list)
	for i := 2; i <= 3; i++ {
		h.kubelet.restart()
		h.kubelet.waitFor(fmt.Sprintf("registration #%d", i), func() bool { return h.kubelet.registrationCount(gpuRes) == i })
		h.kubelet.waitList(gpuRes, list)
	}
	if h.kubelet.endpoint(gpuRes) == first {
		t.Error("still the first endpoint after two restarts")
	}
	// The new stream is live: a config change arrives on it.
	h.writeConfig(config(3))
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 3), ids(uuid1, 0, 3)))
}

func TestAllocate(t *testing.T) {
	h := start(t, setup{config: config(4), gpus: []gputest.GPUSpec{gputest.GPU(uuid0, 48<<30), gputest.GPU(uuid1, 24<<30)}})
	e := h.kubelet.endpoint(gpuRes)
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))
	resp, err := e.client.Allocate(t.Context(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{rid(uuid0, 1)}},
		{DevicesIds: []string{rid(uuid0, 2), rid(uuid0, 3), rid(uuid1, 0)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := [][2]string{}
	for _, c := range resp.ContainerResponses {
		got = append(got, [2]string{c.Envs[EnvVisibleDevices], c.Envs[EnvMemoryBudget]})
	}
	wantEnv := [][2]string{{uuid0, fmt.Sprint(12 << 30)}, {uuid0 + "," + uuid1, fmt.Sprint(6 << 30)}}
	if !slices.Equal(got, wantEnv) {
		t.Errorf("envs = %v, want %v", got, wantEnv)
	}
	if n := testutil.ToFloat64(h.plugin.metrics.allocations.WithLabelValues(gpuRes)); n != 2 {
		t.Errorf("allocations = %v, want 2", n)
	}

	_, err = e.client.Allocate(t.Context(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-nope::0"}}}})
	if err == nil || !strings.Contains(err.Error(), "unknown device: GPU-nope::0") {
		t.Errorf("unknown device: %v", err)
	}

	h.writeConfig(config(4, "    failRequestsGreaterThanOne: true\n"))
	h.waitMetric("reloads", h.plugin.metrics.reloads, 2)
	_, err = e.client.Allocate(t.Context(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{rid(uuid0, 0), rid(uuid1, 0)}}}})
	if err == nil || !strings.Contains(err.Error(), "invalid request: maximum request size for shared resources is 1; found 2") {
		t.Errorf("failRequestsGreaterThanOne: %v", err)
	}
	if _, err = e.client.Allocate(t.Context(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{rid(uuid1, 3)}}}}); err != nil {
		t.Errorf("one replica with failRequestsGreaterThanOne: %v", err)
	}
}

func TestGetPreferredAllocation(t *testing.T) {
	for _, tc := range []struct {
		policy Policy
		want   []string
	}{
		{Distributed, []string{rid(uuid1, 0), rid(uuid0, 1)}},
		{Packed, []string{rid(uuid0, 1), rid(uuid0, 2)}},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			h := start(t, setup{config: config(3), gpus: twoSpecs(), policy: tc.policy})
			e := h.kubelet.endpoint(gpuRes)
			h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 3), ids(uuid1, 0, 3)))
			// uuid0::0 is in use: the kubelet does not offer it.
			resp, err := e.client.GetPreferredAllocation(t.Context(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
				AvailableDeviceIDs: []string{rid(uuid0, 1), rid(uuid0, 2), rid(uuid1, 0), rid(uuid1, 1), rid(uuid1, 2)},
				AllocationSize:     2,
			}}})
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, tc.want) {
				t.Errorf("preferred = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBadConfigKeptOut(t *testing.T) {
	h := start(t, setup{config: config(4), gpus: twoSpecs()})
	good := want(ids(uuid0, 0, 4), ids(uuid1, 0, 4))
	n := h.kubelet.waitList(gpuRes, good)
	bad := []string{
		config(1) + "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n",
		"version: v2\n",
		"version: v1\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n",
	}
	if v := testutil.ToFloat64(h.plugin.metrics.configValid); v != 1 {
		t.Errorf("config valid = %v with the first config in use, want 1", v)
	}
	for i, cfg := range bad {
		h.writeConfig(cfg)
		h.waitMetric("reload failures", h.plugin.metrics.reloadFailures, float64(i+1))
		if v := testutil.ToFloat64(h.plugin.metrics.configValid); v != 0 {
			t.Errorf("config valid = %v while rejected config %d is ignored, want 0", v, i)
		}
	}
	if err := os.Remove(h.cfgPath); err != nil {
		t.Fatal(err)
	}
	h.waitMetric("reload failures", h.plugin.metrics.reloadFailures, float64(len(bad)+1))
	if v := testutil.ToFloat64(h.plugin.metrics.configValid); v != 0 {
		t.Errorf("config valid = %v with the config file gone, want 0", v)
	}
	if got := h.kubelet.waitList(gpuRes, good); got != n {
		t.Errorf("rejected configs changed the list: %d lists, want %d\n%s", got, n, h.kubelet.describe())
	}
	// Putting back the config still in use fixes it without a reload.
	h.writeConfig(config(4))
	h.waitMetric("config valid", h.plugin.metrics.configValid, 1)
	if got := testutil.ToFloat64(h.plugin.metrics.reloads); got != 1 {
		t.Errorf("reloads = %v after the same config came back, want 1", got)
	}
	h.writeConfig(bad[0])
	h.waitMetric("config valid", h.plugin.metrics.configValid, 0)
	h.writeConfig(config(2))
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))
	if got := testutil.ToFloat64(h.plugin.metrics.reloads); got != 2 {
		t.Errorf("reloads = %v, want 2", got)
	}
	if v := testutil.ToFloat64(h.plugin.metrics.configValid); v != 1 {
		t.Errorf("config valid = %v with a new good config in use, want 1", v)
	}
}

func TestShrinkKeepsHeldReplicaUntilReleased(t *testing.T) {
	h := start(t, setup{config: config(4), gpus: twoSpecs(), pods: true})
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))
	h.pods.SetPods([]podresources.Allocation{
		{Namespace: "ml", Pod: "train", Container: "main", Resource: gpuRes, DeviceIDs: []string{rid(uuid0, 3)}},
		{Namespace: "ml", Pod: "infer", Container: "main", Resource: gpuRes, DeviceIDs: []string{rid(uuid1, 0)}},
	})
	h.writeConfig(config(2))
	// uuid0::3 stays (in place of the free ::1): allocatable is already 4.
	h.kubelet.waitList(gpuRes, want(rid(uuid0, 0), rid(uuid0, 3), ids(uuid1, 0, 2)))

	e := h.kubelet.endpoint(gpuRes)
	resp, err := e.client.GetPreferredAllocation(t.Context(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: []string{rid(uuid0, 3), rid(uuid0, 0), rid(uuid1, 1)}, AllocationSize: 2,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].DeviceIDs; slices.Contains(got, rid(uuid0, 3)) {
		t.Errorf("a draining ID was preferred: %v", got)
	}

	h.pods.SetPods([]podresources.Allocation{
		{Namespace: "ml", Pod: "infer", Container: "main", Resource: gpuRes, DeviceIDs: []string{rid(uuid1, 0)}},
	})
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))
}

// startDraining starts a plugin whose count went from 4 to 2 while a pod
// holds uuid0::3, and waits for the kubelet to see the draining list, which
// it returns.
func startDraining(t *testing.T) (*harness, string) {
	t.Helper()
	h := start(t, setup{config: config(4), gpus: twoSpecs(), pods: true})
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))
	h.pods.SetPods([]podresources.Allocation{
		{Namespace: "ml", Pod: "train", Container: "main", Resource: gpuRes, DeviceIDs: []string{rid(uuid0, 3)}},
	})
	h.writeConfig(config(2))
	draining := want(rid(uuid0, 0), rid(uuid0, 3), ids(uuid1, 0, 2))
	h.kubelet.waitList(gpuRes, draining)
	return h, draining
}

// A real kubelet answers PodResources right after a restart, before it has
// rebuilt its pod list. An ID held above a lowered count must stay
// advertised through that empty answer, and go once the kubelet, past the
// grace, says it is free.
func TestKubeletRestartKeepsHeldIDs(t *testing.T) {
	h, draining := startDraining(t)

	h.kubelet.restart()
	h.kubelet.waitFor("registration #2", func() bool { return h.kubelet.registrationCount(gpuRes) == 2 })
	h.pods.SetPods(nil) // the restarted kubelet's first answers
	if got := readHeld(t, h); !slices.Contains(got, rid(uuid0, 3)) {
		t.Fatalf("the held ID was dropped after the kubelet restart: %v", got)
	}
	h.kubelet.waitList(gpuRes, draining)

	// Past the grace, the kubelet's word that it is free counts.
	if got := readHeldPastGrace(t, h); slices.Contains(got, rid(uuid0, 3)) {
		t.Errorf("the released ID is still advertised past the grace: %v", got)
	}
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))
}

// readHeld makes one read of the IDs in use, as the held loop does every
// 20 ms, and returns the IDs the plan advertises after it.
func readHeld(t *testing.T, h *harness) []string {
	t.Helper()
	a, err := h.plugin.listHeld()
	if err != nil {
		t.Fatal(err)
	}
	h.plugin.mu.Lock()
	defer h.plugin.mu.Unlock()
	h.plugin.setHeldLocked(a)
	h.plugin.recomputeLocked()
	var out []string
	for _, d := range h.plugin.plan.Resources[gpuRes] {
		out = append(out, d.ID)
	}
	return out
}

// readHeldPastGrace is readHeld once the restart grace has run out.
func readHeldPastGrace(t *testing.T, h *harness) []string {
	t.Helper()
	h.plugin.mu.Lock()
	h.plugin.kubeletRestarted = time.Now().Add(-h.plugin.o.RestartGrace)
	h.plugin.mu.Unlock()
	return readHeld(t, h)
}

// A restarting kubelet serves PodResources, with no pods yet, before it
// creates kubelet.sock again. The plugin must see the restart in the new
// PodResources socket and keep the held ID, or it registers again without
// it and the kubelet's re-admission of the pod fails ("previously
// allocated devices are no longer healthy", seen on the real node).
func TestKubeletRestartSeenFromPodResources(t *testing.T) {
	h, draining := startDraining(t)
	if got := readHeld(t, h); !slices.Contains(got, rid(uuid0, 3)) {
		t.Fatalf("the held ID is not advertised before the restart: %v", got)
	}

	// The new kubelet's PodResources, before its pods are read; kubelet.sock
	// is not created again yet (no registration). Stopped first, so that no
	// read finds the old kubelet's socket answering with no pods.
	h.pods.Stop()
	h.pods.SetPods(nil)
	if err := h.pods.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := readHeld(t, h); !slices.Contains(got, rid(uuid0, 3)) {
		t.Fatalf("the held ID was dropped on the restarted kubelet's first answer: %v", got)
	}
	h.kubelet.restart()
	h.kubelet.waitFor("registration #2", func() bool { return h.kubelet.registrationCount(gpuRes) == 2 })
	h.kubelet.waitList(gpuRes, draining)

	// The same kubelet's later empty answer, past the grace, frees it.
	if got := readHeldPastGrace(t, h); slices.Contains(got, rid(uuid0, 3)) {
		t.Errorf("the released ID is still advertised past the grace: %v", got)
	}
}

// A starting kubelet creates kubelet.sock a moment before it accepts
// connections on it. The plugin, which reacts to the file at once, must
// wait for it, not fail and retry a second later: on the real node that
// retry came after the kubelet had re-admitted its pods, and a
// crash-looping pod failed ("no healthy devices present").
func TestRegistersWhenKubeletAcceptsLate(t *testing.T) {
	rec := &records{}
	h := start(t, setup{config: config(2), gpus: twoSpecs(), logs: rec})
	registered := func(n int) func() bool {
		return func() bool {
			return len(rec.messages(slog.LevelInfo, "device plugin registered with the kubelet")) == n
		}
	}
	// Registered, and the plugin's call returned: a kubelet stopped
	// under it fails it (EOF), which is not what this test is about.
	h.kubelet.waitFor("registration #1", registered(1))
	h.kubelet.restartAcceptingLate(filepath.Join(h.kubelet.dir, SocketName(gpuRes)))
	h.kubelet.waitFor("registration #2", registered(2))
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))
	if m := rec.messages(slog.LevelWarn, ""); len(m) > 0 {
		t.Errorf("registering again went through a failure: %q", m)
	}
}

// records is a slog.Handler that keeps every record's level and message
// with its attributes.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }

func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// messages are the records at level or above whose message starts with
// prefix, each with its attributes.
func (r *records) messages(level slog.Level, prefix string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.recs {
		if rec.Level < level || !strings.HasPrefix(rec.Message, prefix) {
			continue
		}
		msg := rec.Message
		rec.Attrs(func(a slog.Attr) bool {
			msg += " " + a.String()
			return true
		})
		out = append(out, msg)
	}
	return out
}

// teeHandler sends each record to both handlers.
type teeHandler struct{ a, b slog.Handler }

func (t teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return t.a.Enabled(ctx, l) || t.b.Enabled(ctx, l)
}

func (t teeHandler) Handle(ctx context.Context, r slog.Record) error {
	for _, h := range []slog.Handler{t.a, t.b} {
		if h.Enabled(ctx, r.Level) {
			if err := h.Handle(ctx, r.Clone()); err != nil {
				return err
			}
		}
	}
	return nil
}

func (t teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{t.a.WithAttrs(as), t.b.WithAttrs(as)}
}

func (t teeHandler) WithGroup(g string) slog.Handler {
	return teeHandler{t.a.WithGroup(g), t.b.WithGroup(g)}
}

func TestXidHealth(t *testing.T) {
	a, b := gputest.GPU(uuid0, 48<<30), gputest.GPU(uuid1, 48<<30)
	h := start(t, setup{config: config(2), gpus: []gputest.GPUSpec{a, b}})
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))

	h.gpus.Set(a.WithXids(79), b)
	h.kubelet.waitList(gpuRes, want(rid(uuid0, 0)+"! "+rid(uuid0, 1)+"!", ids(uuid1, 0, 2)))
	if err := testutil.GatherAndCompare(h.reg, strings.NewReader(`
# HELP gpuslice_plugin_unhealthy_gpus GPUs whose device IDs are advertised as unhealthy (critical Xid, failed or missing reading, within the recovery interval).
# TYPE gpuslice_plugin_unhealthy_gpus gauge
gpuslice_plugin_unhealthy_gpus 1
`), "gpuslice_plugin_unhealthy_gpus"); err != nil {
		t.Error(err)
	}

	// An application Xid on the other GPU changes nothing: wait for two
	// more readings, then look.
	h.gpus.Set(a.WithXids(79), b.WithXids(13))
	seen := h.gpus.Snapshots()
	h.kubelet.waitFor("two readings", func() bool { return h.gpus.Snapshots() >= seen+2 })
	h.kubelet.waitList(gpuRes, want(rid(uuid0, 0)+"! "+rid(uuid0, 1)+"!", ids(uuid1, 0, 2)))

	h.clock.Advance(2 * time.Minute)
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))

	h.gpus.Set(a.WithXids(79), b.WithXids(13).WithError("GPU has fallen off the bus"))
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), rid(uuid1, 0)+"! "+rid(uuid1, 1)+"!"))
}

func TestMetrics(t *testing.T) {
	h := start(t, setup{config: config(3), gpus: twoSpecs()})
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 3), ids(uuid1, 0, 3)))
	err := testutil.GatherAndCompare(h.reg, strings.NewReader(fmt.Sprintf(`
# HELP gpuslice_plugin_config_valid 1 when the last device-plugin config read passed validation and is in use; 0 while a rejected (invalid, unsupported or unreadable) config is ignored and the last good one stays, and before any config is read.
# TYPE gpuslice_plugin_config_valid gauge
gpuslice_plugin_config_valid 1
# HELP gpuslice_plugin_replicas Device IDs the plugin advertises, per resource and GPU (replicas of a shared GPU, 1 for an exclusive one, more while IDs above a lowered count are still in use).
# TYPE gpuslice_plugin_replicas gauge
gpuslice_plugin_replicas{resource="nvidia.com/gpu",uuid="%s"} 3
gpuslice_plugin_replicas{resource="nvidia.com/gpu",uuid="%s"} 3
# HELP gpuslice_plugin_reloads_total Device-plugin configs applied (the first one included).
# TYPE gpuslice_plugin_reloads_total counter
gpuslice_plugin_reloads_total 1
# HELP gpuslice_plugin_reload_failures_total Device-plugin configs rejected (invalid, unsupported or unreadable); the last good one stays.
# TYPE gpuslice_plugin_reload_failures_total counter
gpuslice_plugin_reload_failures_total 0
# HELP gpuslice_plugin_unhealthy_gpus GPUs whose device IDs are advertised as unhealthy (critical Xid, failed or missing reading, within the recovery interval).
# TYPE gpuslice_plugin_unhealthy_gpus gauge
gpuslice_plugin_unhealthy_gpus 0
`, uuid0, uuid1)))
	if err != nil {
		t.Error(err)
	}
}

// An answer asked before the latest one applied says nothing newer about the
// kubelet's socket (applyConfig and the held loop both ask); a socket gone
// right after an answer is a restart too.
func TestHeldAnswersSocketOrder(t *testing.T) {
	path := podresourcestest.SocketPath(t)
	srv, err := podresourcestest.Start(t, path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := podresources.NewClient(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	old := c.Instance()
	time.Sleep(20 * time.Millisecond) // the new socket's time differs
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	cur := c.Instance()

	p, err := New(Options{Backend: gputest.NewFake(), Source: &FileSource{Path: "unused"}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setHeldLocked(heldAnswer{started: t0, socket: cur, tells: true})
	p.setHeldLocked(heldAnswer{started: t0.Add(-time.Second), socket: old, tells: true})
	if !p.kubeletRestarted.IsZero() || !p.podResourcesAt.Same(cur) {
		t.Fatalf("an older answer on the old socket counted: restarted %v, socket is the current one: %v", p.kubeletRestarted, p.podResourcesAt.Same(cur))
	}
	p.setHeldLocked(heldAnswer{started: t0.Add(time.Second), tells: true})
	if !p.kubeletRestarted.Equal(t0.Add(time.Second)) {
		t.Errorf("a socket gone after an answer is not a restart: restarted %v", p.kubeletRestarted)
	}
	if !p.podResourcesAt.Same(cur) {
		t.Error("a gone socket replaced the last one known")
	}
}

// An ID dropped from a list is first listed as unhealthy, and goes only
// after Options.RetireAfter with no Allocate in flight: kubelet v1.37.1
// crashes when an ID it is allocating vanishes from the list (RetireAfter's
// comment). Whatever the timing, no list may lack an ID the list before it
// had as healthy.
func TestDroppedIDsRetireAsUnhealthy(t *testing.T) {
	h := start(t, setup{config: config(4), gpus: twoSpecs(), pods: true, retire: 300 * time.Millisecond})
	e := h.kubelet.endpoint(gpuRes)
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))
	h.pods.SetPods([]podresources.Allocation{
		{Namespace: "ml", Pod: "train", Container: "main", Resource: gpuRes, DeviceIDs: []string{rid(uuid0, 3)}},
	})
	h.writeConfig(config(2))
	h.kubelet.waitList(gpuRes, want(rid(uuid0, 0), rid(uuid0, 3), ids(uuid1, 0, 2)))
	// The pod above the count ends: its ID retires too.
	h.pods.SetPods(nil)
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))

	// With an Allocate in flight nothing retired goes, however long ago.
	h.plugin.mu.Lock()
	s := h.plugin.servers[gpuRes]
	h.plugin.mu.Unlock()
	s.allocating.Add(1)
	h.writeConfig(config(1))
	retiring := want(uuid0, uuid1, rid(uuid0, 0)+"! "+rid(uuid0, 1)+"! "+rid(uuid1, 0)+"! "+rid(uuid1, 1)+"!")
	h.kubelet.waitList(gpuRes, retiring)
	time.Sleep(1 * time.Second) // over three RetireAfters, 50 held reads
	if got := h.kubelet.latest(gpuRes); got != retiring {
		t.Errorf("with an Allocate in flight the list became %q, want %q", got, retiring)
	}
	s.allocating.Add(-1)
	h.kubelet.waitList(gpuRes, want(uuid0, uuid1))

	e.mu.Lock()
	lists := slices.Clone(e.lists)
	e.mu.Unlock()
	sawRetiring := map[string]bool{}
	for i := 1; i < len(lists); i++ {
		now := map[string]bool{}
		for _, d := range lists[i] {
			now[d.ID] = true
			if d.Health != pluginapi.Healthy {
				sawRetiring[d.ID] = true
			}
		}
		for _, d := range lists[i-1] {
			if d.Health == pluginapi.Healthy && !now[d.ID] {
				t.Errorf("list %d dropped %s, healthy in list %d: %s → %s", i, d.ID, i-1, render(lists[i-1]), render(lists[i]))
			}
		}
	}
	for _, id := range []string{rid(uuid0, 1), rid(uuid0, 2), rid(uuid0, 3), rid(uuid1, 2), rid(uuid1, 3), rid(uuid1, 0)} {
		if !sawRetiring[id] {
			t.Errorf("%s was never listed as unhealthy before it went", id)
		}
	}
}

// Under migStrategy mixed a MIG-enabled GPU read from the backend is not
// advertised whole, and the plan's warning is logged.
func TestMIGEnabledGPUNotAdvertisedUnderMixed(t *testing.T) {
	rec := &records{}
	cfg := "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
	h := start(t, setup{config: cfg, gpus: []gputest.GPUSpec{gputest.GPU(uuid0, 48<<30).WithMIG(), gputest.GPU(uuid1, 48<<30)}, logs: rec})
	h.kubelet.waitList(gpuRes, ids(uuid1, 0, 2))
	warnings := strings.Join(rec.messages(slog.LevelWarn, "device-plugin config"), "\n")
	for _, w := range []string{`flags.migStrategy "mixed"`, "GPU " + uuid0 + ` has MIG enabled: not advertised under migStrategy "mixed"`} {
		if !strings.Contains(warnings, w) {
			t.Errorf("warnings %q lack %q", warnings, w)
		}
	}
}

package controller

import (
	"github.com/gpuslice/gpuslice/internal/testproc"

	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
	"github.com/gpuslice/gpuslice/internal/tuner/signals"
)

const gib = uint64(1) << 30

// baseConfig is an admin's device-plugin config: time-slicing at 4, and a
// field the tuner does not own that every derived config must keep.
const baseConfig = `# written by the cluster admin
version: v1
flags:
  migStrategy: none
  plugin:
    deviceListStrategy: envvar
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
`

// signal is what a fake node's GPUs show in every sample of the window.
type signal struct {
	gpus       int
	used, peak uint64
	allocated  int
	advertised int
	// oomAt puts one full-device OOM event on GPU 0 in the sample at that
	// time.
	oomAt time.Time
	// container is the key of the one container measured; "" is ml/a/main.
	container string
}

// fakeSource produces a full window of identical samples per node ending
// at the now it is asked about, so the window is always covered.
type fakeSource struct {
	mu       sync.Mutex
	interval time.Duration
	nodes    map[string]signal
	idle     map[string][]signals.IdleHolder
	// took, when set, runs in each Observe: a gathering that takes time.
	took func()
	// fail, when set, is Observe's error: a signal source that is down.
	fail error
	// hang, when set, makes Observe wait for its context to end, as a
	// source that does not answer; calls counts Observe's calls.
	hang  chan struct{}
	calls int
}

// IdleHolders implements signals.IdleSource.
func (f *fakeSource) IdleHolders(context.Context, time.Time) (map[string][]signals.IdleHolder, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.idle), nil
}

func (f *fakeSource) setIdle(node string, hs ...signals.IdleHolder) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.idle == nil {
		f.idle = map[string][]signals.IdleHolder{}
	}
	f.idle[node] = hs
}

func (f *fakeSource) set(node string, s signal) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.nodes == nil {
		f.nodes = map[string]signal{}
	}
	f.nodes[node] = s
}

func (f *fakeSource) Observe(ctx context.Context, now time.Time, window time.Duration) (map[string][]policy.GPUObservation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.hang != nil {
		select {
		case f.hang <- struct{}{}: // says it has begun
		default:
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if f.took != nil {
		f.took()
	}
	if f.fail != nil {
		return nil, f.fail
	}
	out := map[string][]policy.GPUObservation{}
	for node, s := range f.nodes {
		ctr := cmp.Or(s.container, "ml/a/main")
		for g := range s.gpus {
			obs := policy.GPUObservation{UUID: fmt.Sprintf("GPU-%s-%d", node, g)}
			for t := now.Add(-window); !t.After(now); t = t.Add(f.interval) {
				smp := policy.Sample{Time: t, MemoryTotalBytes: 48 * gib, MemoryUsedBytes: s.used,
					ContainerPeaks: map[string]uint64{ctr: s.peak}, ReplicasAdvertised: s.advertised, ReplicasAllocated: s.allocated}
				if g == 0 && !s.oomAt.IsZero() && !t.Before(s.oomAt) && t.Before(s.oomAt.Add(f.interval)) {
					// The exporter says the GPU was full (the fake's used
					// memory is the level between OOMs).
					smp.OOMEvents, smp.OOMs = 1, []policy.OOM{{Container: ctr, Kind: policy.OOMDevice}}
				}
				obs.Samples = append(obs.Samples, smp)
			}
			out[node] = append(out[node], obs)
		}
	}
	return out, nil
}

// headroom is a node whose every replica is taken with plenty of memory
// left: the policy raises it by one (after its cooldown).
func headroom(gpus int) signal {
	return signal{gpus: gpus, used: 12 * gib, peak: 6 * gib, allocated: 4}
}

// oomed is a node with headroom, allocated replicas taken and a
// full-device OOM at the given time.
func oomed(gpus, allocated int, at time.Time) signal {
	s := headroom(gpus)
	s.allocated, s.oomAt = allocated, at
	return s
}

func testConfig(mode, ns string) config.Config {
	c := config.Default()
	c.Apply.Mode = mode
	c.Apply.ConfigMap = config.ObjectRef{Namespace: ns, Name: "plugin-configs"}
	c.Apply.Key = "default"
	c.Apply.DaemonSet = config.ObjectRef{Namespace: ns, Name: "nvidia-device-plugin"}
	c.Apply.VerifyTimeout = time.Minute
	// Scenarios move labels in the round that writes the keys; the
	// config-manager scenario sets the delay it tests.
	c.Apply.PropagationDelay = 0
	c.Apply.VerifyHold = time.Hour
	c.LeaderElection.Namespace = ns
	c.WorkloadMemory.ConfigMap.Namespace = ns
	c.Policy = policy.Config{MinReplicas: 1, MaxReplicas: 8, MaxStepUp: 1, Window: time.Minute, Cooldown: 10 * time.Minute,
		PressureWindow: 20 * time.Second, SampleInterval: 10 * time.Second, TargetUtilization: 0.9, PressureThreshold: 0.95,
		Remember: time.Hour, MaxWorkloads: 16}
	// The objective's prices are the defaults: the scenarios are about
	// writing, not about what an OOM or a change is worth.
	d := policy.DefaultConfig()
	c.Policy.OOMCost, c.Policy.ChangeCost, c.Policy.Settle = d.OOMCost, d.ChangeCost, d.Settle
	c.Interval = 10 * time.Second
	return c
}

// harness is one controller driven round by round on a fake clock.
type harness struct {
	t   *testing.T
	env *testenv.Env
	ctx context.Context
	c   *Controller
	// started: the informers run for round(); Run starts its own.
	started bool
	rec     *record.FakeRecorder
	src     *fakeSource
	now     time.Time
	ns      string
}

func newHarness(t *testing.T, env *testenv.Env, cfg config.Config, client kubernetes.Interface, opts ...func(*Options)) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if client == nil {
		client = env.Client
	}
	h := &harness{t: t, env: env, ctx: ctx, rec: record.NewFakeRecorder(1000), src: &fakeSource{interval: cfg.Policy.SampleInterval},
		now: time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC), ns: cfg.Apply.ConfigMap.Namespace}
	o := Options{Config: cfg, Client: client, Source: h.src, Registerer: prometheus.NewRegistry(), Recorder: h.rec,
		Identity: t.Name(), Now: func() time.Time { return h.now }}
	for _, f := range opts {
		f(&o)
	}
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	h.c = c
	return h
}

// round runs one round once the informer has caught up with the nodes.
func (h *harness) round() {
	h.t.Helper()
	h.start()
	if err := h.c.round(h.ctx, nil); err != nil {
		h.t.Fatalf("round: %v", err)
	}
}

func (h *harness) advance(d time.Duration) { h.now = h.now.Add(d) }

// start starts the informers once and waits until they have caught up
// with the nodes.
func (h *harness) start() {
	h.t.Helper()
	if !h.started {
		if err := h.c.startInformers(h.ctx); err != nil {
			h.t.Fatal(err)
		}
		h.started = true
	}
	h.synced()
}

// restartPaidAfterPropagation checks a restart owed for rewritten keys
// (config-manager mode): none before delay has passed, then one, and
// nothing owed after it; who names the nodes it was owed to.
func (h *harness) restartPaidAfterPropagation(delay time.Duration, who string) {
	h.t.Helper()
	if got := h.getDaemonSet().Spec.Template.Annotations[AnnotationRestartedAt]; got != "" {
		h.t.Errorf("restarted before the new content could reach the volume: %q", got)
	}
	h.advance(delay)
	h.round()
	if got := h.getDaemonSet().Spec.Template.Annotations[AnnotationRestartedAt]; got == "" {
		h.t.Errorf("the DaemonSet was not restarted for %s", who)
	}
	if _, owed := h.getConfigMap().Annotations[AnnotationRestartOwed]; owed {
		h.t.Error("the restart is still owed after it was made")
	}
}

// synced waits until the informer has every node as the API server has it.
func (h *harness) synced() {
	h.t.Helper()
	poll(h.t, 10*time.Second, func() string {
		nodes, err := h.env.Client.CoreV1().Nodes().List(h.ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		for _, n := range nodes.Items {
			cached, err := h.c.nodes.Get(n.Name)
			if err != nil || cached.ResourceVersion != n.ResourceVersion {
				return "informer behind on node " + n.Name
			}
		}
		if cached, _ := h.c.nodes.List(labels.Everything()); len(cached) != len(nodes.Items) {
			return "informer still has a deleted node"
		}
		return ""
	})
}

// events drains the recorded Events ("Type Reason message").
func (h *harness) events() []string {
	var out []string
	for {
		select {
		case e := <-h.rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func poll(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	testproc.Eventually(t, timeout, 20*time.Millisecond, cond)
}

func withReason(events []string, reason string) []string {
	var out []string
	for _, e := range events {
		if f := strings.Fields(e); len(f) > 1 && f[1] == reason {
			out = append(out, e)
		}
	}
	return out
}

// API objects.

func (h *harness) namespace() {
	h.t.Helper()
	h.env.CreateNamespace(h.t, h.ns)
}

func (h *harness) configMap(data map[string]string) *corev1.ConfigMap {
	h.t.Helper()
	cm, err := h.env.Client.CoreV1().ConfigMaps(h.ns).Create(h.ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "plugin-configs", Namespace: h.ns}, Data: data}, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return cm
}

func (h *harness) getConfigMap() *corev1.ConfigMap {
	h.t.Helper()
	cm, err := h.env.Client.CoreV1().ConfigMaps(h.ns).Get(h.ctx, "plugin-configs", metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return cm
}

func (h *harness) daemonSet() *appsv1.DaemonSet {
	h.t.Helper()
	labels := map[string]string{"app": "nvidia-device-plugin"}
	ds, err := h.env.Client.AppsV1().DaemonSets(h.ns).Create(h.ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "nvidia-device-plugin", Namespace: h.ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "plugin", Image: "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}}},
			},
		}}, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return ds
}

func (h *harness) getDaemonSet() *appsv1.DaemonSet {
	h.t.Helper()
	ds, err := h.env.Client.AppsV1().DaemonSets(h.ns).Get(h.ctx, "nvidia-device-plugin", metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return ds
}

// node creates a node advertising allocatable nvidia.com/gpu.
func (h *harness) node(name string, labels map[string]string, allocatable int64) {
	h.t.Helper()
	if _, err := h.env.Client.CoreV1().Nodes().Create(h.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	h.setAllocatable(name, dpconfig.GPUResource, allocatable)
}

func (h *harness) setAllocatable(name, res string, n int64) {
	h.t.Helper()
	node := h.getNode(name)
	node.Status.Allocatable = corev1.ResourceList{corev1.ResourceName(res): *resource.NewQuantity(n, resource.DecimalSI)}
	node.Status.Capacity = node.Status.Allocatable
	if _, err := h.env.Client.CoreV1().Nodes().UpdateStatus(h.ctx, node, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) getNode(name string) *corev1.Node {
	h.t.Helper()
	n, err := h.env.Client.CoreV1().Nodes().Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return n
}

func (h *harness) record(name string) Record {
	h.t.Helper()
	r, err := ParseRecord(h.getNode(name).Annotations[AnnotationLastDecision])
	if r == nil {
		h.t.Fatalf("node %s has no readable %s annotation (%v): %q", name, AnnotationLastDecision, err, h.getNode(name).Annotations[AnnotationLastDecision])
	}
	return *r
}

// replicasOf parses a config and returns its replica count.
func replicasOf(t *testing.T, data string) int {
	t.Helper()
	f, err := dpconfig.Parse([]byte(data))
	if err != nil {
		t.Fatalf("config does not parse: %v\n%s", err, data)
	}
	return f.Replicas()
}

// interceptor runs another writer's edit just before the first request it
// matches reaches the API server, and counts the conflicts that follow.
type interceptor struct {
	mu        sync.Mutex
	match     func(*http.Request) bool
	before    func()
	fired     bool
	conflicts int
	bodies    []string // of every matching request
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// interceptedClient is a client whose requests pass through every
// interceptor.
func interceptedClient(t *testing.T, cfg *rest.Config, ics ...*interceptor) kubernetes.Interface {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		for _, i := range ics {
			rt = i.wrap(rt)
		}
		return rt
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (i *interceptor) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		matched := i.match(req)
		if matched && req.Body != nil {
			b, err := io.ReadAll(req.Body)
			if err != nil {
				return nil, err
			}
			req.Body.Close()
			req.Body = io.NopCloser(bytes.NewReader(b))
			i.mu.Lock()
			i.bodies = append(i.bodies, string(b))
			i.mu.Unlock()
		}
		i.mu.Lock()
		fire := !i.fired && matched
		i.fired = i.fired || fire
		i.mu.Unlock()
		if fire {
			i.before()
		}
		resp, err := rt.RoundTrip(req)
		if err == nil && resp.StatusCode == http.StatusConflict && matched {
			i.mu.Lock()
			i.conflicts++
			i.mu.Unlock()
		}
		return resp, err
	})
}

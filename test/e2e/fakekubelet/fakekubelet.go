// Package fakekubelet is a kubelet without containers, for the end-to-end
// tests: it registers a Node in a real API server and keeps it Ready (status
// and a Lease, the heartbeats kube-controller-manager watches), serves the
// real device-plugin Registration API so a device plugin (gpuslice-plugin)
// registers and streams its devices over ListAndWatch, writes the healthy
// device count into the Node's capacity and allocatable, and "runs" the pods
// that the real kube-scheduler binds to the node: it asks the plugin for
// device IDs (GetPreferredAllocation, Allocate), serves the allocations over
// the kubelet's PodResources API, sets the pods Running with container IDs,
// and drives a simulated GPU node (test/simnode: the sim GPU file, a /proc
// tree, pod logs) from each pod's workload annotations (workload.go).
//
// What it leaves out: images, probes, volumes, restarts, CPU and memory
// accounting, and the kubelet's HTTP API. Deleted pods end at once (the
// kubelet's final delete with grace period 0).
package fakekubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/test/simnode"
)

// ErrOptions wraps every error about Options.
var ErrOptions = errors.New("fakekubelet: bad options")

// Options configures New.
type Options struct {
	// Client writes the Node, its Lease and the pods' statuses.
	Client kubernetes.Interface
	// Sim is the simulated node: its Name is the Node's name, its GPUs the
	// GPUs, and the kubelet adds and removes its Pods. Sim.Start must have
	// been called (the PodResources server runs there).
	Sim *simnode.Node
	// DevicePluginDir, when set, is where the Registration service listens
	// (kubelet.sock) and where registered plugins' sockets are found.
	DevicePluginDir string
	// StaticDevices advertises these device IDs per resource as if a
	// device plugin had (one that neither prefers nor allocates): for nodes
	// run without a device plugin.
	StaticDevices map[string][]string
	// Labels are added to the Node's (kubernetes.io/hostname and
	// kubernetes.io/os are always set).
	Labels map[string]string
	// CPU, Memory and Pods are the Node's capacity; defaults 8, 32Gi, 110.
	CPU, Memory, Pods string
	// Heartbeat is how often the Lease is renewed and the Node's status
	// posted when nothing changed; default 2s.
	Heartbeat time.Duration
	Logger    *slog.Logger
}

// Kubelet is a running fake kubelet.
type Kubelet struct {
	o    Options
	name string
	log  *slog.Logger

	statusDirty chan struct{}

	mu       sync.Mutex
	devices  map[string][]*pluginapi.Device // by resource, as last advertised
	plugins  map[string]*endpoint           // by resource
	inUse    map[string]string              // device ID → pod key
	pods     map[string]*podState           // by namespace/name
	nextPID  int
	nextIP   int
	history  []AllocatableChange
	oomLines []OOMLine
}

// AllocatableChange is a device count written into the Node's allocatable.
type AllocatableChange struct {
	Time     time.Time
	Resource string
	Count    int64
}

// OOMLine is a CUDA OOM traceback written to a container's log.
type OOMLine struct {
	Time                      time.Time
	Namespace, Pod, Container string
}

// New checks the options; Run starts the kubelet.
func New(o Options) (*Kubelet, error) {
	if o.Client == nil || o.Sim == nil || o.Sim.Name == "" {
		return nil, fmt.Errorf("%w: Client and Sim (with a Name) are required", ErrOptions)
	}
	if o.Sim.PodResources() == nil {
		return nil, fmt.Errorf("%w: Sim must be started (its PodResources server)", ErrOptions)
	}
	for name, v := range map[string]*string{"CPU": &o.CPU, "Memory": &o.Memory, "Pods": &o.Pods} {
		def := map[string]string{"CPU": "8", "Memory": "32Gi", "Pods": "110"}[name]
		if *v == "" {
			*v = def
		}
		if _, err := resource.ParseQuantity(*v); err != nil {
			return nil, fmt.Errorf("%w: %s %q: %w", ErrOptions, name, *v, err)
		}
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	k := &Kubelet{
		o: o, name: o.Sim.Name, log: o.Logger.With("node", o.Sim.Name),
		statusDirty: make(chan struct{}, 1),
		devices:     map[string][]*pluginapi.Device{}, plugins: map[string]*endpoint{},
		inUse: map[string]string{}, pods: map[string]*podState{}, nextPID: 1000, nextIP: 10,
	}
	for res, ids := range o.StaticDevices {
		for _, id := range ids {
			k.devices[res] = append(k.devices[res], &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
		}
	}
	return k, nil
}

// Run registers the Node and runs until ctx ends. It returns once the
// Registration server listens and the pod informer has synced; the work
// goes on in goroutines stopped by ctx.
func (k *Kubelet) Run(ctx context.Context) error {
	if err := k.register(ctx); err != nil {
		return err
	}
	if k.o.DevicePluginDir != "" {
		if err := k.serveRegistration(ctx); err != nil {
			return err
		}
	}
	k.mu.Lock()
	err := k.syncSimLocked()
	k.mu.Unlock()
	if err != nil {
		return err
	}
	go k.heartbeat(ctx)
	return k.runPods(ctx)
}

// Allocatable returns every count the kubelet wrote into the Node's
// allocatable, oldest first.
func (k *Kubelet) Allocatable() []AllocatableChange {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.history)
}

// OOMLines returns the OOM tracebacks written so far, oldest first.
func (k *Kubelet) OOMLines() []OOMLine {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.oomLines)
}

// register creates the Node as a kubelet does (the API server's
// TaintNodesByCondition admission gives it the not-ready taint, which the
// node lifecycle controller removes once it reports Ready), or takes over
// an existing one.
func (k *Kubelet) register(ctx context.Context) error {
	labels := map[string]string{"kubernetes.io/hostname": k.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
	maps.Copy(labels, k.o.Labels)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.name, Labels: labels}}
	_, err := k.o.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("fakekubelet: registering node %s: %w", k.name, err)
	}
	if err := k.postStatus(ctx); err != nil {
		return err
	}
	return k.renewLease(ctx)
}

// heartbeat renews the Lease every Heartbeat and posts the Node's status
// when the devices changed, or every five heartbeats.
func (k *Kubelet) heartbeat(ctx context.Context) {
	tick := time.NewTicker(k.o.Heartbeat)
	defer tick.Stop()
	beats := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.statusDirty:
			if err := k.postStatus(ctx); err != nil && ctx.Err() == nil {
				k.log.Warn("posting node status", "err", err)
				k.markDirty() // try again
			}
		case <-tick.C:
			beats++
			if err := k.renewLease(ctx); err != nil && ctx.Err() == nil {
				k.log.Warn("renewing node lease", "err", err)
			}
			if beats%5 == 0 {
				k.markDirty()
			}
		}
	}
}

func (k *Kubelet) markDirty() {
	select {
	case k.statusDirty <- struct{}{}:
	default:
	}
}

// counts returns capacity (every device) and allocatable (healthy ones) per
// resource.
func (k *Kubelet) countsLocked() (capacity, allocatable map[string]int64) {
	capacity, allocatable = map[string]int64{}, map[string]int64{}
	for res, devs := range k.devices {
		capacity[res] = int64(len(devs))
		allocatable[res] = 0
		for _, d := range devs {
			if d.Health == pluginapi.Healthy {
				allocatable[res]++
			}
		}
	}
	return capacity, allocatable
}

// postStatus writes the Node's status: capacity, allocatable, Ready.
func (k *Kubelet) postStatus(ctx context.Context) error {
	k.mu.Lock()
	capacity, alloc := k.countsLocked()
	k.mu.Unlock()
	now := metav1.Now()
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		node, err := k.o.Client.CoreV1().Nodes().Get(ctx, k.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node = node.DeepCopy()
		st := &node.Status
		base := corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse(k.o.CPU),
			corev1.ResourceMemory: resource.MustParse(k.o.Memory),
			corev1.ResourcePods:   resource.MustParse(k.o.Pods),
		}
		st.Capacity, st.Allocatable = base.DeepCopy(), base.DeepCopy()
		for res, n := range capacity {
			st.Capacity[corev1.ResourceName(res)] = *resource.NewQuantity(n, resource.DecimalSI)
			st.Allocatable[corev1.ResourceName(res)] = *resource.NewQuantity(alloc[res], resource.DecimalSI)
		}
		st.Conditions = conditions(st.Conditions, now)
		st.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: k.name}}
		st.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.37.1", OperatingSystem: "linux", Architecture: "amd64",
			ContainerRuntimeVersion: "fake://1.0", MachineID: k.name, SystemUUID: k.name, BootID: k.name}
		st.Phase = corev1.NodeRunning
		_, err = k.o.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{FieldManager: "fakekubelet"})
		return err
	})
	if err != nil {
		return fmt.Errorf("fakekubelet: node %s status: %w", k.name, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	res := slices.Sorted(maps.Keys(alloc))
	for _, r := range res {
		if last := k.lastWrittenLocked(r); last == nil || last.Count != alloc[r] {
			k.history = append(k.history, AllocatableChange{Time: time.Now(), Resource: r, Count: alloc[r]})
			k.log.Info("node allocatable written", "resource", r, "count", alloc[r])
		}
	}
	return nil
}

func (k *Kubelet) lastWrittenLocked(res string) *AllocatableChange {
	for i := len(k.history) - 1; i >= 0; i-- {
		if k.history[i].Resource == res {
			return &k.history[i]
		}
	}
	return nil
}

// conditions keeps the node Ready without pressure, as a healthy kubelet
// reports it, with this heartbeat's time.
func conditions(old []corev1.NodeCondition, now metav1.Time) []corev1.NodeCondition {
	want := []struct {
		typ    corev1.NodeConditionType
		status corev1.ConditionStatus
		reason string
	}{
		{corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory"},
		{corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure"},
		{corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID"},
		{corev1.NodeReady, corev1.ConditionTrue, "KubeletReady"},
	}
	var out []corev1.NodeCondition
	for _, w := range want {
		c := corev1.NodeCondition{Type: w.typ, Status: w.status, Reason: w.reason, LastHeartbeatTime: now, LastTransitionTime: now}
		for _, o := range old {
			if o.Type == w.typ && o.Status == w.status {
				c.LastTransitionTime = o.LastTransitionTime
			}
		}
		out = append(out, c)
	}
	return out
}

// renewLease keeps kube-node-lease/<node> fresh: the heartbeat the node
// lifecycle controller reads.
func (k *Kubelet) renewLease(ctx context.Context) error {
	leases := k.o.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	dur := int32(40)
	holder := k.name
	l, err := leases.Get(ctx, k.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err := k.o.Client.CoreV1().Nodes().Get(ctx, k.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: k.name, Namespace: corev1.NamespaceNodeLease,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, RenewTime: &now},
		}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l = l.DeepCopy()
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &holder, &dur, &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// syncSimLocked renders the simulated node: each GPU's advertised replica
// count, the files, and the PodResources answers with the exact device IDs
// advertised.
func (k *Kubelet) syncSimLocked() error {
	perGPU := map[string]int{}
	var alloc []podresources.Allocatable
	for _, res := range slices.Sorted(maps.Keys(k.devices)) {
		a := podresources.Allocatable{Resource: res}
		for _, d := range k.devices[res] {
			if d.Health != pluginapi.Healthy {
				continue
			}
			a.DeviceIDs = append(a.DeviceIDs, d.ID)
			if id, err := podresources.ParseDeviceID(d.ID); err == nil {
				perGPU[id.UUID]++
			}
		}
		sort.Strings(a.DeviceIDs)
		alloc = append(alloc, a)
	}
	for _, g := range k.o.Sim.GPUs {
		g.Replicas = perGPU[g.UUID]
	}
	if err := k.o.Sim.Sync(); err != nil {
		return fmt.Errorf("fakekubelet: rendering the simulated node: %w", err)
	}
	// Sync answers allocatable from each GPU's replica count as IDs ::0..n-1;
	// a plugin draining a lowered count advertises other IDs.
	k.o.Sim.PodResources().SetAllocatable(alloc)
	return nil
}

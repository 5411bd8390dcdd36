package fakekubelet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"

	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/test/simnode"
)

// podState is a pod this kubelet runs.
type podState struct {
	uid     types.UID
	started time.Time
	sim     *simnode.Pod
	devices []string // every device ID held, released when the pod ends
	work    workload
	oomed   bool
	exited  bool
}

// runPods watches the pods bound to this node and works through them one
// at a time until ctx ends.
func (k *Kubelet) runPods(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(k.o.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.name).String()
	}))
	inf := f.Core().V1().Pods()
	q := workqueue.NewTypedDelayingQueue[string]()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			q.Add(key)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("fakekubelet: syncing the %v informer", typ)
		}
	}
	lister := inf.Lister()
	go func() {
		<-ctx.Done()
		q.ShutDown()
		f.Shutdown()
	}()
	go func() {
		for {
			key, quit := q.Get()
			if quit {
				return
			}
			if again, err := k.syncPod(ctx, lister, key); err != nil && ctx.Err() == nil {
				k.log.Warn("pod sync failed; retrying", "pod", key, "err", err)
				q.AddAfter(key, 500*time.Millisecond)
			} else if again > 0 {
				q.AddAfter(key, again)
			}
			q.Done(key)
		}
	}()
	return nil
}

// syncPod brings one pod to what its spec and workload say now; it returns
// when it wants to look again (the next workload event).
func (k *Kubelet) syncPod(ctx context.Context, lister listersv1.PodLister, key string) (time.Duration, error) {
	ns, name, _ := strings.Cut(key, "/")
	pod, err := lister.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		pod, err = nil, nil
	}
	if err != nil {
		return 0, err
	}
	k.mu.Lock()
	st := k.pods[key]
	k.mu.Unlock()
	if st != nil && (pod == nil || pod.UID != st.uid) {
		k.stop(key, st) // deleted, or replaced by a pod of the same name
		st = nil
	}
	switch {
	case pod == nil:
		return 0, nil
	case pod.DeletionTimestamp != nil:
		if st != nil {
			k.stop(key, st)
		}
		// The kubelet's final word: nothing runs any more, remove it now.
		uid := pod.UID
		err := k.o.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return 0, err
		}
		return 0, nil
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		if st != nil && !st.exited {
			k.stop(key, st)
		}
		return 0, nil
	case st == nil && pod.Status.Phase != "" && pod.Status.Phase != corev1.PodPending:
		// Running from before this kubelet started: nothing of it is
		// simulated here, so it fails as after a node reboot.
		return 0, k.fail(ctx, pod, "NodeRestarted", "the fake kubelet restarted and does not know this pod")
	case st == nil:
		return k.start(ctx, key, pod)
	}
	return k.step(ctx, key, pod, st)
}

// start admits a pod: devices from the plugin, the simulated processes,
// logs and cgroups, and a Running status.
func (k *Kubelet) start(ctx context.Context, key string, pod *corev1.Pod) (time.Duration, error) {
	w, err := podWorkload(pod)
	if err != nil {
		return 0, k.fail(ctx, pod, "InvalidWorkload", err.Error())
	}
	st := &podState{uid: pod.UID, work: w, sim: &simnode.Pod{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)}}
	for _, c := range pod.Spec.Containers {
		sc := &simnode.Container{Name: c.Name, Replicas: map[string][]int{}}
		for res, q := range c.Resources.Limits {
			if !strings.Contains(string(res), "/") || q.Value() <= 0 {
				continue // cpu, memory: not devices
			}
			ids, err := k.allocate(ctx, key, string(res), int(q.Value()))
			if err != nil {
				k.release(st.devices)
				return 0, k.fail(ctx, pod, "UnexpectedAdmissionError", "Allocate failed due to "+err.Error())
			}
			st.devices = append(st.devices, ids...)
			for _, id := range ids {
				d, err := podresources.ParseDeviceID(id)
				if err != nil {
					continue // not a GPU: held, but nothing to simulate
				}
				if d.Shared {
					sc.Replicas[d.UUID] = append(sc.Replicas[d.UUID], d.Replica)
				} else if _, ok := sc.Replicas[d.UUID]; !ok {
					sc.Replicas[d.UUID] = nil
				}
			}
		}
		st.sim.Containers = append(st.sim.Containers, sc)
	}
	st.started = time.Now()
	k.mu.Lock()
	k.pods[key] = st
	k.applyWorkloadLocked(st)
	k.o.Sim.Pods = append(k.o.Sim.Pods, st.sim)
	ip := fmt.Sprintf("10.88.0.%d", k.nextIP)
	k.nextIP++
	err = k.syncSimLocked()
	k.mu.Unlock()
	if err != nil {
		return 0, err
	}
	k.log.Info("pod started", "pod", key, "devices", st.devices)
	if err := k.writeStatus(ctx, pod, func(s *corev1.PodStatus) { k.runningStatus(s, pod, st, ip) }); err != nil {
		return 0, err
	}
	return k.step(ctx, key, pod, st)
}

// podWorkload reads a pod's workload and checks it against its spec.
func podWorkload(pod *corev1.Pod) (workload, error) {
	w, err := parseWorkload(pod.Annotations)
	if err == nil && w.hasExit && pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		err = fmt.Errorf("annotation %s needs restartPolicy Never (restarts are not simulated), the pod has %q", AnnotationExitAfter, pod.Spec.RestartPolicy)
	}
	return w, err
}

// applyWorkloadLocked gives each GPU container one process per GPU it holds,
// with the workload's memory and utilization.
func (k *Kubelet) applyWorkloadLocked(st *podState) {
	for _, c := range st.sim.Containers {
		pids := map[string]int{}
		for _, p := range c.Processes {
			pids[p.GPU] = p.PID
		}
		c.Processes = nil
		for _, uuid := range sortedKeys(c.Replicas) {
			pid := pids[uuid]
			if pid == 0 {
				pid = k.nextPID
				k.nextPID++
			}
			c.Processes = append(c.Processes, simnode.Process{PID: pid, GPU: uuid, MemoryBytes: st.work.memory, SM: st.work.sm})
		}
	}
}

// step runs a started pod's workload: changed annotations, the OOM, the
// exit. It returns when the next event is due.
func (k *Kubelet) step(ctx context.Context, key string, pod *corev1.Pod, st *podState) (time.Duration, error) {
	if st.exited {
		return 0, nil
	}
	if w, err := podWorkload(pod); err != nil {
		k.log.Warn("ignoring a bad workload change", "pod", key, "err", err)
	} else if w != st.work {
		k.mu.Lock()
		st.work = w
		k.applyWorkloadLocked(st)
		err = k.syncSimLocked()
		k.mu.Unlock()
		if err != nil {
			return 0, err
		}
	}
	ran := time.Since(st.started)
	w := st.work
	if w.hasOOM && !st.oomed && ran >= w.oomAfter {
		if err := k.logOOM(key, st); err != nil {
			return 0, err
		}
	}
	if w.hasExit && ran >= w.exitAfter {
		return 0, k.exit(ctx, key, pod, st)
	}
	var next time.Duration
	for _, at := range []struct {
		has bool
		d   time.Duration
	}{{w.hasOOM && !st.oomed, w.oomAfter}, {w.hasExit, w.exitAfter}} {
		if at.has && (next == 0 || at.d-ran < next) {
			next = max(at.d-ran, time.Millisecond)
		}
	}
	return next, nil
}

// logOOM writes a CUDA OOM traceback to every GPU container's log.
func (k *Kubelet) logOOM(key string, st *podState) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	var total uint64
	for _, g := range k.o.Sim.GPUs {
		total = max(total, g.MemoryBytes)
	}
	for _, c := range st.sim.Containers {
		if len(c.Replicas) == 0 {
			continue
		}
		now := time.Now()
		if err := k.o.Sim.AppendLogAt(now, st.sim, c, oomTraceback(2<<30, total, 512<<20)...); err != nil {
			return fmt.Errorf("fakekubelet: OOM log of %s: %w", key, err)
		}
		k.oomLines = append(k.oomLines, OOMLine{Time: now, Namespace: st.sim.Namespace, Pod: st.sim.Name, Container: c.Name})
		k.log.Info("container logged a CUDA OOM", "pod", key, "container", c.Name)
	}
	st.oomed = true
	return nil
}

// exit ends a restartPolicy Never pod's containers: Failed after an OOM,
// Succeeded otherwise.
func (k *Kubelet) exit(ctx context.Context, key string, pod *corev1.Pod, st *podState) error {
	k.stop(key, st)
	code, reason, phase := int32(0), "Completed", corev1.PodSucceeded
	if st.oomed {
		code, reason, phase = 1, "Error", corev1.PodFailed
	}
	now := metav1.Now()
	return k.writeStatus(ctx, pod, func(s *corev1.PodStatus) {
		s.Phase = phase
		for i := range s.ContainerStatuses {
			cs := &s.ContainerStatuses[i]
			cs.Ready, cs.Started = false, new(bool)
			cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: code, Reason: reason, StartedAt: metav1.NewTime(st.started), FinishedAt: now, ContainerID: cs.ContainerID}}
		}
		setCondition(s, corev1.ContainersReady, corev1.ConditionFalse, "PodCompleted", now)
		setCondition(s, corev1.PodReady, corev1.ConditionFalse, "PodCompleted", now)
	})
}

// stop removes a pod from the simulated node and frees its devices.
func (k *Kubelet) stop(key string, st *podState) {
	k.mu.Lock()
	defer k.mu.Unlock()
	st.exited = true
	delete(k.pods, key)
	for _, id := range st.devices {
		delete(k.inUse, id)
	}
	k.o.Sim.Pods = slices.DeleteFunc(k.o.Sim.Pods, func(p *simnode.Pod) bool { return p == st.sim })
	if err := k.syncSimLocked(); err != nil {
		k.log.Error("rendering the simulated node", "err", err)
	}
	k.log.Info("pod stopped", "pod", key, "released", st.devices)
}

// fail refuses a pod as the kubelet's admission does: phase Failed with a
// reason and message.
func (k *Kubelet) fail(ctx context.Context, pod *corev1.Pod, reason, msg string) error {
	k.log.Warn("pod rejected", "pod", pod.Namespace+"/"+pod.Name, "reason", reason, "msg", msg)
	return k.writeStatus(ctx, pod, func(s *corev1.PodStatus) {
		s.Phase, s.Reason, s.Message = corev1.PodFailed, reason, msg
	})
}

// runningStatus is a started pod's status.
func (k *Kubelet) runningStatus(s *corev1.PodStatus, pod *corev1.Pod, st *podState, ip string) {
	start := metav1.NewTime(st.started)
	s.Phase = corev1.PodRunning
	s.HostIP, s.PodIP = "127.0.0.1", ip
	s.HostIPs, s.PodIPs = []corev1.HostIP{{IP: "127.0.0.1"}}, []corev1.PodIP{{IP: ip}}
	s.StartTime = &start
	s.QOSClass = corev1.PodQOSBestEffort
	for _, c := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		setCondition(s, c, corev1.ConditionTrue, "", start)
	}
	s.ContainerStatuses = nil
	for i, c := range pod.Spec.Containers {
		started := true
		s.ContainerStatuses = append(s.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "fake://" + c.Image,
			ContainerID: "containerd://" + st.sim.Containers[i].ID, Ready: true, Started: &started,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: start}},
		})
	}
}

func setCondition(s *corev1.PodStatus, typ corev1.PodConditionType, status corev1.ConditionStatus, reason string, at metav1.Time) {
	for i := range s.Conditions {
		if s.Conditions[i].Type == typ {
			if s.Conditions[i].Status != status {
				s.Conditions[i].LastTransitionTime = at
			}
			s.Conditions[i].Status, s.Conditions[i].Reason = status, reason
			return
		}
	}
	s.Conditions = append(s.Conditions, corev1.PodCondition{Type: typ, Status: status, Reason: reason, LastTransitionTime: at})
}

// writeStatus changes a pod's status from a fresh read, retrying on
// conflict. A pod that is gone needs no status.
func (k *Kubelet) writeStatus(ctx context.Context, pod *corev1.Pod, change func(*corev1.PodStatus)) error {
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := k.o.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID {
			return nil
		}
		cur = cur.DeepCopy()
		change(&cur.Status)
		_, err = k.o.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{FieldManager: "fakekubelet"})
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("status of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

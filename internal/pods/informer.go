package pods

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuslice/gpuslice/internal/kube"
)

const (
	uidIndex         = "uid"
	mirrorAnnotation = "kubernetes.io/config.mirror"
)

// Informer is a Source fed by a watch on the API server, limited by field
// selector to the pods bound to one node, so its memory and watch traffic do
// not grow with the cluster.
//
// It talks to the API through a REST client that knows core/v1 only, not
// through client-go's clientset: the clientset and its informer factory
// link and register every API group's types, which made the exporter's
// binary half as large again and its start-up touch all of it.
type Informer struct {
	informer cache.SharedIndexInformer
	node     string
	// health says whether the informer's lists and watches succeed.
	health kube.Health
}

// NewInformer builds the informer from the API server's config; Start runs
// it.
func NewInformer(cfg *rest.Config, nodeName string, resync time.Duration) (*Informer, error) {
	if nodeName == "" {
		return nil, errors.New("pods: the apiserver source needs the node name (--node-name or NODE_NAME)")
	}
	lw, err := podListWatch(cfg, fields.OneTermEqualSelector("spec.nodeName", nodeName).String())
	if err != nil {
		return nil, fmt.Errorf("pods: %w", err)
	}
	i := &Informer{node: nodeName}
	i.health.Track(lw)
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, resync, cache.Indexers{})
	i.informer = inf
	// Only what the exporter reads is kept: managed fields and most of the
	// spec are dropped to bound memory on busy nodes.
	if err := inf.SetTransform(trimPod); err != nil {
		return nil, fmt.Errorf("pods: %w", err)
	}
	if err := inf.AddIndexers(cache.Indexers{uidIndex: func(obj any) ([]string, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return nil, nil
		}
		// A static pod's containers run under the UID of its manifest; the
		// API shows a mirror pod with another UID that names the real one in
		// an annotation. Index both so cgroup UIDs of static pods resolve.
		if m := p.Annotations[mirrorAnnotation]; m != "" && m != string(p.UID) {
			return []string{string(p.UID), m}, nil
		}
		return []string{string(p.UID)}, nil
	}}); err != nil {
		return nil, fmt.Errorf("pods: %w", err)
	}
	return i, nil
}

// podListWatch lists and watches the pods that match fieldSelector in all
// namespaces.
func podListWatch(cfg *rest.Config, fieldSelector string) (*cache.ListWatch, error) {
	return kube.ListWatch(cfg, corev1.SchemeGroupVersion, corev1.AddToScheme, "pods", fieldSelector,
		func() runtime.Object { return &corev1.PodList{} })
}

// OnChange implements Notifier. A handler added after Start is first called
// once for every pod already known, as the informer replays them.
func (i *Informer) OnChange(f func()) {
	_, _ = i.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { f() },
		UpdateFunc: func(any, any) { f() },
		DeleteFunc: func(any) { f() },
	})
}

// Start runs the informer until ctx ends and waits for the first sync (or
// ctx's end).
func (i *Informer) Start(ctx context.Context) error {
	go i.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), i.informer.HasSynced) {
		return fmt.Errorf("pods: informer for node %s did not sync: %w", i.node, ctx.Err())
	}
	return nil
}

// Get implements Source.
func (i *Informer) Get(uid string) (*corev1.Pod, bool) {
	objs, err := i.informer.GetIndexer().ByIndex(uidIndex, uid)
	if err != nil || len(objs) == 0 {
		return nil, false
	}
	p, ok := objs[0].(*corev1.Pod)
	return p, ok
}

// List implements Source.
func (i *Informer) List() []*corev1.Pod {
	objs := i.informer.GetStore().List()
	out := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			out = append(out, p)
		}
	}
	return out
}

// Err implements Source.
func (i *Informer) Err() error {
	last := i.health.Err()
	switch {
	case !i.informer.HasSynced() && last != nil:
		return fmt.Errorf("pods: informer for node %s has not synced yet: %w", i.node, last)
	case !i.informer.HasSynced():
		return errors.New("pods: informer has not synced yet")
	case last != nil:
		return fmt.Errorf("pods: the pods of node %s may be out of date: %w", i.node, last)
	}
	return nil
}

func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	p.ManagedFields = nil
	if m, ok := p.Annotations[mirrorAnnotation]; ok {
		p.Annotations = map[string]string{mirrorAnnotation: m}
	} else {
		p.Annotations = nil
	}
	// Each container's name and limits stay: the OOM watch finds the
	// containers that ask for a GPU by them (a restartPolicy: Never pod may
	// OOM and leave the kubelet's PodResources list before any listing).
	p.Spec = corev1.PodSpec{NodeName: p.Spec.NodeName, InitContainers: trimContainers(p.Spec.InitContainers), Containers: trimContainers(p.Spec.Containers)}
	return p, nil
}

// trimContainers keeps each container's name and resource limits.
func trimContainers(cs []corev1.Container) []corev1.Container {
	if len(cs) == 0 {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, Resources: corev1.ResourceRequirements{Limits: c.Resources.Limits}}
	}
	return out
}

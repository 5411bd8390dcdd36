package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuslice/gpuslice/internal/kube"
)

// Informer watches the ResourceSlices of one node (resource.k8s.io/v1,
// served by default since Kubernetes 1.34). Like the pod informer it uses a
// REST client that knows this one group: the clientset would link every
// API group into the exporter.
type Informer struct {
	informer cache.SharedIndexInformer
	node     string
	// health says whether the informer's lists and watches succeed.
	health kube.Health
}

// NewInformer builds the informer; Start runs it.
func NewInformer(cfg *rest.Config, nodeName string) (*Informer, error) {
	if nodeName == "" {
		return nil, errors.New("dra: the ResourceSlice informer needs the node name (--node-name or NODE_NAME)")
	}
	selector := fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, nodeName).String()
	lw, err := kube.ListWatch(cfg, resourcev1.SchemeGroupVersion, resourcev1.AddToScheme, "resourceslices", selector,
		func() runtime.Object { return &resourcev1.ResourceSliceList{} })
	if err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	i := &Informer{node: nodeName}
	i.health.Track(lw)
	i.informer = cache.NewSharedIndexInformer(lw, &resourcev1.ResourceSlice{}, 0, cache.Indexers{})
	return i, nil
}

// Start runs the informer until ctx ends and waits for the first sync (or
// ctx's end).
func (i *Informer) Start(ctx context.Context) error {
	go i.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), i.informer.HasSynced) {
		return fmt.Errorf("dra: ResourceSlice informer for node %s did not sync: %w", i.node, ctx.Err())
	}
	return nil
}

// Devices indexes the slices known now. A node has a few slices of a few
// devices each, so this is rebuilt per call rather than kept in step with
// every event.
func (i *Informer) Devices() Devices {
	objs := i.informer.GetStore().List()
	slices := make([]*resourcev1.ResourceSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*resourcev1.ResourceSlice); ok {
			slices = append(slices, s)
		}
	}
	return FromSlices(slices)
}

// Err is non-nil until the informer has synced, and while its lists or
// watches fail (its slices may be out of date).
func (i *Informer) Err() error {
	last := i.health.Err()
	switch {
	case !i.informer.HasSynced() && last != nil:
		return fmt.Errorf("dra: ResourceSlice informer for node %s has not synced yet: %w", i.node, last)
	case !i.informer.HasSynced():
		return errors.New("dra: ResourceSlice informer has not synced yet")
	case last != nil:
		return fmt.Errorf("dra: the ResourceSlices of node %s may be out of date: %w", i.node, last)
	}
	return nil
}

// Served reports whether the API server serves ResourceSlices in
// resource.k8s.io/v1 (Kubernetes >= 1.34, or earlier with the version
// enabled). Without it an informer would only log failed lists.
func Served(ctx context.Context, cfg *rest.Config) (bool, error) {
	c := rest.CopyConfig(cfg)
	c.NegotiatedSerializer = serializer.NewCodecFactory(runtime.NewScheme()).WithoutConversion()
	client, err := rest.UnversionedRESTClientFor(c)
	if err != nil {
		return false, fmt.Errorf("dra: %w", err)
	}
	var list metav1.APIResourceList
	body, err := client.Get().AbsPath("/apis", resourcev1.SchemeGroupVersion.Group, resourcev1.SchemeGroupVersion.Version).DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("dra: discovering %s: %w", resourcev1.SchemeGroupVersion, err)
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return false, fmt.Errorf("dra: discovering %s: %w", resourcev1.SchemeGroupVersion, err)
	}
	for _, r := range list.APIResources {
		if r.Name == "resourceslices" {
			return true, nil
		}
	}
	return false, nil
}

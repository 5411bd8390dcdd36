package kube

import (
	"context"
	"errors"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// ListWatch lists and watches one resource of one API group version,
// limited by fieldSelector, through a REST client that knows only that
// group's types (addToScheme), for an informer. newList returns an empty
// list object of the resource.
func ListWatch(cfg *rest.Config, gv schema.GroupVersion, addToScheme func(*runtime.Scheme) error, resource, fieldSelector string, newList func() runtime.Object) (*cache.ListWatch, error) {
	scheme := runtime.NewScheme()
	if err := addToScheme(scheme); err != nil {
		return nil, err
	}
	c := rest.CopyConfig(cfg)
	c.APIPath = "/apis"
	if gv.Group == "" {
		c.APIPath = "/api"
	}
	c.GroupVersion = &gv
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	client, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, err
	}
	params := runtime.NewParameterCodec(scheme)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = fieldSelector
			list := newList()
			err := client.Get().Resource(resource).VersionedParams(&o, params).Do(ctx).Into(list)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = fieldSelector
			o.Watch = true
			return client.Get().Resource(resource).VersionedParams(&o, params).Watch(ctx)
		},
	}, nil
}

// Health keeps the last error of a ListWatch's calls (Track): an
// informer's HasSynced stays true for good after its first sync, so
// without it a cache gone stale (the API server unreachable, RBAC
// revoked) would pass for a healthy one.
type Health struct {
	failing atomic.Pointer[error]
}

// Track wraps lw's list and watch calls: one that fails sets h's error,
// one that succeeds clears it. Both, since a reflector may stream its
// first list through a watch.
func (h *Health) Track(lw *cache.ListWatch) {
	note := func(err error) {
		switch {
		case err == nil:
			h.failing.Store(nil)
		case !errors.Is(err, context.Canceled):
			h.failing.Store(&err)
		}
	}
	list, watchFn := lw.ListWithContextFunc, lw.WatchFuncWithContext
	lw.ListWithContextFunc = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		obj, err := list(ctx, o)
		note(err)
		return obj, err
	}
	lw.WatchFuncWithContext = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		w, err := watchFn(ctx, o)
		note(err)
		return w, err
	}
}

// Err is the last list or watch error, nil when the last one succeeded.
func (h *Health) Err() error {
	if p := h.failing.Load(); p != nil {
		return *p
	}
	return nil
}

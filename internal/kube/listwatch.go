package kube

import (
	"context"

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

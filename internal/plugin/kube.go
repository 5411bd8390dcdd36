package plugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// ConfigLabel is the node label naming the ConfigMap key a node uses, the
// label NVIDIA's config-manager reads.
const ConfigLabel = "nvidia.com/device-plugin.config"

// Event reasons recorded on the Node.
const (
	ReasonConfigInvalid = "DevicePluginConfigInvalid"
)

// ErrNoConfigKey means the source cannot tell which ConfigMap key to use, or
// the key is not in the ConfigMap.
var ErrNoConfigKey = errors.New("no device-plugin config for this node")

// KubeSource reads the config straight from the API server: one ConfigMap,
// and this Node's nvidia.com/device-plugin.config label choosing the key.
// Informers on just those two objects deliver a change as soon as the API
// server has it, without the kubelet's volume sync delay.
type KubeSource struct {
	Client          kubernetes.Interface
	Namespace, Name string // the ConfigMap
	NodeName        string
	DefaultKey      string               // used when the node has no label
	Recorder        record.EventRecorder // nil: events go to the API server
}

// Run implements Source.
func (s *KubeSource) Run(ctx context.Context, apply func(Update) error) error {
	rec := s.Recorder
	if rec == nil {
		b := record.NewBroadcaster(record.WithContext(ctx))
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.Client.CoreV1().Events("")})
		rec = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "gpuslice-plugin", Host: s.NodeName})
		defer b.Shutdown()
	}

	kick := make(chan struct{}, 1)
	notify := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke(kick) },
		UpdateFunc: func(any, any) { poke(kick) },
		DeleteFunc: func(any) { poke(kick) },
	}
	cms := informers.NewSharedInformerFactoryWithOptions(s.Client, 0, informers.WithNamespace(s.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.Name).String()
		}))
	nodes := informers.NewSharedInformerFactoryWithOptions(s.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.NodeName).String()
		}))
	cmInformer := cms.Core().V1().ConfigMaps()
	nodeInformer := nodes.Core().V1().Nodes()
	if _, err := cmInformer.Informer().AddEventHandler(notify); err != nil {
		return err
	}
	if _, err := nodeInformer.Informer().AddEventHandler(notify); err != nil {
		return err
	}
	cms.Start(ctx.Done())
	nodes.Start(ctx.Done())
	defer cms.Shutdown()
	defer nodes.Shutdown()
	for typ, ok := range cms.WaitForCacheSync(ctx.Done()) {
		if !ok && ctx.Err() == nil {
			return fmt.Errorf("syncing the %v informer", typ)
		}
	}
	for typ, ok := range nodes.WaitForCacheSync(ctx.Done()) {
		if !ok && ctx.Err() == nil {
			return fmt.Errorf("syncing the %v informer", typ)
		}
	}

	var last Update
	delivered := false
	for {
		u := s.read(cmInformer.Lister().ConfigMaps(s.Namespace).Get, nodeInformer.Lister().Get)
		if !delivered || !bytes.Equal(u.Data, last.Data) || u.Origin != last.Origin || errString(u.Err) != errString(last.Err) {
			last, delivered = u, true
			if err := apply(u); err != nil {
				rec.Eventf(s.nodeRef(), corev1.EventTypeWarning, ReasonConfigInvalid,
					"gpuslice-plugin keeps its last good config: %v", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		}
	}
}

func (s *KubeSource) read(getCM func(string) (*corev1.ConfigMap, error), getNode func(string) (*corev1.Node, error)) Update {
	cmName := "ConfigMap " + s.Namespace + "/" + s.Name
	key, keyFrom := s.DefaultKey, "--config.default"
	node, err := getNode(s.NodeName)
	switch {
	case err == nil:
		if v := node.Labels[ConfigLabel]; v != "" {
			key, keyFrom = v, "node label "+ConfigLabel
		}
	case apierrors.IsNotFound(err):
		return Update{Origin: "Node " + s.NodeName, Err: fmt.Errorf("node %q not found", s.NodeName)}
	default:
		return Update{Origin: "Node " + s.NodeName, Err: err}
	}
	cm, err := getCM(s.Name)
	if err != nil {
		return Update{Origin: cmName, Err: err}
	}
	if key == "" {
		// NVIDIA's config-manager behaviour with a single config:
		// use it whatever its name.
		if len(cm.Data) != 1 {
			keys := make([]string, 0, len(cm.Data))
			for k := range cm.Data {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			return Update{Origin: cmName, Err: fmt.Errorf("%w: node %s has no %s label, no --config.default is set, and %s has keys %v",
				ErrNoConfigKey, s.NodeName, ConfigLabel, cmName, keys)}
		}
		for k := range cm.Data {
			key, keyFrom = k, "the only key"
		}
	}
	origin := fmt.Sprintf("%s key %q (from %s)", cmName, key, keyFrom)
	data, ok := cm.Data[key]
	if !ok {
		return Update{Origin: origin, Err: fmt.Errorf("%w: %s has no key %q", ErrNoConfigKey, cmName, key)}
	}
	return Update{Data: []byte(data), Origin: origin}
}

func (s *KubeSource) nodeRef() *corev1.ObjectReference {
	// Nodes' events carry the node name as UID, as the kubelet's do, so
	// `kubectl describe node` lists them.
	return &corev1.ObjectReference{Kind: "Node", Name: s.NodeName, UID: types.UID(s.NodeName)}
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

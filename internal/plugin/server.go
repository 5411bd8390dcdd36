package plugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// socketCheckInterval is how often a server checks that its socket is still
// there; the kubelet removes plugin sockets when it starts, and the
// kubelet.sock watch may miss a restart (a watch on a recreated directory).
const socketCheckInterval = 5 * time.Second

// resourceServer is the device plugin of one resource. Its device list
// changes in place: open ListAndWatch streams get the new list.
type resourceServer struct {
	pluginapi.UnimplementedDevicePluginServer
	p      *Plugin
	name   string
	socket string
	kick   chan struct{} // the kubelet restarted: serve and register again
	// allocating counts the Allocate calls in flight: an ID the kubelet
	// may be allocating stays in the list (Options.RetireAfter).
	allocating atomic.Int32

	mu      sync.Mutex
	devices []*pluginapi.Device
	changed chan struct{} // closed and replaced when devices change
}

func newResourceServer(p *Plugin, name string) *resourceServer {
	return &resourceServer{
		p: p, name: name,
		socket:  filepath.Join(p.o.DevicePluginDir, SocketName(name)),
		kick:    make(chan struct{}, 1),
		changed: make(chan struct{}),
	}
}

func (s *resourceServer) setDevices(devs []*pluginapi.Device) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.EqualFunc(devs, s.devices, func(a, b *pluginapi.Device) bool { return proto.Equal(a, b) }) {
		return
	}
	s.devices = devs
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *resourceServer) current() ([]*pluginapi.Device, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.devices, s.changed
}

// run serves and registers until ctx ends, starting over when the kubelet
// restarts or registration fails.
func (s *resourceServer) run(ctx context.Context) {
	log := s.p.log.With("resource", s.name, "socket", s.socket)
	backoff := time.Second
	for {
		srv, err := s.serveAndRegister(ctx)
		var retry <-chan time.Time
		if err != nil {
			log.Warn("device plugin not registered; retrying", "err", err, "in", backoff)
			retry = time.After(backoff)
			backoff = min(2*backoff, 30*time.Second)
		} else {
			log.Info("device plugin registered with the kubelet")
			backoff = time.Second
		}
		check := time.NewTicker(socketCheckInterval)
	wait:
		for {
			select {
			case <-ctx.Done():
				check.Stop()
				s.stop(srv)
				return
			case <-s.kick:
				break wait
			case <-retry:
				break wait
			case <-check.C:
				if srv != nil {
					if _, err := os.Stat(s.socket); err != nil {
						log.Info("plugin socket removed: serving and registering again")
						break wait
					}
				}
			}
		}
		check.Stop()
		s.stop(srv)
	}
}

func (s *resourceServer) stop(srv *grpc.Server) {
	if srv == nil {
		return
	}
	srv.Stop()
	_ = removeStale(s.socket)
}

// serveAndRegister removes a stale socket, serves on a new one, checks that
// it answers, and registers with the kubelet. On error nothing is left
// serving.
func (s *resourceServer) serveAndRegister(ctx context.Context) (*grpc.Server, error) {
	if err := removeStale(s.socket); err != nil {
		return nil, fmt.Errorf("removing stale socket: %w", err)
	}
	lis, err := net.Listen("unix", s.socket)
	if err != nil {
		return nil, fmt.Errorf("listening: %w", err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, s)
	go func() { _ = srv.Serve(lis) }()

	if err := s.dialSelf(ctx); err != nil {
		s.stop(srv)
		return nil, err
	}
	if err := s.register(ctx); err != nil {
		s.stop(srv)
		return nil, err
	}
	return srv, nil
}

func (s *resourceServer) dialSelf(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+s.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("own socket does not answer: %w", err)
	}
	return nil
}

func (s *resourceServer) register(ctx context.Context) error {
	kubelet := s.p.o.KubeletSocket
	if _, err := os.Stat(kubelet); err != nil {
		return fmt.Errorf("kubelet socket: %w", err)
	}
	// A starting kubelet creates kubelet.sock a moment before it accepts
	// connections on it: on the real node (kubelet v1.37.1) the plugin,
	// which reacts to the file within a millisecond, was refused, and its
	// retry a second later came after the kubelet had re-admitted the pods
	// (a crash-looping pod then failed: "no healthy devices present"). So
	// the call waits for the kubelet to accept, redialing every few tens
	// of milliseconds, within its deadline.
	conn, err := grpc.NewClient("unix://"+kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(s.socket),
		ResourceName: s.name,
		Options:      s.options(),
	}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("registering with the kubelet at %s: %w", kubelet, err)
	}
	return nil
}

func (s *resourceServer) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions implements pluginapi.DevicePluginServer.
func (s *resourceServer) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return s.options(), nil
}

// ListAndWatch sends the device list now and again at every change, on the
// same stream.
func (s *resourceServer) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	var sent []*pluginapi.Device
	first := true
	for {
		devs, changed := s.current()
		if first || !slices.EqualFunc(devs, sent, func(a, b *pluginapi.Device) bool { return proto.Equal(a, b) }) {
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
				return err
			}
			sent, first = devs, false
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// GetPreferredAllocation implements pluginapi.DevicePluginServer.
func (s *resourceServer) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	p := s.p
	p.mu.Lock()
	pl := p.plan
	elsewhere := map[string]int{} // replicas in use under other resources, by GPU
	for _, devs := range pl.Resources {
		for _, d := range devs {
			if d.Draining {
				elsewhere[d.GPU]++
			}
		}
	}
	p.mu.Unlock()
	for _, d := range pl.Resources[s.name] {
		if d.Draining {
			elsewhere[d.GPU]-- // counted below as this resource's
		}
	}

	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.ContainerRequests {
		avail := map[string]bool{}
		for _, id := range c.AvailableDeviceIDs {
			avail[id] = true
		}
		inUse := map[string]int{}
		for g, n := range elsewhere {
			inUse[g] = max(n, 0)
		}
		for _, d := range pl.Resources[s.name] {
			if !avail[d.ID] && d.Healthy {
				inUse[d.GPU]++
			}
		}
		ids := preferred(p.o.Policy, pl, s.name, c.AvailableDeviceIDs, c.MustIncludeDeviceIDs, int(c.AllocationSize), inUse)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate implements pluginapi.DevicePluginServer.
func (s *resourceServer) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	s.allocating.Add(1)
	defer s.allocating.Add(-1)
	p := s.p
	p.mu.Lock()
	pl := p.plan
	fail := p.cfg != nil && p.cfg.FailRequestsGreaterThanOne
	if p.cfg != nil && p.cfg.MPS {
		fail = p.cfg.MPSSharing.FailRequestsGreaterThanOne
	}
	p.mu.Unlock()
	if pl.GPUs == nil {
		return nil, fmt.Errorf("%w for '%s': the plugin has no GPU inventory yet", ErrRequest, s.name)
	}
	resp := &pluginapi.AllocateResponse{}
	grants := make([]mpsGrant, len(req.ContainerRequests))
	for i, c := range req.ContainerRequests {
		r, err := containerResponse(pl, s.name, c.DevicesIds, fail, newRequestID())
		if err != nil {
			p.log.Warn("allocation refused", "resource", s.name, "devices", c.DevicesIds, "err", err)
			return nil, err
		}
		if g, ok := mpsGrantFor(pl, c.DevicesIds); ok {
			// Asked again now, not from the last health read: a
			// container started without its daemon fails in CUDA,
			// far from the cause.
			if err := checkMPSDaemon(p.o.MPSRoot, g.resource); err != nil {
				p.log.Warn("allocation refused", "resource", s.name, "devices", c.DevicesIds, "err", err)
				return nil, err
			}
			addMPS(r, p.o.MPSRoot, g)
			grants[i] = g
		}
		if p.o.Guardrails[s.name] {
			if r.Envs == nil {
				r.Envs = map[string]string{}
			}
			addGuardrails(r.Envs, pl, c.DevicesIds)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, r)
	}
	for i, c := range req.ContainerRequests {
		p.remember(s.name, c.DevicesIds)
		if grants[i].gpus > 0 {
			p.rememberMPS(s.name, c.DevicesIds, grants[i].limit)
		}
		p.metrics.allocations.WithLabelValues(s.name).Inc()
		p.log.Info("allocated", "resource", s.name, "devices", c.DevicesIds)
	}
	return resp, nil
}

// PreStartContainer implements pluginapi.DevicePluginServer; nothing needs
// doing before a container starts.
func (s *resourceServer) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

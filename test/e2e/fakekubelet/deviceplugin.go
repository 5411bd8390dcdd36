package fakekubelet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// registration is the kubelet's side of the device-plugin API.
type registration struct {
	pluginapi.UnimplementedRegistrationServer
	k   *Kubelet
	ctx context.Context
}

// endpoint is the kubelet's connection to one registered plugin.
type endpoint struct {
	resource string
	conn     *grpc.ClientConn
	client   pluginapi.DevicePluginClient
	options  *pluginapi.DevicePluginOptions
	cancel   context.CancelFunc
}

// KubeletSocket is the Registration socket's path for a device-plugin dir.
func KubeletSocket(dir string) string { return filepath.Join(dir, "kubelet.sock") }

// serveRegistration listens on <DevicePluginDir>/kubelet.sock until ctx ends.
func (k *Kubelet) serveRegistration(ctx context.Context) error {
	sock := KubeletSocket(k.o.DevicePluginDir)
	if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("fakekubelet: stale registration socket: %w", err)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("fakekubelet: registration socket: %w", err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, &registration{k: k, ctx: ctx})
	go func() { _ = srv.Serve(lis) }()
	context.AfterFunc(ctx, func() {
		srv.Stop()
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, e := range k.plugins {
			e.cancel()
			e.conn.Close()
		}
	})
	return nil
}

// Register implements pluginapi.RegistrationServer as the kubelet does: it
// checks the version, then connects to the plugin's endpoint in the
// background (the plugin waits for this call to return before it counts as
// registered).
func (r *registration) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if req.Version != pluginapi.Version {
		return nil, fmt.Errorf("fakekubelet: unsupported device-plugin API version %q (want %s)", req.Version, pluginapi.Version)
	}
	if req.ResourceName == "" || req.Endpoint == "" || filepath.Base(req.Endpoint) != req.Endpoint {
		return nil, fmt.Errorf("fakekubelet: bad registration: resource %q, endpoint %q", req.ResourceName, req.Endpoint)
	}
	r.k.log.Info("device plugin registered", "resource", req.ResourceName, "endpoint", req.Endpoint)
	go r.k.connect(r.ctx, req)
	return &pluginapi.Empty{}, nil
}

// connect dials a registered plugin and follows its ListAndWatch stream,
// replacing any earlier connection for the resource.
func (k *Kubelet) connect(ctx context.Context, req *pluginapi.RegisterRequest) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.o.DevicePluginDir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		k.log.Error("dialing device plugin", "resource", req.ResourceName, "err", err)
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	e := &endpoint{resource: req.ResourceName, conn: conn, client: pluginapi.NewDevicePluginClient(conn), options: req.Options, cancel: cancel}
	if e.options == nil {
		e.options = &pluginapi.DevicePluginOptions{}
	}
	stream, err := e.client.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		cancel()
		conn.Close()
		k.log.Error("ListAndWatch", "resource", req.ResourceName, "err", err)
		return
	}
	k.mu.Lock()
	if old := k.plugins[req.ResourceName]; old != nil {
		old.cancel()
		old.conn.Close()
	}
	k.plugins[req.ResourceName] = e
	k.mu.Unlock()
	for {
		resp, err := stream.Recv()
		if err != nil {
			if ctx.Err() == nil {
				k.log.Warn("ListAndWatch stream ended", "resource", req.ResourceName, "err", err)
			}
			return
		}
		k.setDevices(req.ResourceName, resp.Devices)
	}
}

// setDevices takes a plugin's new device list: the simulated node and the
// Node's capacity and allocatable follow.
func (k *Kubelet) setDevices(res string, devs []*pluginapi.Device) {
	k.mu.Lock()
	ids := make([]string, 0, len(devs))
	for _, d := range devs {
		ids = append(ids, d.ID+"("+d.Health+")")
	}
	k.devices[res] = slices.Clone(devs)
	err := k.syncSimLocked()
	k.mu.Unlock()
	k.log.Info("devices advertised", "resource", res, "devices", ids)
	if err != nil {
		k.log.Error("rendering the simulated node", "err", err)
	}
	k.markDirty()
}

// allocate picks n free healthy IDs of res for a container and, when a
// plugin serves res, asks it which to prefer and has it allocate them. The
// IDs are reserved for key before the plugin is called.
func (k *Kubelet) allocate(ctx context.Context, key string, res string, n int) ([]string, error) {
	k.mu.Lock()
	var free []string
	for _, d := range k.devices[res] {
		if d.Health == pluginapi.Healthy && k.inUse[d.ID] == "" {
			free = append(free, d.ID)
		}
	}
	e := k.plugins[res]
	if len(free) < n {
		k.mu.Unlock()
		return nil, fmt.Errorf("%w for %s. Requested: %d, Available: %d", errUnavailable, res, n, len(free))
	}
	chosen := free[:n]
	if e != nil && e.options.GetPreferredAllocationAvailable {
		k.mu.Unlock()
		resp, err := e.client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: free, AllocationSize: int32(n)},
		}})
		k.mu.Lock()
		if err != nil {
			k.log.Warn("GetPreferredAllocation failed; taking the first free IDs", "resource", res, "err", err)
		} else if p := resp.ContainerResponses; len(p) == 1 && len(p[0].DeviceIDs) == n && allFree(k, p[0].DeviceIDs) {
			chosen = p[0].DeviceIDs
		} else {
			k.log.Warn("GetPreferredAllocation gave an unusable answer; taking the first free IDs", "resource", res, "answer", resp)
		}
	}
	chosen = slices.Clone(chosen)
	for _, id := range chosen {
		if k.inUse[id] != "" {
			k.mu.Unlock()
			return nil, fmt.Errorf("%w for %s: %s was taken meanwhile", errUnavailable, res, id)
		}
	}
	for _, id := range chosen {
		k.inUse[id] = key
	}
	k.mu.Unlock()
	if e == nil {
		return chosen, nil
	}
	if _, err := e.client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: chosen}}}); err != nil {
		k.release(chosen)
		return nil, fmt.Errorf("allocate %s %v: %w", res, chosen, err)
	}
	return chosen, nil
}

func allFree(k *Kubelet, ids []string) bool {
	for _, id := range ids {
		if k.inUse[id] != "" {
			return false
		}
		found := false
		for _, devs := range k.devices {
			for _, d := range devs {
				found = found || (d.ID == id && d.Health == pluginapi.Healthy)
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// release frees device IDs.
func (k *Kubelet) release(ids []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, id := range ids {
		delete(k.inUse, id)
	}
}

// errUnavailable is the kubelet's admission failure when the devices a pod
// needs are not free (a scheduling race, or a plugin that shrank).
var errUnavailable = errors.New("requested number of devices unavailable")

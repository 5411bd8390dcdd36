// Package podresources asks the kubelet which devices it gave to which
// container, through its PodResources v1 API on a unix socket, and reads the
// NVIDIA device plugin's device IDs ("GPU-<uuid>" and time-sliced replicas
// "GPU-<uuid>::<n>").
//
// The kubelet API names pods and containers, not processes; package cgroup
// and the attribution package join the two.
package podresources

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// ErrUnavailable means the kubelet did not answer: its socket is missing, or
// nothing serves it in time. It is wrapped with the socket path.
var ErrUnavailable = errors.New("kubelet pod-resources API unavailable")

// DefaultTimeout bounds one call when no WithTimeout is given.
const DefaultTimeout = 5 * time.Second

// maxMessageSize matches the kubelet's own client: a node with many pods can
// answer List with more than gRPC's default 4 MiB.
const maxMessageSize = 16 << 20

// Allocation is one resource's devices assigned to one container.
type Allocation struct {
	Namespace string
	Pod       string
	Container string
	Resource  string
	DeviceIDs []string
	// Claims are the container's DRA devices of one driver (Resource is
	// then the driver's name, and DeviceIDs empty: the kubelet names DRA
	// devices by driver, pool and device, which only the driver's
	// ResourceSlices map to GPUs; package dra fills DeviceIDs in).
	Claims []ClaimDevice
}

// ClaimDevice is one device of a DRA ResourceClaim that a container uses
// (PodResources v1 dynamic_resources). Several containers, of one pod or
// several, list the same device when they share the claim.
type ClaimDevice struct {
	ClaimNamespace, ClaimName string
	Driver, Pool, Device      string
	// ShareID tells apart the shares of a device allocated by consumable
	// capacity; empty otherwise.
	ShareID string
}

// Allocatable is the devices of one resource that the kubelet can hand out.
type Allocatable struct {
	Resource  string
	DeviceIDs []string
}

// Client talks to one kubelet. It is safe for concurrent use.
type Client struct {
	path    string
	timeout time.Duration
	conn    *grpc.ClientConn
	api     podresourcesv1.PodResourcesListerClient
}

// Option configures a Client.
type Option func(*Client)

// WithTimeout bounds each call, including waiting for the connection.
func WithTimeout(d time.Duration) Option {
	return func(c *Client) { c.timeout = d }
}

// NewClient returns a client for the kubelet socket at socketPath. It does
// not connect: the socket need not exist yet, and calls reconnect by
// themselves after the kubelet restarts.
func NewClient(socketPath string, opts ...Option) (*Client, error) {
	if socketPath == "" {
		return nil, errors.New("podresources: empty socket path")
	}
	c := &Client{path: socketPath, timeout: DefaultTimeout}
	for _, o := range opts {
		o(c)
	}
	if c.timeout <= 0 {
		return nil, fmt.Errorf("podresources: timeout %v is not positive", c.timeout)
	}
	dial := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socketPath)
	}
	conn, err := grpc.NewClient("passthrough:///kubelet-pod-resources",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dial),
		// The socket is local: a restarted kubelet is back in seconds, so
		// gRPC's default backoff (up to 2 min) would only hide it.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  50 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   time.Second,
			},
			MinConnectTimeout: time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageSize)),
	)
	if err != nil {
		return nil, fmt.Errorf("podresources: %s: %w", socketPath, err)
	}
	c.conn = conn
	c.api = podresourcesv1.NewPodResourcesListerClient(conn)
	return c, nil
}

// Close releases the connection.
func (c *Client) Close() error {
	return c.conn.Close()
}

// List returns every device allocation of every container on the node, in
// the kubelet's order, one entry per container and resource, then one per
// container and DRA driver (with Claims). Containers without devices and
// CPU and memory assignments are left out.
func (c *Client) List(ctx context.Context) ([]Allocation, error) {
	var resp *podresourcesv1.ListPodResourcesResponse
	err := c.call(ctx, "List", func(ctx context.Context, opts ...grpc.CallOption) error {
		var err error
		resp, err = c.api.List(ctx, &podresourcesv1.ListPodResourcesRequest{}, opts...)
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []Allocation
	for _, pod := range resp.GetPodResources() {
		for _, ctr := range pod.GetContainers() {
			for _, g := range groupDevices(ctr.GetDevices()) {
				out = append(out, Allocation{
					Namespace: pod.GetNamespace(),
					Pod:       pod.GetName(),
					Container: ctr.GetName(),
					Resource:  g.Resource,
					DeviceIDs: g.DeviceIDs,
				})
			}
			for _, g := range groupClaims(ctr.GetDynamicResources()) {
				g.Namespace, g.Pod, g.Container = pod.GetNamespace(), pod.GetName(), ctr.GetName()
				out = append(out, g)
			}
		}
	}
	return out, nil
}

// groupClaims turns a container's DRA claims into one Allocation per
// driver, devices in the kubelet's order.
func groupClaims(claims []*podresourcesv1.DynamicResource) []Allocation {
	var out []Allocation
	index := map[string]int{}
	for _, c := range claims {
		for _, r := range c.GetClaimResources() {
			if r.GetDriverName() == "" || r.GetDeviceName() == "" {
				continue
			}
			i, ok := index[r.GetDriverName()]
			if !ok {
				i = len(out)
				index[r.GetDriverName()] = i
				out = append(out, Allocation{Resource: r.GetDriverName()})
			}
			out[i].Claims = append(out[i].Claims, ClaimDevice{
				ClaimNamespace: c.GetClaimNamespace(), ClaimName: c.GetClaimName(),
				Driver: r.GetDriverName(), Pool: r.GetPoolName(), Device: r.GetDeviceName(),
				ShareID: r.GetShareId(),
			})
		}
	}
	return out
}

// Allocatable returns the node's devices per resource (GetAllocatableResources),
// one entry per resource in the kubelet's order.
func (c *Client) Allocatable(ctx context.Context) ([]Allocatable, error) {
	var resp *podresourcesv1.AllocatableResourcesResponse
	err := c.call(ctx, "GetAllocatableResources", func(ctx context.Context, opts ...grpc.CallOption) error {
		var err error
		resp, err = c.api.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{}, opts...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return groupDevices(resp.GetDevices()), nil
}

// groupDevices merges the kubelet's device groups by resource: it splits one
// resource into several groups (one per device or NUMA node), which tells a
// caller nothing here.
func groupDevices(devs []*podresourcesv1.ContainerDevices) []Allocatable {
	var out []Allocatable
	index := map[string]int{}
	for _, d := range devs {
		if len(d.GetDeviceIds()) == 0 {
			continue
		}
		i, ok := index[d.GetResourceName()]
		if !ok {
			i = len(out)
			index[d.GetResourceName()] = i
			out = append(out, Allocatable{Resource: d.GetResourceName()})
		}
		out[i].DeviceIDs = append(out[i].DeviceIDs, d.GetDeviceIds()...)
	}
	return out
}

// call runs one RPC under the per-call timeout and turns "no kubelet" into
// ErrUnavailable.
func (c *Client) call(ctx context.Context, method string, rpc func(context.Context, ...grpc.CallOption) error) error {
	// Without the socket no wait can help; say so now rather than at the
	// deadline.
	if _, err := os.Stat(c.path); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s: socket missing", ErrUnavailable, c.path)
	}
	callCtx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if state := c.conn.GetState(); state != connectivity.Ready {
		// A socket file with nothing listening (a kubelet stopped or
		// crashed may leave it behind) refuses at once, but WaitForReady
		// would wait out the whole timeout on every call, and every
		// scrape with it. A plain connect tells.
		probe, err := (&net.Dialer{}).DialContext(callCtx, "unix", c.path)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrUnavailable, c.path, err)
		}
		_ = probe.Close()
		// After failed attempts gRPC waits out a backoff before dialing
		// again; the socket answers now, so dial at once.
		if state == connectivity.TransientFailure {
			c.conn.ResetConnectBackoff()
		}
	}
	// WaitForReady rides out the moment between the socket appearing and the
	// connection being up, bounded by the timeout above.
	err := rpc(callCtx, grpc.WaitForReady(true))
	if status.Code(err) == codes.Unavailable && callCtx.Err() == nil {
		// The connection can die under a call when the kubelet restarted
		// after the last one and gRPC has not noticed yet. These calls only
		// read, so one more try, on a fresh connection, is safe.
		err = rpc(callCtx, grpc.WaitForReady(true))
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(ctx.Err(), context.Canceled):
		// The caller gave up; that is not the kubelet's fault. (A caller's
		// deadline passing, on the other hand, is the kubelet not answering.)
		return fmt.Errorf("podresources %s: %s: %w", method, c.path, ctx.Err())
	case status.Code(err) == codes.Unavailable, status.Code(err) == codes.DeadlineExceeded:
		return fmt.Errorf("%w: %s: %s: %w", ErrUnavailable, c.path, method, err)
	}
	return fmt.Errorf("podresources %s: %s: %w", method, c.path, err)
}

// Instance tells one PodResources socket file from the next. A kubelet
// creates its PodResources socket anew each time it starts, and answers on
// it before it has rebuilt its pod list from the API server; a client that
// sees the Instance change knows that answers may be missing pods that are
// still running. The zero Instance is "no socket".
type Instance struct {
	info fs.FileInfo
}

// InstanceTeller is a client that tells which socket file its kubelet
// serves on (*Client does), so that its user can see the kubelet restart.
type InstanceTeller interface {
	Instance() Instance
}

// Same reports whether a and b are the same socket file: the same inode,
// created at the same time (a recreated socket can reuse a freed inode
// number, its modification time is new).
func (a Instance) Same(b Instance) bool {
	if a.info == nil || b.info == nil {
		return a.info == nil && b.info == nil
	}
	return os.SameFile(a.info, b.info) && a.info.ModTime().Equal(b.info.ModTime())
}

// Known reports whether the socket existed when the Instance was read.
func (a Instance) Known() bool { return a.info != nil }

// Instance reads which socket file the kubelet serves on now; the zero
// Instance when it is missing or cannot be read.
func (c *Client) Instance() Instance {
	fi, err := os.Stat(c.path)
	if err != nil {
		return Instance{}
	}
	return Instance{info: fi}
}

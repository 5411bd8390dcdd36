// Package podresourcestest is a fake kubelet PodResources v1 server on a real
// unix socket, for tests, demos and end-to-end runs without a kubelet. It
// serves List, GetAllocatableResources and Get from state the caller sets,
// and can vanish and come back like a restarting kubelet.
package podresourcestest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuslice/gpuslice/internal/podresources"
)

// TB is the part of testing.TB used here; *testing.T satisfies it. Programs
// that are not tests use Serve and never import package testing.
type TB interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
}

// SocketPath returns a socket path in a fresh short directory removed when
// the test ends. t.TempDir() is named after the test and can push a socket
// path past the 108-byte limit of unix sockets.
func SocketPath(tb TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "pr")
	if err != nil {
		tb.Fatalf("podresourcestest: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "kubelet.sock")
}

// Server is a fake kubelet. Its methods are safe for concurrent use.
type Server struct {
	path string

	mu          sync.Mutex // guards the state below
	pods        []podresources.Allocation
	allocatable []podresources.Allocatable
	err         error

	life sync.Mutex // guards srv; never held while mu is wanted by a handler
	srv  *grpc.Server
}

// Start serves on socketPath until the test ends.
func Start(tb TB, socketPath string) (*Server, error) {
	tb.Helper()
	s := &Server{path: socketPath}
	if err := s.listen(); err != nil {
		return nil, err
	}
	tb.Cleanup(s.Stop)
	return s, nil
}

// Serve serves on socketPath until ctx ends or Stop is called.
func Serve(ctx context.Context, socketPath string) (*Server, error) {
	s := &Server{path: socketPath}
	if err := s.listen(); err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, s.Stop)
	return s, nil
}

// Path is the socket the server listens on.
func (s *Server) Path() string { return s.path }

// SetPods replaces what List and Get answer. Allocations of the same pod and
// container are grouped the way the kubelet groups them; order is kept. An
// Allocation with neither Resource nor DeviceIDs lists a container that
// holds no devices. An Allocation's Claims are served as the container's
// dynamic resources, one entry per claim (its Resource is not sent).
func (s *Server) SetPods(allocs []podresources.Allocation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods = clone(allocs, func(a podresources.Allocation) podresources.Allocation {
		a.DeviceIDs = append([]string(nil), a.DeviceIDs...)
		a.Claims = append([]podresources.ClaimDevice(nil), a.Claims...)
		return a
	})
}

// SetAllocatable replaces what GetAllocatableResources answers.
func (s *Server) SetAllocatable(devs []podresources.Allocatable) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.allocatable = clone(devs, func(a podresources.Allocatable) podresources.Allocatable {
		a.DeviceIDs = append([]string(nil), a.DeviceIDs...)
		return a
	})
}

// SetError makes every call fail with err (a gRPC status error is sent as
// is); nil makes calls succeed again.
func (s *Server) SetError(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// Stop closes the socket and every connection, as a dying kubelet does. It
// may be called more than once.
func (s *Server) Stop() {
	s.life.Lock()
	defer s.life.Unlock()
	if s.srv == nil {
		return
	}
	s.srv.Stop()
	s.srv = nil
	// The listener does not unlink its socket (see listen), so the file goes
	// here, as it does when a kubelet exits. Failing here would help nobody.
	_ = os.Remove(s.path)
}

// Restart stops the server, removes the socket and serves again on the same
// path with the same state, as a restarted kubelet does.
func (s *Server) Restart() error {
	s.Stop()
	return s.listen()
}

func (s *Server) listen() error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.srv != nil {
		return fmt.Errorf("podresourcestest: %s: already serving", s.path)
	}
	// A socket left behind by a previous run would make Listen fail.
	if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("podresourcestest: removing stale socket: %w", err)
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("podresourcestest: %w", err)
	}
	// When Stop comes before the Serve goroutine runs, gRPC closes the
	// listener late, which would unlink the socket of the next listen on the
	// same path.
	lis.SetUnlinkOnClose(false)
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, &service{s: s})
	s.srv = srv
	go func() { _ = srv.Serve(lis) }()
	return nil
}

// service implements the API; it is separate from Server so that the gRPC
// methods do not become part of Server's API.
type service struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	s *Server
}

func (v *service) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	if v.s.err != nil {
		return nil, v.s.err
	}
	return &podresourcesv1.ListPodResourcesResponse{PodResources: podProtos(v.s.pods)}, nil
}

func (v *service) Get(_ context.Context, req *podresourcesv1.GetPodResourcesRequest) (*podresourcesv1.GetPodResourcesResponse, error) {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	if v.s.err != nil {
		return nil, v.s.err
	}
	for _, p := range podProtos(v.s.pods) {
		if p.Name == req.GetPodName() && p.Namespace == req.GetPodNamespace() {
			return &podresourcesv1.GetPodResourcesResponse{PodResources: p}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "pod %s in namespace %s not found", req.GetPodName(), req.GetPodNamespace())
}

func (v *service) GetAllocatableResources(context.Context, *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	if v.s.err != nil {
		return nil, v.s.err
	}
	resp := &podresourcesv1.AllocatableResourcesResponse{}
	for _, a := range v.s.allocatable {
		// The kubelet sends one entry per device; do the same so that
		// clients are tested against that shape.
		for _, id := range a.DeviceIDs {
			resp.Devices = append(resp.Devices, &podresourcesv1.ContainerDevices{
				ResourceName: a.Resource,
				DeviceIds:    []string{id},
			})
		}
	}
	return resp, nil
}

// podProtos groups allocations into pods and containers, in first-seen order.
func podProtos(allocs []podresources.Allocation) []*podresourcesv1.PodResources {
	var pods []*podresourcesv1.PodResources
	podIndex := map[[2]string]*podresourcesv1.PodResources{}
	ctrIndex := map[[3]string]*podresourcesv1.ContainerResources{}
	for _, a := range allocs {
		pod := podIndex[[2]string{a.Namespace, a.Pod}]
		if pod == nil {
			pod = &podresourcesv1.PodResources{Name: a.Pod, Namespace: a.Namespace}
			podIndex[[2]string{a.Namespace, a.Pod}] = pod
			pods = append(pods, pod)
		}
		ctr := ctrIndex[[3]string{a.Namespace, a.Pod, a.Container}]
		if ctr == nil {
			ctr = &podresourcesv1.ContainerResources{Name: a.Container}
			ctrIndex[[3]string{a.Namespace, a.Pod, a.Container}] = ctr
			pod.Containers = append(pod.Containers, ctr)
		}
		if len(a.Claims) > 0 {
			addClaims(ctr, a.Claims)
			continue
		}
		if a.Resource != "" || len(a.DeviceIDs) > 0 {
			ctr.Devices = append(ctr.Devices, &podresourcesv1.ContainerDevices{
				ResourceName: a.Resource,
				DeviceIds:    append([]string(nil), a.DeviceIDs...),
			})
		}
	}
	return pods
}

// addClaims adds DRA devices to a container the way the kubelet lists
// them: one DynamicResource per claim, its devices as ClaimResources.
func addClaims(ctr *podresourcesv1.ContainerResources, claims []podresources.ClaimDevice) {
	for _, c := range claims {
		var dr *podresourcesv1.DynamicResource
		for _, d := range ctr.DynamicResources {
			if d.ClaimNamespace == c.ClaimNamespace && d.ClaimName == c.ClaimName {
				dr = d
			}
		}
		if dr == nil {
			dr = &podresourcesv1.DynamicResource{ClaimNamespace: c.ClaimNamespace, ClaimName: c.ClaimName}
			ctr.DynamicResources = append(ctr.DynamicResources, dr)
		}
		r := &podresourcesv1.ClaimResource{DriverName: c.Driver, PoolName: c.Pool, DeviceName: c.Device}
		if c.ShareID != "" {
			r.ShareId = &c.ShareID
		}
		dr.ClaimResources = append(dr.ClaimResources, r)
	}
}

func clone[T any](in []T, f func(T) T) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

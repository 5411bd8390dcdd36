package realnode_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/testproc"
)

// raceRes is the resource of racePlugin.
const raceRes = corev1.ResourceName("example.com/alloc-race")

// racePlugin is a device plugin of the test's own that changes its list
// while the kubelet's Allocate is in flight, as gpuslice-plugin's list can
// change when a held ID is released just as the kubelet allocates it: it
// marks the IDs asked for unhealthy (what gpuslice-plugin now does with a
// dropped ID) or, with drop, leaves them out, waits for the kubelet to take
// the new list, and only then answers.
type racePlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	drop bool

	mu      sync.Mutex
	devs    []*pluginapi.Device
	changed chan struct{}
}

func (p *racePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *racePlugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		p.mu.Lock()
		devs, changed := p.devs, p.changed
		p.mu.Unlock()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-s.Context().Done():
			return nil
		case <-changed:
		}
	}
}

func (p *racePlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	p.mu.Lock()
	var devs []*pluginapi.Device
	for _, d := range p.devs {
		asked := slices.ContainsFunc(req.ContainerRequests, func(c *pluginapi.ContainerAllocateRequest) bool { return slices.Contains(c.DevicesIds, d.ID) })
		switch {
		case asked && p.drop:
		case asked:
			devs = append(devs, &pluginapi.Device{ID: d.ID, Health: pluginapi.Unhealthy})
		default:
			devs = append(devs, d)
		}
	}
	p.devs = devs
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	// The kubelet takes a list as soon as it comes (its stream's goroutine
	// updates its device map); a second covers a loaded machine.
	time.Sleep(time.Second)
	for range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": gpuUUID},
		})
	}
	return resp, nil
}

func (p *racePlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// startRacePlugin serves p in the node's device-plugin directory and
// registers it with the real kubelet.
func startRacePlugin(t *testing.T, p *racePlugin) {
	t.Helper()
	n := need(t)
	p.devs = []*pluginapi.Device{{ID: "d0", Health: pluginapi.Healthy}, {ID: "d1", Health: pluginapi.Healthy}}
	p.changed = make(chan struct{})
	sock := filepath.Join(n.DevicePluginDir, "alloc-race.sock")
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		_ = os.Remove(sock)
	})
	conn, err := grpc.NewClient("unix://"+filepath.Join(n.DevicePluginDir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(sock), ResourceName: string(raceRes),
	}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("registering %s with the kubelet: %v", raceRes, err)
	}
}

// racePod is a fakecuda pod on one device of the race plugin.
func racePod(name string) *corev1.Pod {
	pod := fakeCUDAPod(name, podOpts{args: []string{"-memory", "0s=256Mi"}})
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{raceRes: *resource.NewQuantity(1, resource.DecimalSI)}
	return pod
}

// TestAllocateRaceOnRealKubelet: a device that turns unhealthy while the
// real kubelet allocates it leaves the kubelet running and the pod
// started. gpuslice-plugin relies on it: an ID it drops is first listed
// unhealthy (plugin.Options.RetireAfter), because kubelet v1.37.1 crashed
// (a nil pointer in devicemanager.allocateContainerResources) when
// gpuslice-plugin's list without an ID came during that ID's Allocate.
// With GPUSLICE_REALNODE_KUBELET_CRASH=1 the plugin drops the ID instead
// and the test expects the kubelet to crash; that kills the node's
// kubelet, so it is for a run of this test alone.
func TestAllocateRaceOnRealKubelet(t *testing.T) {
	need(t)
	crash := os.Getenv("GPUSLICE_REALNODE_KUBELET_CRASH") == "1"
	startRacePlugin(t, &racePlugin{drop: crash})
	waitAllocatable(t, raceRes, 2, 60*time.Second)
	pod := createPod(t, racePod("alloc-race"))
	if crash {
		testproc.Eventually(t, 60*time.Second, 500*time.Millisecond, func() string {
			if log := world.node.KubeletLog(); !strings.Contains(log, "nil pointer dereference") {
				return "the kubelet has not crashed"
			}
			return ""
		})
		log := world.node.KubeletLog()
		at := max(strings.Index(log, "panic: "), 0)
		t.Logf("the kubelet crashed:\n%s", strings.Join(strings.SplitN(log[at:], "\n", 9)[:8], "\n"))
		return
	}
	waitRunning(t, pod.Name, 60*time.Second)
	// The node's status is updated every 10 s or so.
	testproc.Eventually(t, 30*time.Second, 500*time.Millisecond, func() string {
		if a, c := nodeDevices(t, raceRes); a != 1 || c != 2 {
			return "allocatable/capacity not yet 1/2"
		}
		return ""
	})
	if log := world.node.KubeletLog(); strings.Contains(log, "nil pointer dereference") {
		t.Fatalf("the kubelet crashed:\n%s", testproc.Tail(log, 20))
	}
}

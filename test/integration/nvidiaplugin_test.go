package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/gpu/sim"
)

// registrar is a kubelet's device-plugin Registration service over a real
// unix socket: it hands each RegisterRequest to the test.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	requests chan *pluginapi.RegisterRequest
}

func (r *registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.requests <- req
	return &pluginapi.Empty{}, nil
}

// nvidiaPlugin runs NVIDIA's nvidia-device-plugin v0.19.0 on the simulated
// libnvidia-ml. Its own socket is always
// /var/lib/kubelet/device-plugins/nvidia-gpu.sock, so it runs in a mount
// namespace of its own where a directory of the test is mounted there:
// plugins and kubelets of other tests on this machine are left alone. It
// returns that directory (kubelet.sock and the plugin's socket are in it)
// and the Registration requests the plugin sends.
func nvidiaPlugin(t *testing.T, simFile string, args ...string) (string, chan *pluginapi.RegisterRequest, *process) {
	t.Helper()
	libDir := simLibraryDir(t)
	bin := filepath.Join(hackBuild(t, "nvidia-bins.sh"), "nvidia-device-plugin")
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatalf("unshare (util-linux) is needed to give NVIDIA's plugin a device-plugin directory of its own: %v", err)
	}
	dir, err := os.MkdirTemp("", "nvdp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	reg := &registrar{requests: make(chan *pluginapi.RegisterRequest, 4)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, reg)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	const inside = "/var/lib/kubelet/device-plugins"
	script := `mkdir -p ` + inside + ` && mount --bind "$0" ` + inside + ` && exec "$@"`
	full := append([]string{"--mount", "--propagation", "private", "sh", "-c", script, dir,
		bin, "--kubelet-socket=" + inside + "/kubelet.sock"}, args...)
	p := startEnv(t, []string{"GPUSLICE_SIM_FILE=" + simFile, "LD_LIBRARY_PATH=" + libDir}, unshare, full...)
	return dir, reg.requests, p
}

// listAndWatch connects to the plugin a Registration request names and
// returns its device lists as they come.
func listAndWatch(t *testing.T, dir string, req *pluginapi.RegisterRequest) (pluginapi.DevicePluginClient, <-chan []*pluginapi.Device) {
	t.Helper()
	return listAndWatchAs(t, dir, req, "nvidia.com/gpu")
}

// listAndWatchAs is listAndWatch for a plugin registered under resource.
func listAndWatchAs(t *testing.T, dir string, req *pluginapi.RegisterRequest, resource string) (pluginapi.DevicePluginClient, <-chan []*pluginapi.Device) {
	t.Helper()
	if req.ResourceName != resource || req.Version != pluginapi.Version {
		t.Fatalf("registered %q version %q, want %s %s", req.ResourceName, req.Version, resource, pluginapi.Version)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := pluginapi.NewDevicePluginClient(conn)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	lists := make(chan []*pluginapi.Device, 16)
	go func() {
		defer close(lists)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			lists <- resp.Devices
		}
	}()
	return client, lists
}

// nextList waits for the next device list whose devices, as "id health"
// sorted, satisfy ok, and fails with the last list seen otherwise.
func nextList(t *testing.T, lists <-chan []*pluginapi.Device, p *process, what string, ok func([]string) bool) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	var last []string
	for {
		select {
		case devs, open := <-lists:
			if !open {
				t.Fatalf("ListAndWatch ended before %s; last devices %v\n%s", what, last, p.Output())
			}
			last = last[:0]
			for _, d := range devs {
				last = append(last, d.ID+" "+d.Health)
			}
			slices.Sort(last)
			if ok(last) {
				return
			}
		case <-deadline:
			t.Fatalf("no device list with %s; last devices %v\n%s", what, last, p.Output())
		}
	}
}

func register(t *testing.T, reqs chan *pluginapi.RegisterRequest, p *process) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case req := <-reqs:
		return req
	case <-time.After(60 * time.Second):
		t.Fatalf("NVIDIA's plugin did not register in 60s:\n%s", p.Output())
		return nil
	}
}

// TestNVIDIADevicePluginOnLibnvml runs NVIDIA's own nvidia-device-plugin
// v0.19.0 against the simulated libnvidia-ml: it registers and advertises
// one device per GPU, marks a GPU unhealthy on an Xid event delivered
// through the library's event set, and with a time-slicing config
// advertises <uuid>::<n> replicas; a GPU in error keeps it from starting,
// as NVIDIA's plugin does on a node with a lost GPU.
func TestNVIDIADevicePluginOnLibnvml(t *testing.T) {
	scenario := func() *sim.File {
		f := libnvmlScenario()
		f.GPUs = f.GPUs[:2]
		f.GPUs[0].XidEvents = nil
		return f
	}
	uuids := []string{scenario().GPUs[0].UUID, scenario().GPUs[1].UUID}

	t.Run("one device per GPU, unhealthy on Xid", func(t *testing.T) {
		simFile := filepath.Join(t.TempDir(), "gpus.yaml")
		f := scenario()
		writeSim(t, simFile, f)
		dir, reqs, p := nvidiaPlugin(t, simFile)
		client, lists := listAndWatch(t, dir, register(t, reqs, p))
		want := []string{uuids[1] + " Healthy", uuids[0] + " Healthy"}
		slices.Sort(want)
		nextList(t, lists, p, fmt.Sprint(want), func(got []string) bool { return slices.Equal(got, want) })

		// The kubelet's calls when it admits a pod: the preferred
		// allocation reads the GPUs' topology through NVML.
		ctx := context.Background()
		pref, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: uuids, AllocationSize: 1}}})
		if err != nil {
			t.Fatalf("GetPreferredAllocation: %v\n%s", err, p.Output())
		}
		if ids := pref.ContainerResponses[0].DeviceIDs; len(ids) != 1 || !slices.Contains(uuids, ids[0]) {
			t.Errorf("preferred allocation %v, want one of %v", ids, uuids)
		}
		alloc, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: uuids[1:]}}})
		if err != nil {
			t.Fatalf("Allocate: %v\n%s", err, p.Output())
		}
		if env := alloc.ContainerResponses[0].Envs; env["NVIDIA_VISIBLE_DEVICES"] != uuids[1] {
			t.Errorf("Allocate envs %v, want NVIDIA_VISIBLE_DEVICES=%s", env, uuids[1])
		}

		// Xid 79 (fallen off the bus) is one NVIDIA's health check acts on.
		f.GPUs[1].XidEvents = []sim.XidEvent{{Xid: 79}}
		writeSim(t, simFile, f)
		nextList(t, lists, p, uuids[1]+" Unhealthy", func(got []string) bool {
			return slices.Contains(got, uuids[1]+" Unhealthy") && slices.Contains(got, uuids[0]+" Healthy")
		})
	})

	t.Run("time-slicing replicas", func(t *testing.T) {
		simFile := filepath.Join(t.TempDir(), "gpus.yaml")
		writeSim(t, simFile, scenario())
		config := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(config, []byte(`version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
`), 0o644); err != nil {
			t.Fatal(err)
		}
		dir, reqs, p := nvidiaPlugin(t, simFile, "--config-file="+config)
		_, lists := listAndWatch(t, dir, register(t, reqs, p))
		var want []string
		for _, u := range uuids {
			for n := range 4 {
				want = append(want, fmt.Sprintf("%s::%d Healthy", u, n))
			}
		}
		slices.Sort(want)
		nextList(t, lists, p, "4 replicas per GPU", func(got []string) bool { return slices.Equal(got, want) })
	})

	t.Run("GPU in error", func(t *testing.T) {
		simFile := filepath.Join(t.TempDir(), "gpus.yaml")
		writeSim(t, simFile, libnvmlScenario())
		_, reqs, p := nvidiaPlugin(t, simFile)
		eventually(t, 60*time.Second, func() string {
			if out := p.Output(); !strings.Contains(out, "error starting plugins") || !strings.Contains(out, "GPU is lost") {
				return "NVIDIA's plugin has not failed on the lost GPU:\n" + out
			}
			return ""
		})
		select {
		case req := <-reqs:
			t.Errorf("NVIDIA's plugin registered %s with a GPU in error", req.ResourceName)
		default:
		}
	})
}

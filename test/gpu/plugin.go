package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// registrar is the kubelet's device-plugin Registration service: it
// records the endpoint each plugin registers.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	endpoints chan string
}

func (r *registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	select {
	case r.endpoints <- req.Endpoint:
	default:
	}
	return &pluginapi.Empty{}, nil
}

// pluginResult is what gpuslice-plugin answered: the devices it
// advertised, and for each allocation asked for (one container each) the
// env and mounts it gave.
type pluginResult struct {
	Devices []*pluginapi.Device
	Env     map[string]string // the first allocation's
	Allocs  []*pluginapi.ContainerAllocateResponse
}

// pluginRun says how to start gpuslice-plugin: its config file's text,
// extra flags, and how many containers to allocate one device each.
type pluginRun struct {
	config string
	args   []string
	allocs int
}

// timeSliced is the plugin with 4 time-slicing replicas and the memory
// guardrails for resource: its allocation's env is the guardrails env.
var timeSliced = pluginRun{
	config: "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: " + resource + "\n        replicas: 4\n",
	args:   []string{"--memory-guardrails=" + resource},
	allocs: 1,
}

// runPlugin starts gpuslice-plugin on the real GPU as run says, registered
// with a kubelet of our own, and asks it, as the kubelet would, for its
// devices and for the allocations. The env is the plugin's own: whatever
// names it sets today, test-gpu gives the pods those.
func runPlugin(ctx context.Context, bin, dir, podResourcesSocket string, run pluginRun, logf *os.File) (*pluginResult, error) {
	sockDir, err := os.MkdirTemp("", "tgdp")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(sockDir)
	lis, err := net.Listen("unix", filepath.Join(sockDir, "kubelet.sock"))
	if err != nil {
		return nil, err
	}
	reg := &registrar{endpoints: make(chan string, 4)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, reg)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	config, err := os.CreateTemp(dir, "plugin-config-*.yaml")
	if err != nil {
		return nil, err
	}
	_, err = config.WriteString(run.config)
	if cerr := config.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	args := append([]string{"--gpu.backend=nvml", "--device-plugin.path=" + sockDir,
		"--kubelet.pod-resources-socket=" + podResourcesSocket, "--config-file=" + config.Name(),
		"--web.listen-address=127.0.0.1:0", "--node-name=" + nodeName}, run.args...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	var endpoint string
	select {
	case endpoint = <-reg.endpoints:
	case <-ctx.Done():
		return nil, fmt.Errorf("gpuslice-plugin did not register within 60 s (log: %s)", logf.Name())
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(sockDir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		return nil, fmt.Errorf("ListAndWatch: %w", err)
	}
	list, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("ListAndWatch: %w", err)
	}
	res := &pluginResult{Devices: list.Devices, Env: map[string]string{}}
	if len(list.Devices) < run.allocs {
		return res, nil
	}
	req := &pluginapi.AllocateRequest{}
	for i := range run.allocs {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: []string{list.Devices[i].ID}})
	}
	resp, err := client.Allocate(ctx, req)
	if err != nil {
		return res, fmt.Errorf("the kubelet's Allocate call: %w", err)
	}
	res.Allocs = resp.ContainerResponses
	if len(res.Allocs) > 0 {
		res.Env = res.Allocs[0].Envs
	}
	return res, nil
}

// envList turns an env map into KEY=VALUE entries, dropping the variables
// that name devices (the test's processes see the whole GPU anyway).
func envList(env map[string]string, drop ...string) []string {
	var out []string
	for k, v := range env {
		keep := true
		for _, d := range drop {
			keep = keep && k != d
		}
		if keep {
			out = append(out, k+"="+v)
		}
	}
	return out
}

package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
	"github.com/gpuslice/gpuslice/internal/plugin"
)

func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("GPUSLICE_PREFERRED_ALLOCATION", "packed")
	t.Setenv("GPUSLICE_CONFIG_SOURCE", "kubernetes")
	o, err := parseFlags([]string{"--config.source=file"})
	if err != nil {
		t.Fatal(err)
	}
	if o.policy != "packed" || o.source != "file" {
		t.Errorf("policy %q source %q: want packed from the environment and file from the command line", o.policy, o.source)
	}
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--preferred-allocation=random"}, "--preferred-allocation"},
		{[]string{"--memory-guardrails=gpu"}, `--memory-guardrails: memory guardrails: "gpu" is not a resource name`},
		{[]string{"--config.source=etcd"}, `unknown --config.source "etcd"`},
		{[]string{"--config.source=kubernetes", "--config.configmap=cfg"}, "want <namespace>/<name>"},
		{[]string{"--config.source=kubernetes", "--config.configmap=gpu/cfg", "--node-name="}, "needs --node-name"},
		{[]string{"--gpu.backend=sim"}, "needs --sim.file"},
		{[]string{"--health.interval=-5s"}, "--health.interval=-5s: must not be negative"},
		{[]string{"--health.recovery-interval=-1m"}, "--health.recovery-interval=-1m0s: must not be negative"},
		{[]string{"--kubelet.pod-resources-interval=-1s"}, "--kubelet.pod-resources-interval=-1s: must not be negative"},
	} {
		err := run(t.Context(), tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// registrar is the least of a kubelet: it accepts registrations and reads
// the first device list of each plugin.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	dir   string
	lists chan []*pluginapi.Device
}

func (r *registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	go func() {
		conn, err := grpc.NewClient("unix://"+filepath.Join(r.dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return
		}
		defer conn.Close()
		stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(context.Background(), &pluginapi.Empty{}, grpc.WaitForReady(true))
		if err != nil {
			return
		}
		if resp, err := stream.Recv(); err == nil {
			r.lists <- resp.Devices
		}
	}()
	return &pluginapi.Empty{}, nil
}

// TestRunOnSimulatedNode runs the whole program on the simulated node with a
// config file, registers with a minimal kubelet, and reads its metrics.
func TestRunOnSimulatedNode(t *testing.T) {
	dir, err := os.MkdirTemp("", "gspm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	reg := &registrar{dir: dir, lists: make(chan []*pluginapi.Device, 4)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, reg)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	simFile := filepath.Join(t.TempDir(), "node.yaml")
	gputest.WriteSimFile(t, simFile, gputest.GPU(gputest.UUID(0), gputest.A6000MemoryBytes))
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := port.Addr().String()
	port.Close()

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--gpu.backend=sim", "--sim.file=" + simFile, "--config-file=" + cfg,
			"--device-plugin.path=" + dir, "--kubelet.pod-resources-socket=", "--web.listen-address=" + addr, "--log.level=warn"}, t.Output())
	}()
	select {
	case devs := <-reg.lists:
		if len(devs) != 5 {
			t.Errorf("first list has %d devices, want 5: %v", len(devs), devs)
		}
	case err := <-done:
		t.Fatalf("run returned early: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("no registration within 20 s")
	}

	var body string
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(body, "gpuslice_plugin_replicas{") && time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
		}
		if !strings.Contains(body, "gpuslice_plugin_replicas{") {
			time.Sleep(20 * time.Millisecond) // polling an HTTP server that is starting
		}
	}
	if !strings.Contains(body, `gpuslice_plugin_replicas{resource="nvidia.com/gpu",uuid="`+gputest.UUID(0)+`"} 5`) {
		t.Errorf("metrics lack the replicas gauge:\n%s", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not stop")
	}
	if _, err := os.Stat(filepath.Join(dir, "gpuslice-nvidia.com-gpu.sock")); !os.IsNotExist(err) {
		t.Errorf("socket left behind after shutdown: %v", err)
	}
}

// syncBuffer collects the program's log while it runs.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestMetricsPortTaken: a metrics server that cannot listen stops the
// program with an error naming the address, and says so in the log,
// rather than leaving a plugin running that nobody can see.
func TestMetricsPortTaken(t *testing.T) {
	dir, err := os.MkdirTemp("", "gspm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	simFile := filepath.Join(t.TempDir(), "node.yaml")
	gputest.WriteSimFile(t, simFile, gputest.GPU(gputest.UUID(0), gputest.A6000MemoryBytes))
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { taken.Close() })
	addr := taken.Addr().String()

	var logs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(t.Context(), []string{"--gpu.backend=sim", "--sim.file=" + simFile, "--device-plugin.path=" + dir,
			"--kubelet.pod-resources-socket=", "--web.listen-address=" + addr}, &logs)
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), addr) {
			t.Errorf("run = %v, want an error naming %s", err, addr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run still running 20 s after its metrics server failed")
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, addr) {
		t.Errorf("the log does not report the failing metrics server on %s:\n%s", addr, l)
	}
}

// TestConfigFileSourceLogsAsConfigured: the config-file source's warnings
// (a directory it cannot watch) go through the logger --log.level and
// --log.format set, not the process default.
func TestConfigFileSourceLogsAsConfigured(t *testing.T) {
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	src, err := configSource(&options{source: "file", configFile: "/etc/gpuslice/config.yaml"}, log)
	if err != nil {
		t.Fatal(err)
	}
	if fs, ok := src.(*plugin.FileSource); !ok || fs.Logger != log {
		t.Errorf("config source %#v, want a FileSource with the configured logger", src)
	}
}

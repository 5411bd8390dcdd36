package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/testproc"
)

func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("GPUSLICE_WEB_LISTEN_ADDRESS", "127.0.0.1:1")
	t.Setenv("GPUSLICE_GPU_BACKEND", "sim")
	t.Setenv("NODE_NAME", "n1")
	t.Setenv("NODE_IP", "10.1.2.3")
	o, err := parseFlags([]string{"--gpu.backend=nvml"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.web.ListenAddresses, []string{"127.0.0.1:1"}) || o.backend != "nvml" || o.nodeName != "n1" || o.kubeletURL != "https://10.1.2.3:10250" {
		t.Fatalf("got %+v", o)
	}
}

// TestNoNVML: on a machine without the NVIDIA driver the nvml backend does
// not crash (any NVML call after the failed Init would) and the exporter
// does not exit into a crash loop: it serves, with the gpu collector
// failing, and stays healthy, since a restart cannot give it NVML.
func TestNoNVML(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this machine has an NVIDIA driver")
	}
	addr := testproc.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--gpu.backend=nvml", "--web.listen-address=" + addr, "--pods.source=none",
			"--kubelet.pod-resources-socket=", "--oom.disable", "--healthz.gpu-failure-threshold=1", "--log.level=error"})
	}()
	get := func(path string) (int, string) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := http.Get("http://" + addr + path)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return resp.StatusCode, string(body)
			}
			select {
			case err := <-done:
				t.Fatalf("exporter exited: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s: %v", path, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, `gpuslice_exporter_collect_success{collector="gpu"} 0`) {
		t.Errorf("/metrics without NVML: %d, want 200 with the gpu collector failing:\n%s", code, body)
	}
	for range 3 {
		if code, body := get("/healthz"); code != http.StatusOK {
			t.Errorf("/healthz of an exporter that never had NVML: %d %s", code, body)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run after shutdown: %v", err)
	}
}

func TestBadThreshold(t *testing.T) {
	if _, err := parseFlags([]string{"--healthz.gpu-failure-threshold=-1"}); err == nil || !strings.Contains(err.Error(), "--healthz.gpu-failure-threshold=-1") {
		t.Errorf("parseFlags: %v, want an error naming the flag", err)
	}
	t.Setenv("GPUSLICE_HEALTHZ_GPU_FAILURE_THRESHOLD", "7")
	if o, err := parseFlags(nil); err != nil || o.gpuFailureThreshold != 7 {
		t.Errorf("from the environment: %+v, %v; want 7", o, err)
	}
}

func TestBadInputIsNamed(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--gpu.backend=cuda"}, `unknown --gpu.backend "cuda"`},
		{[]string{"--gpu.backend=sim"}, "needs --sim.file"},
		{[]string{"--gpu.backend=sim", "--sim.file=x", "--pods.source=etcd"}, `unknown --pods.source "etcd"`},
		{[]string{"--gpu.backend=sim", "--sim.file=x", "--pods.source=none", "--oom.pattern=("}, `invalid OOM pattern 0 "("`},
		{[]string{"--log.level=loud"}, "--log.level"},
		{[]string{"--oom.max-read-bytes=-5"}, "--oom.max-read-bytes=-5: must not be negative"},
		{[]string{"--oom.scan-interval=-1s"}, "--oom.scan-interval=-1s: must not be negative"},
		{[]string{"--kubelet.pods-interval=-10s"}, "--kubelet.pods-interval=-10s: must not be negative"},
		{[]string{"--gpu.backend=sim", "--sim.file=x", "--pods.source=apiserver", "--kubeconfig=/nonexistent/kubeconfig"}, "/nonexistent/kubeconfig"},
	} {
		err := run(context.Background(), tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%v) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// TestPprofOnlyWhenAsked: Go's profiles are served with --web.enable-pprof
// only; they show the program's internals.
func TestPprofOnlyWhenAsked(t *testing.T) {
	for _, on := range []bool{false, true} {
		h := extraHandlers(nil, on)
		_, profile := h["/debug/pprof/profile"]
		_, index := h["/debug/pprof/"]
		if profile != on || index != on {
			t.Errorf("--web.enable-pprof=%v: profile served %v, index %v", on, profile, index)
		}
	}
}

// TestFlagsRefused: a stray argument and a metrics path the mux cannot
// serve are errors naming them, not a panic or a silently ignored word.
func TestFlagsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--gpu.backend=sim", "extra"},
		{"--web.telemetry-path=metrics"},
		{"--web.telemetry-path=/healthz"},
		{"--web.telemetry-path="},
	} {
		_, err := parseFlags(args)
		if err == nil {
			t.Errorf("%q: no error", args)
			continue
		}
		last := args[len(args)-1]
		if name, _, _ := strings.Cut(strings.TrimPrefix(last, "--"), "="); !strings.Contains(err.Error(), name) {
			t.Errorf("%q: %v does not name %s", args, err, name)
		}
	}
}

// TestServesWhileSourcesHang: with a kubelet (--pods.source=kubelet) or
// an API server (DRA discovery) that accepts and never answers, /metrics
// answers while the first request there still waits: the port is not held
// closed for the client's timeout.
func TestServesWhileSourcesHang(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this machine has an NVIDIA driver")
	}
	dir := t.TempDir()
	token := dir + "/token"
	if err := os.WriteFile(token, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args func(url string) []string
	}{
		{"kubelet pods", func(url string) []string {
			return []string{"--pods.source=kubelet", "--kubelet.url=https://" + url, "--kubelet.token-file=" + token,
				"--kubelet.insecure-skip-tls-verify", "--dra.resource-slices=false"}
		}},
		{"DRA discovery", func(url string) []string {
			kc := dir + "/kubeconfig"
			cfg := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"http://" + url + "\"}}]\n" +
				"users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
			if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{"--pods.source=none", "--kubeconfig=" + kc, "--node-name=n1", "--dra.resource-slices=true",
				"--kubelet.pod-resources-socket=" + dir + "/kubelet.sock"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hung, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer hung.Close()
			// The first connection is held open, unanswered, until the
			// client closes it; closed says when.
			closed := make(chan struct{})
			go func() {
				c, err := hung.Accept()
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, c)
				close(closed)
			}()
			addr := testproc.FreeAddr(t)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			args := append([]string{"--gpu.backend=nvml", "--web.listen-address=" + addr, "--kubelet.pod-resources-socket=",
				"--oom.disable", "--log.level=error"}, tc.args(hung.Addr().String())...)
			go func() { done <- run(ctx, args) }()
			deadline := time.Now().Add(30 * time.Second)
			for {
				resp, err := http.Get("http://" + addr + "/metrics")
				if err == nil {
					resp.Body.Close()
					break
				}
				select {
				case err := <-done:
					t.Fatalf("exporter exited: %v", err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("GET /metrics: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			select {
			case <-closed:
				t.Error("/metrics answered only after the hung request gave up")
			default:
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run after shutdown: %v", err)
			}
		})
	}
}

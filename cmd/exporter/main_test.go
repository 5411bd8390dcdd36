package main

import (
	"context"
	"os"
	"strings"
	"testing"
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
	if o.listen != "127.0.0.1:1" || o.backend != "nvml" || o.nodeName != "n1" || o.kubeletURL != "https://10.1.2.3:10250" {
		t.Fatalf("got %+v", o)
	}
}

// TestNoNVML: on a machine without the NVIDIA driver the nvml backend gives
// a clear error rather than a crash.
func TestNoNVML(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this machine has an NVIDIA driver")
	}
	err := run(context.Background(), []string{"--gpu.backend=nvml"})
	if err == nil || !strings.Contains(err.Error(), "nvml init") {
		t.Fatalf("run = %v, want an nvml init error", err)
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
		{[]string{"--gpu.backend=sim", "--sim.file=x", "--pods.source=none", "--oom.pattern=("}, "("},
		{[]string{"--log.level=loud"}, "--log.level"},
		{[]string{"--gpu.backend=sim", "--sim.file=x", "--pods.source=apiserver", "--kubeconfig=/nonexistent/kubeconfig"}, "/nonexistent/kubeconfig"},
	} {
		err := run(context.Background(), tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%v) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

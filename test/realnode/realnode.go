// Package realnode runs a REAL Kubernetes node on this machine for tests:
// Debian's containerd + runc and a kubelet v1.37.1 built from
// k8s.io/kubernetes, joined to a real etcd, kube-apiserver, kube-scheduler and
// kube-controller-manager (scripts/up.sh and scripts/down.sh, which also run
// by hand). Only the GPU is simulated: test/simgpu's driver serves the
// simulated GPUs on /run/gpuslice-sim, which the fake-CUDA pods mount, and
// test/libnvml answers NVML from the file the driver writes.
//
// The kubelet's ports and its device-plugin directory are fixed, so there is
// one node per machine: Up takes an exclusive lock (waiting for another test
// binary that holds it) and starts from a clean slate; Down stops every
// process up.sh started, by PID, removes the pods, mounts and cgroups, and
// releases the lock.
package realnode

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpuslice/gpuslice/internal/testproc"
)

// LockFile serialises the node between test binaries on one machine.
const LockFile = "/run/lock/gpuslice-realnode.lock"

// Node is a running real node and its control plane.
type Node struct {
	Name             string
	Kubeconfig       string // cluster-admin
	ContainerdSock   string
	PodResourcesSock string
	DevicePluginDir  string
	PodLogsDir       string
	KubeletRootDir   string
	LogsDir          string // logs of the node's processes (kubelet.log, containerd.log, …)
	// CDISpecDir and CDIRuntimeHandler are where CDI specs go and the
	// runtime handler that applies them (NVIDIA's container runtime in CDI
	// mode); NVIDIARuntimeHandler is the handler k3s names nvidia, here the
	// same runtime (see scripts/up.sh). All empty when that runtime is not
	// built.
	CDISpecDir           string
	CDIRuntimeHandler    string
	NVIDIARuntimeHandler string

	Config *rest.Config
	Client kubernetes.Interface

	repo    string
	binDir  string
	upEnv   []string
	env     map[string]string
	lock    *os.File
	scripts string
}

// Repo is the root of this checkout.
func Repo() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Up starts the node. binDir holds kube-apiserver, kube-scheduler,
// kube-controller-manager, kubelet (and etcd, else /usr/bin/etcd):
// hack/test-bins.sh builds them. extraEnv goes to up.sh (e.g.
// NODE_STATUS_UPDATE_FREQUENCY=10s).
func Up(ctx context.Context, binDir string, extraEnv ...string) (*Node, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("realnode: a real kubelet and containerd need root (running as uid %d)", os.Geteuid())
	}
	for _, b := range []string{"kube-apiserver", "kubelet"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return nil, fmt.Errorf("realnode: %s not in %s (run `make test-bins`): %w", b, binDir, err)
		}
	}
	n := &Node{repo: Repo(), binDir: binDir, upEnv: extraEnv}
	n.scripts = filepath.Join(n.repo, "test", "realnode", "scripts")
	// up.sh gives the node its nvidia-cdi and nvidia runtime handlers only
	// when NVIDIA's runtime is in binDir as it runs, and `make test` builds
	// that in the background while the suite starts: build it here, or wait
	// for the build in progress (the script's lock), so the node never comes
	// up without them on a cold machine. A failed build is reported and the
	// node comes up without the handlers; the tests that need them fail.
	nv := exec.CommandContext(ctx, "bash", filepath.Join(n.repo, "hack", "nvidia-bins.sh"))
	nv.Env = append(os.Environ(), "GPUSLICE_ASSETS="+binDir)
	if out, err := nv.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "realnode: hack/nvidia-bins.sh failed, the node has no NVIDIA runtime: %v\n%s\n", err, testproc.Tail(string(out), 20))
	}
	if err := n.takeLock(ctx); err != nil {
		return nil, err
	}
	// A node left by a test binary that was killed: start clean, etcd
	// included (a Node object kept from an earlier run keeps its old
	// extended resources in status until a device plugin registers again).
	if out, err := n.script(ctx, "down.sh", []string{"--purge"}, nil); err != nil {
		n.unlock()
		return nil, fmt.Errorf("realnode: cleaning up a previous node: %w\n%s", err, out)
	}
	out, err := n.script(ctx, "up.sh", []string{binDir}, extraEnv)
	if err != nil {
		upLog := testproc.Tail(readFile(filepath.Join(rnDir(), "up.log")), 40)
		_, _ = n.script(context.Background(), "down.sh", []string{"--purge"}, nil)
		n.unlock()
		return nil, fmt.Errorf("realnode: up.sh: %w\n%s\n--- up.log ---\n%s", err, out, upLog)
	}
	n.env = parseEnv(out)
	n.Name = n.env["NODE_NAME"]
	n.Kubeconfig = n.env["KUBECONFIG"]
	n.ContainerdSock = n.env["CONTAINERD_SOCK"]
	n.PodResourcesSock = n.env["POD_RESOURCES_SOCK"]
	n.DevicePluginDir = n.env["DEVICE_PLUGIN_DIR"]
	n.PodLogsDir = n.env["POD_LOGS_DIR"]
	n.KubeletRootDir = n.env["KUBELET_ROOT_DIR"]
	n.LogsDir = n.env["LOGS"]
	n.CDISpecDir, n.CDIRuntimeHandler = n.env["CDI_SPEC_DIR"], n.env["CDI_RUNTIME_HANDLER"]
	n.NVIDIARuntimeHandler = n.env["NVIDIA_RUNTIME_HANDLER"]
	if n.Kubeconfig == "" || n.Name == "" {
		n.Down()
		return nil, fmt.Errorf("realnode: up.sh printed no KUBECONFIG/NODE_NAME:\n%s", out)
	}
	if n.Config, err = clientcmd.BuildConfigFromFlags("", n.Kubeconfig); err != nil {
		n.Down()
		return nil, fmt.Errorf("realnode: %w", err)
	}
	n.Config.QPS, n.Config.Burst = 100, 200
	if n.Client, err = kubernetes.NewForConfig(n.Config); err != nil {
		n.Down()
		return nil, fmt.Errorf("realnode: %w", err)
	}
	return n, nil
}

// Down stops the node and removes what it left (etcd's data and the images
// too), then releases the lock.
func (n *Node) Down() error {
	defer n.unlock()
	out, err := n.script(context.Background(), "down.sh", []string{"--purge"}, nil)
	if err != nil {
		return fmt.Errorf("realnode: down.sh: %w\n%s", err, out)
	}
	return nil
}

// KubeletLog is the kubelet's log so far.
func (n *Node) KubeletLog() string { return readFile(filepath.Join(n.LogsDir, "kubelet.log")) }

// ImportImage builds a one-layer image from files on this machine (each
// "SRC=DEST") with no registry, and imports it into the node's containerd.
// Pods use it with imagePullPolicy: Never.
func (n *Node) ImportImage(ctx context.Context, tag, entrypoint string, files ...string) error {
	tar := filepath.Join(rnDir(), "images", strings.NewReplacer("/", "_", ":", "_").Replace(tag)+".tar")
	args := append([]string{"-o", tar, "-tag", tag, "-entrypoint", entrypoint}, files...)
	if out, err := exec.CommandContext(ctx, filepath.Join(n.repo, ".cache", "realnode", "bin", "mkimage"), args...).CombinedOutput(); err != nil {
		return fmt.Errorf("realnode: mkimage %s: %w\n%s", tag, err, out)
	}
	if out, err := exec.CommandContext(ctx, "ctr", "--address", n.ContainerdSock, "-n", "k8s.io", "images", "import", tar).CombinedOutput(); err != nil {
		return fmt.Errorf("realnode: importing %s: %w\n%s", tag, err, out)
	}
	return nil
}

// ImportImageWithLibs is ImportImage for dynamically linked programs and
// libraries: the shared libraries each "SRC=DEST" file needs (as ldd
// resolves them on this machine: libc, the dynamic loader, …) are added at
// the same paths, so the image needs no base.
func (n *Node) ImportImageWithLibs(ctx context.Context, tag, entrypoint string, files ...string) error {
	seen := map[string]bool{}
	for _, f := range files {
		seen[strings.SplitN(f, "=", 2)[1]] = true
	}
	all := append([]string(nil), files...)
	for _, f := range files {
		src := strings.SplitN(f, "=", 2)[0]
		libs, err := sharedLibs(ctx, src)
		if err != nil {
			return err
		}
		for _, l := range libs {
			if !seen[l] {
				seen[l] = true
				all = append(all, l+"="+l)
			}
		}
	}
	return n.ImportImage(ctx, tag, entrypoint, all...)
}

// sharedLibs lists the absolute paths of the shared libraries ldd resolves
// for a file (none for a static one), with symlinks resolved to the file
// they name so that the image holds real files.
func sharedLibs(ctx context.Context, file string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", file).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("realnode: ldd %s: %w\n%s", file, err, out)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				libs = append(libs, f)
				if real, err := filepath.EvalSymlinks(f); err == nil && real != f {
					libs = append(libs, real)
				}
			}
		}
		if strings.Contains(line, "not found") {
			return nil, fmt.Errorf("realnode: %s: %s", file, strings.TrimSpace(line))
		}
	}
	return libs, nil
}

// RestartKubelet stops the kubelet and starts it again with the same
// configuration (up.sh keeps what runs and starts what is missing).
func (n *Node) RestartKubelet(ctx context.Context) error {
	pidFile := filepath.Join(rnDir(), "run", "kubelet.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return fmt.Errorf("realnode: %w", err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		return fmt.Errorf("realnode: %s: %w", pidFile, err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("realnode: stopping the kubelet (pid %d): %w", pid, err)
	}
	for deadline := time.Now().Add(20 * time.Second); syscall.Kill(pid, 0) == nil; {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, err := n.script(ctx, "up.sh", []string{n.binDir}, n.upEnv); err != nil {
		return fmt.Errorf("realnode: restarting the kubelet: %w\n%s", err, out)
	}
	return nil
}

func rnDir() string {
	if d := os.Getenv("RN_DIR"); d != "" {
		return d
	}
	return "/tmp/gpuslice-realnode"
}

// script runs scripts/NAME with args and extra environment.
func (n *Node) script(ctx context.Context, name string, args, env []string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(n.scripts, name)}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

func (n *Node) takeLock(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(LockFile), 0o755); err != nil {
		return fmt.Errorf("realnode: %w", err)
	}
	f, err := os.OpenFile(LockFile, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("realnode: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			n.lock = f
			return nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return fmt.Errorf("realnode: another test run holds %s: %w", LockFile, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (n *Node) unlock() {
	if n.lock != nil {
		_ = syscall.Flock(int(n.lock.Fd()), syscall.LOCK_UN)
		n.lock.Close()
		n.lock = nil
	}
}

func parseEnv(out string) map[string]string {
	env := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	return env
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

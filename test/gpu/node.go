package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/podresources/podresourcestest"
)

const (
	namespace = "test-gpu"
	resource  = "nvidia.com/gpu"
	nodeName  = "test-gpu-node"
	qos       = "besteffort"
)

// node plays the kubelet for real processes: each pod's one container is
// a process placed in the cgroup the systemd driver would give it, its
// output written as the CRI log the kubelet keeps, its replica ID served
// over PodResources, the pod over /pods.
type node struct {
	dir, cgroupRoot, podLogs string
	python, workload         string
	uuid                     string // the GPU every pod gets a replica of
	pr                       *podresourcestest.Server
	httpAddr                 string

	mu   sync.Mutex
	pods []*pod
	next int // next replica number
}

// pod is one pod with one container running one process (or none).
type pod struct {
	Name, UID, Container, ContainerID string
	ReplicaID                         string
	cgroup, logFile                   string
	cmd                               *exec.Cmd
	done                              chan struct{}
	exitCode                          int
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newUID() string {
	h := randomHex(16)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// startNode serves PodResources and /pods until ctx ends.
func startNode(ctx context.Context, dir, uuid, python, workload string) (*node, error) {
	n := &node{dir: dir, cgroupRoot: "/sys/fs/cgroup", podLogs: filepath.Join(dir, "pods"), python: python, workload: workload, uuid: uuid}
	sock, err := os.MkdirTemp("", "tgpu")
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, func() { _ = os.RemoveAll(sock) })
	if n.pr, err = podresourcestest.Serve(ctx, filepath.Join(sock, "kubelet.sock")); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	n.httpAddr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.HandleFunc("/pods", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(n.podList())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	n.sync()
	return n, nil
}

func (n *node) podResourcesSocket() string { return n.pr.Path() }
func (n *node) kubeletURL() string         { return "http://" + n.httpAddr }

// sync tells the fake kubelet the pods and the GPU's replica IDs.
func (n *node) sync() {
	n.mu.Lock()
	defer n.mu.Unlock()
	var allocs []podresources.Allocation
	for _, p := range n.pods {
		allocs = append(allocs, podresources.Allocation{Namespace: namespace, Pod: p.Name, Container: p.Container, Resource: resource, DeviceIDs: []string{p.ReplicaID}})
	}
	ids := make([]string, max(n.next, 4))
	for i := range ids {
		ids[i] = n.uuid + "::" + strconv.Itoa(i)
	}
	n.pr.SetPods(allocs)
	n.pr.SetAllocatable([]podresources.Allocatable{{Resource: resource, DeviceIDs: ids}})
}

func (n *node) podList() corev1.PodList {
	n.mu.Lock()
	defer n.mu.Unlock()
	list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
	for _, p := range n.pods {
		list.Items = append(list.Items, corev1.Pod{
			TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: p.Name, UID: types.UID(p.UID)},
			Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: p.Container, Image: "test-gpu/" + p.Container}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
				Name: p.Container, ContainerID: "containerd://" + p.ContainerID, Ready: true,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			}}},
		})
	}
	return list
}

// addPod adds a pod holding the next replica ID; args, when given, run as
// its container's process (workload.py's arguments), with env added.
func (n *node) addPod(name string, env []string, args ...string) (*pod, error) {
	n.mu.Lock()
	p := &pod{Name: name, UID: newUID(), Container: "main", ContainerID: randomHex(32), ReplicaID: n.uuid + "::" + strconv.Itoa(n.next), done: make(chan struct{})}
	n.next++
	n.pods = append(n.pods, p)
	n.mu.Unlock()
	p.cgroup = cgroupDir(n.cgroupRoot, qos, p.UID, p.ContainerID)
	p.logFile = filepath.Join(n.podLogs, namespace+"_"+p.Name+"_"+p.UID, p.Container, "0.log")
	if err := os.MkdirAll(filepath.Dir(p.logFile), 0o755); err != nil {
		return nil, err
	}
	n.sync()
	if len(args) == 0 {
		close(p.done)
		return p, nil
	}
	if err := os.MkdirAll(p.cgroup, 0o755); err != nil {
		return nil, fmt.Errorf("pod cgroup: %w", err)
	}
	return p, n.run(p, env, args)
}

// run starts p's process inside its cgroup: a shell moves itself there,
// then becomes python, so that no CUDA context is made outside the pod.
func (n *node) run(p *pod, env []string, args []string) error {
	argv := append([]string{"-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, p.cgroup, n.python, n.workload}, args...)
	p.cmd = exec.Command("/bin/sh", argv...)
	// On a machine with several GPUs, CUDA's device 0 is the fastest, not
	// nvidia-smi's first: every pod runs on the GPU under test (a pod's own
	// env, after, may say otherwise).
	p.cmd.Env = append(append(os.Environ(), "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES="+n.uuid), env...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	log, err := os.OpenFile(p.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	stdout, _ := p.cmd.StdoutPipe()
	stderr, _ := p.cmd.StderrPipe()
	if err := p.cmd.Start(); err != nil {
		log.Close()
		return err
	}
	var copying sync.WaitGroup
	for stream, r := range map[string]io.Reader{"stdout": stdout, "stderr": stderr} {
		copying.Go(func() {
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				mu.Lock()
				_, _ = log.WriteString(criLine(time.Now().UTC().Format(time.RFC3339Nano), stream, sc.Text()))
				mu.Unlock()
			}
		})
	}
	go func() {
		copying.Wait()
		err := p.cmd.Wait()
		log.Close()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			p.exitCode = ee.ExitCode()
		}
		close(p.done)
	}()
	return nil
}

// pid is the pod's process ID (the shell exec'd into python keeps it).
func (p *pod) pid() int {
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// wait waits for p's process to end and returns its exit code; -1 on timeout.
func (p *pod) wait(d time.Duration) int {
	select {
	case <-p.done:
		return p.exitCode
	case <-time.After(d):
		return -1
	}
}

// running reports whether p's process has not ended.
func (p *pod) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *pod) stop() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	p.wait(30 * time.Second)
	if p.cgroup != "" {
		_ = os.Remove(p.cgroup)
	}
}

// removePods stops and forgets every pod.
func (n *node) removePods() {
	n.mu.Lock()
	pods := n.pods
	n.pods = nil
	n.mu.Unlock()
	for _, p := range pods {
		p.stop()
	}
	n.sync()
	// The pod slices, emptied of their scopes, go too.
	dirs, _ := filepath.Glob(filepath.Join(n.cgroupRoot, "kubepods.slice", "kubepods-"+qos+".slice", "kubepods-"+qos+"-pod*.slice"))
	for _, d := range dirs {
		_ = os.Remove(d)
	}
}

// Package simnode is a whole GPU node without a GPU or a kubelet: the sim
// backend's file, a /proc-like tree whose cgroup files place each process in
// its pod, kubelet-style pod log directories, and a fake kubelet serving the
// real PodResources gRPC API on a unix socket and /pods over HTTP. The demo,
// the exporter's integration tests and the end-to-end tests all drive it.
//
// A Node is a plain description; Sync renders it to files and to the fake
// kubelet, so a test changes the node by editing the struct and syncing.
package simnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/internal/gpu/sim"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/podresources/podresourcestest"
)

// GiB is 2^30 bytes.
const GiB = uint64(1) << 30

// A6000Bytes is an RTX A6000's memory as NVML reports it.
const A6000Bytes = 51527024640

// DefaultResource is the resource name the NVIDIA plugin advertises.
const DefaultResource = "nvidia.com/gpu"

// GPU is one simulated GPU.
type GPU struct {
	UUID        string
	Name        string
	MemoryBytes uint64
	// Replicas advertised by the (fake) kubelet; 0 or 1 means unshared.
	Replicas    int
	Resource    string // default DefaultResource
	Utilization float64
	Temperature float64
	PowerWatts  float64
	Xids        []uint64
	// Error makes the GPU fail its readings (an NVML error).
	Error string
	// HostProcesses run outside any pod.
	HostProcesses []Process
}

// Process is a process using a GPU.
type Process struct {
	PID         int
	GPU         string // UUID
	MemoryBytes uint64
	SM          float64
	// MPSServer makes it a CUDA MPS server (sim mpsServer), which lists
	// its GPU's other processes as its clients.
	MPSServer bool
	// Environ is written to <procfs>/<pid>/environ (KEY=value each), as
	// an MPS client's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; none: no file.
	Environ []string
}

// Container is a container of a pod.
type Container struct {
	Name         string
	ID           string // 64 hex; generated when empty
	RestartCount int32
	// Replicas held: GPU UUID → replica numbers (for an unshared GPU, one
	// entry with no numbers means the bare UUID).
	Replicas map[string][]int
	// Claims are the DRA devices the container's ResourceClaims give it,
	// as the kubelet lists them (driver, pool, device).
	Claims    []podresources.ClaimDevice
	Processes []Process
	// LastTermination, when set, is the previous instance's end.
	LastTermination *corev1.ContainerStateTerminated
}

// Pod is a pod on the node.
type Pod struct {
	Namespace, Name, UID string
	Containers           []*Container
}

// Node is the whole simulated node.
type Node struct {
	Name string
	Dir  string // where files go
	// SocketDir holds the PodResources socket; kept short for the 108-byte
	// unix socket path limit.
	SocketDir string
	GPUs      []*GPU
	Pods      []*Pod

	mu       sync.Mutex
	pr       *podresourcestest.Server
	http     *http.Server
	httpAddr string
	podList  []byte
}

// New makes a node whose files live under dir.
func New(name, dir string) (*Node, error) {
	sock, err := os.MkdirTemp("", "gs-kubelet-")
	if err != nil {
		return nil, err
	}
	n := &Node{Name: name, Dir: dir, SocketDir: sock}
	for _, d := range []string{n.Procfs(), n.PodLogs()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// SimFile is the path for --sim.file.
func (n *Node) SimFile() string { return filepath.Join(n.Dir, "sim.yaml") }

// Procfs is the path for --path.procfs.
func (n *Node) Procfs() string { return filepath.Join(n.Dir, "proc") }

// PodLogs is the path for --path.pod-logs.
func (n *Node) PodLogs() string { return filepath.Join(n.Dir, "pods") }

// PodResourcesSocket is the path for --kubelet.pod-resources-socket.
func (n *Node) PodResourcesSocket() string { return filepath.Join(n.SocketDir, "kubelet.sock") }

// KubeletURL is the fake kubelet's HTTP base URL (after Start).
func (n *Node) KubeletURL() string { return "http://" + n.httpAddr }

// Start serves the fake kubelet (PodResources and /pods) until ctx ends,
// after a first Sync.
func (n *Node) Start(ctx context.Context) error {
	pr, err := podresourcestest.Serve(ctx, n.PodResourcesSocket())
	if err != nil {
		return err
	}
	n.pr = pr
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	n.httpAddr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.HandleFunc("/pods", func(w http.ResponseWriter, _ *http.Request) {
		n.mu.Lock()
		body := n.podList
		n.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	n.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = n.http.Serve(ln) }()
	go func() {
		<-ctx.Done()
		_ = n.http.Close()
		_ = os.RemoveAll(n.SocketDir)
	}()
	return n.Sync()
}

// PodResources is the fake PodResources server (nil before Start), for tests
// that stop and restart the kubelet.
func (n *Node) PodResources() *podresourcestest.Server { return n.pr }

// Sync renders the node: the sim file (atomically, since the exporter may
// read it at any moment), cgroup files, log directories, and the fake
// kubelet's answers.
func (n *Node) Sync() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.Pods {
		if p.UID == "" {
			p.UID = uid(p.Namespace + "/" + p.Name)
		}
		for _, c := range p.Containers {
			if c.ID == "" {
				c.ID = containerID(p.UID + "/" + c.Name)
			}
		}
	}
	if err := n.writeSim(); err != nil {
		return err
	}
	if err := n.writeProc(); err != nil {
		return err
	}
	for _, p := range n.Pods {
		for _, c := range p.Containers {
			if err := os.MkdirAll(n.logDir(p, c), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(n.LogFile(p, c), os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			f.Close()
		}
	}
	body, err := json.Marshal(n.podListLocked())
	if err != nil {
		return err
	}
	n.podList = body
	if n.pr != nil {
		n.pr.SetPods(n.allocations())
		n.pr.SetAllocatable(n.allocatable())
	}
	return nil
}

func (n *Node) writeSim() error {
	f := sim.File{}
	for _, g := range n.GPUs {
		sg := sim.GPU{UUID: g.UUID, Name: g.Name, MemoryTotalBytes: g.MemoryBytes, Utilization: g.Utilization,
			TemperatureCelsius: g.Temperature, PowerWatts: g.PowerWatts, Error: g.Error}
		if sg.Name == "" {
			sg.Name = "NVIDIA RTX A6000"
		}
		for _, x := range g.Xids {
			sg.XidEvents = append(sg.XidEvents, sim.XidEvent{Xid: x})
		}
		add := func(p Process) {
			sm := p.SM
			sg.Processes = append(sg.Processes, sim.Process{PID: p.PID, UsedMemoryBytes: p.MemoryBytes, SMUtilization: &sm, MPSServer: p.MPSServer})
		}
		for _, p := range g.HostProcesses {
			add(p)
		}
		for _, pod := range n.Pods {
			for _, c := range pod.Containers {
				for _, p := range c.Processes {
					if p.GPU == g.UUID {
						add(p)
					}
				}
			}
		}
		f.GPUs = append(f.GPUs, sg)
	}
	data, err := yaml.Marshal(f)
	if err != nil {
		return err
	}
	return WriteFileAtomic(n.SimFile(), data)
}

// writeProc writes <procfs>/<pid>/cgroup for every process, as cgroup v2
// with the systemd driver and containerd (the k3s default on current
// distributions); host processes sit in a system service.
func (n *Node) writeProc() error {
	want := map[int]string{}
	environ := map[int][]string{}
	for _, g := range n.GPUs {
		for _, p := range g.HostProcesses {
			want[p.PID] = "0::/system.slice/ollama.service\n"
			environ[p.PID] = p.Environ
		}
	}
	for _, pod := range n.Pods {
		slice := "kubepods-burstable-pod" + strings.ReplaceAll(pod.UID, "-", "_") + ".slice"
		for _, c := range pod.Containers {
			for _, p := range c.Processes {
				want[p.PID] = "0::/kubepods.slice/kubepods-burstable.slice/" + slice + "/cri-containerd-" + c.ID + ".scope\n"
				environ[p.PID] = p.Environ
			}
		}
	}
	entries, err := os.ReadDir(n.Procfs())
	if err != nil {
		return err
	}
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			if _, ok := want[pid]; !ok {
				if err := os.RemoveAll(filepath.Join(n.Procfs(), e.Name())); err != nil {
					return err
				}
			}
		}
	}
	for pid, content := range want {
		dir := filepath.Join(n.Procfs(), strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "stat"), statLine(pid, content), 0o644); err != nil {
			return err
		}
		if env := environ[pid]; len(env) > 0 {
			if err := os.WriteFile(filepath.Join(dir, "environ"), []byte(strings.Join(env, "\x00")+"\x00"), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// statLine is a /proc/<pid>/stat line as the kernel writes it, up to the
// start time (field 22). A PID moved to another container is a new process
// with the same PID, as after PID reuse: its start time changes with its
// cgroup, so readers that cache by (PID, start time) see a new process.
func statLine(pid int, cgroup string) []byte {
	h := fnv.New64a()
	h.Write([]byte(cgroup))
	start := h.Sum64() % 1e9
	return fmt.Appendf(nil, "%d (python3 (gpu)) S 1 %d %d 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 12 0 %d 0 0\n", pid, pid, pid, start)
}

func (n *Node) allocations() []podresources.Allocation {
	var out []podresources.Allocation
	for _, p := range n.Pods {
		for _, c := range p.Containers {
			a := podresources.Allocation{Namespace: p.Namespace, Pod: p.Name, Container: c.Name}
			for _, g := range n.GPUs {
				reps, ok := c.Replicas[g.UUID]
				if !ok {
					continue
				}
				a.Resource = g.resource()
				if len(reps) == 0 {
					a.DeviceIDs = append(a.DeviceIDs, g.UUID)
				}
				for _, r := range reps {
					a.DeviceIDs = append(a.DeviceIDs, podresources.FormatDeviceID(g.UUID, r))
				}
			}
			if len(a.DeviceIDs) > 0 {
				out = append(out, a)
			}
			if len(c.Claims) > 0 {
				out = append(out, podresources.Allocation{Namespace: p.Namespace, Pod: p.Name, Container: c.Name, Claims: c.Claims})
			}
		}
	}
	return out
}

func (n *Node) allocatable() []podresources.Allocatable {
	byRes := map[string]*podresources.Allocatable{}
	var order []string
	for _, g := range n.GPUs {
		r := g.resource()
		a := byRes[r]
		if a == nil {
			a = &podresources.Allocatable{Resource: r}
			byRes[r] = a
			order = append(order, r)
		}
		if g.Replicas <= 1 {
			a.DeviceIDs = append(a.DeviceIDs, g.UUID)
			continue
		}
		for i := 0; i < g.Replicas; i++ {
			a.DeviceIDs = append(a.DeviceIDs, podresources.FormatDeviceID(g.UUID, i))
		}
	}
	out := make([]podresources.Allocatable, 0, len(order))
	for _, r := range order {
		out = append(out, *byRes[r])
	}
	return out
}

func (g *GPU) resource() string {
	if g.Resource == "" {
		return DefaultResource
	}
	return g.Resource
}

// PodObjects returns the pods as the API server or the kubelet shows them.
func (n *Node) PodObjects() []corev1.Pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.podListLocked().Items
}

func (n *Node) podListLocked() corev1.PodList {
	list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
	for _, p := range n.Pods {
		obj := corev1.Pod{
			TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: types.UID(p.UID)},
			Spec:       corev1.PodSpec{NodeName: n.Name},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning},
		}
		for _, c := range p.Containers {
			obj.Spec.Containers = append(obj.Spec.Containers, corev1.Container{Name: c.Name, Image: "example.com/" + c.Name})
			st := corev1.ContainerStatus{
				Name: c.Name, ContainerID: "containerd://" + c.ID, RestartCount: c.RestartCount, Ready: true,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			}
			if c.LastTermination != nil {
				st.LastTerminationState.Terminated = c.LastTermination.DeepCopy()
			}
			obj.Status.ContainerStatuses = append(obj.Status.ContainerStatuses, st)
		}
		list.Items = append(list.Items, obj)
	}
	return list
}

func (n *Node) logDir(p *Pod, c *Container) string {
	return filepath.Join(n.PodLogs(), p.Namespace+"_"+p.Name+"_"+p.UID, c.Name)
}

// LogFile is the current log file of a container (N.log, N its restart
// count), as the kubelet lays it out.
func (n *Node) LogFile(p *Pod, c *Container) string {
	return filepath.Join(n.logDir(p, c), strconv.Itoa(int(c.RestartCount))+".log")
}

// AppendLog writes lines to a container's log in the CRI format the kubelet
// uses (timestamp, stream, F for full lines), stamped now.
func (n *Node) AppendLog(p *Pod, c *Container, lines ...string) error {
	return n.AppendLogAt(time.Now(), p, c, lines...)
}

// AppendLogAt is AppendLog with the log time given.
func (n *Node) AppendLogAt(at time.Time, p *Pod, c *Container, lines ...string) error {
	f, err := os.OpenFile(n.LogFile(p, c), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	var b strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&b, "%s stderr F %s\n", at.UTC().Format(time.RFC3339Nano), l)
	}
	_, err = f.WriteString(b.String())
	return err
}

// Age makes the node look as if its log directories had last changed d
// ago, as on a node that has run a while, for benchmarks of its steady
// state: readers that trust a directory listing only once the directory
// has been still for a moment would otherwise list at every scrape.
func (n *Node) Age(d time.Duration) error {
	then := time.Now().Add(-d)
	return filepath.WalkDir(n.PodLogs(), func(path string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			err = os.Chtimes(path, then, then)
		}
		return err
	})
}

// Pod finds a pod by namespace and name.
func (n *Node) Pod(namespace, name string) (*Pod, error) {
	for _, p := range n.Pods {
		if p.Namespace == namespace && p.Name == name {
			return p, nil
		}
	}
	return nil, errors.New("simnode: no pod " + namespace + "/" + name)
}

// WriteFileAtomic writes data to path through a rename, so a reader never
// sees half a file.
func WriteFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

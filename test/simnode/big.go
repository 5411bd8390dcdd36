package simnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// Scale multiplies the big node. Processes multiplies the GPU processes and,
// with them, the distinct PIDs and the pods that own them, so the per-pod
// shape stays the same; Replicas multiplies the replica IDs each GPU
// advertises. Zero counts as 1.
type Scale struct {
	Processes, Replicas int
}

// Big is the benchmark node: 8 GPUs × 64 processes (440 distinct PIDs,
// some on two GPUs), 110 pods holding replica IDs of GPUs with 16 replicas,
// 500 /proc entries.
func Big(dir string) (*Node, error) { return BigScaled(dir, Scale{}) }

// BigScaled is Big multiplied by s, for benchmarks that show how the
// exporter's cost grows with processes and with replicas.
func BigScaled(dir string, s Scale) (*Node, error) {
	if s.Processes < 0 || s.Replicas < 0 {
		return nil, fmt.Errorf("simnode: negative scale %+v", s)
	}
	p, r := max(s.Processes, 1), max(s.Replicas, 1)
	n, err := New("big", dir)
	if err != nil {
		return nil, err
	}
	const gpus, idle = 8, 60
	perGPU, podsN, pids, replicas := 64*p, 110*p, 440*p, 16*r
	for i := 0; i < gpus; i++ {
		n.GPUs = append(n.GPUs, &GPU{UUID: GPUUUID("big", i), MemoryBytes: A6000Bytes, Replicas: replicas, Utilization: 0.5})
	}
	for i := 0; i < podsN; i++ {
		n.Pods = append(n.Pods, &Pod{Namespace: "ns" + strconv.Itoa(i%7), Name: fmt.Sprintf("pod-%03d", i),
			Containers: []*Container{{Name: "main", Replicas: map[string][]int{}}}})
	}
	for k := 0; k < gpus*perGPU; k++ {
		g := n.GPUs[k/perGPU] // k and k+pids land on different GPUs
		pid := 1000 + k%pids
		c := n.Pods[(pid-1000)%podsN].Containers[0]
		c.Processes = append(c.Processes, Process{PID: pid, GPU: g.UUID, MemoryBytes: uint64(k%8+1) << 26, SM: 0.01})
		if _, ok := c.Replicas[g.UUID]; !ok && len(c.Replicas) < 2 {
			c.Replicas[g.UUID] = []int{k % replicas}
		}
	}
	if err := n.Sync(); err != nil {
		return nil, err
	}
	for pid := 1000 + pids; pid < 1000+pids+idle; pid++ { // idle processes
		dir := filepath.Join(n.Procfs(), strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		const cg = "0::/system.slice/sshd.service\n"
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "stat"), statLine(pid, cg), 0o644); err != nil {
			return nil, err
		}
	}
	return n, nil
}

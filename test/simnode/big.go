package simnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// Big is the benchmark node: 8 GPUs × 64 processes (440 distinct PIDs,
// some on two GPUs), 110 pods holding replica IDs, 500 /proc entries.
func Big(dir string) (*Node, error) {
	n, err := New("big", dir)
	if err != nil {
		return nil, err
	}
	const gpus, perGPU, podsN, pids = 8, 64, 110, 440
	for i := 0; i < gpus; i++ {
		n.GPUs = append(n.GPUs, &GPU{UUID: GPUUUID("big", i), MemoryBytes: A6000Bytes, Replicas: 16, Utilization: 0.5})
	}
	for i := 0; i < podsN; i++ {
		n.Pods = append(n.Pods, &Pod{Namespace: "ns" + strconv.Itoa(i%7), Name: fmt.Sprintf("pod-%03d", i),
			Containers: []*Container{{Name: "main", Replicas: map[string][]int{}}}})
	}
	for k := 0; k < gpus*perGPU; k++ {
		g := n.GPUs[k/perGPU] // k and k+440 land on different GPUs
		pid := 1000 + k%pids
		c := n.Pods[(pid-1000)%podsN].Containers[0]
		c.Processes = append(c.Processes, Process{PID: pid, GPU: g.UUID, MemoryBytes: uint64(k%8+1) << 26, SM: 0.01})
		if _, ok := c.Replicas[g.UUID]; !ok && len(c.Replicas) < 2 {
			c.Replicas[g.UUID] = []int{k % 16}
		}
	}
	if err := n.Sync(); err != nil {
		return nil, err
	}
	for pid := 1000 + pids; pid < 1000+500; pid++ { // idle processes
		dir := filepath.Join(n.Procfs(), strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::/system.slice/sshd.service\n"), 0o644); err != nil {
			return nil, err
		}
	}
	return n, nil
}

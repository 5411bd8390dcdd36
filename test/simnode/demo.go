package simnode

// Demo returns the node the demo and the golden test use: one RTX A6000
// shared four ways as in the homelab this project started from — a YOLO
// detector, RIFE frame interpolation, Real-ESRGAN upscaling and an FFmpeg
// NVENC encoder — plus a host process outside Kubernetes.
func Demo(name, dir string) (*Node, error) {
	n, err := New(name, dir)
	if err != nil {
		return nil, err
	}
	g := GPUUUID(name, 0)
	n.GPUs = []*GPU{{
		UUID: g, Name: "NVIDIA RTX A6000", MemoryBytes: A6000Bytes, Replicas: 4,
		Utilization: 0.71, Temperature: 64, PowerWatts: 212,
		HostProcesses: []Process{{PID: 1201, GPU: g, MemoryBytes: 512 << 20, SM: 0.01}},
	}}
	n.Pods = []*Pod{
		{Namespace: "vision", Name: "yolo-detector-7d9f8", Containers: []*Container{{
			Name: "detector", Replicas: map[string][]int{g: {0}},
			Processes: []Process{{PID: 2101, GPU: g, MemoryBytes: 5 * GiB, SM: 0.22}},
		}}},
		{Namespace: "media", Name: "rife-interp-0", Containers: []*Container{{
			Name: "rife", Replicas: map[string][]int{g: {1}},
			Processes: []Process{{PID: 2201, GPU: g, MemoryBytes: 7 * GiB, SM: 0.31}},
		}}},
		{Namespace: "media", Name: "esrgan-upscale-0", Containers: []*Container{{
			Name: "esrgan", Replicas: map[string][]int{g: {2}},
			Processes: []Process{
				{PID: 2301, GPU: g, MemoryBytes: 4 * GiB, SM: 0.12},
				{PID: 2302, GPU: g, MemoryBytes: 1 * GiB, SM: 0.03},
			},
		}}},
		{Namespace: "media", Name: "ffmpeg-nvenc-0", Containers: []*Container{{
			Name: "ffmpeg", Replicas: map[string][]int{g: {3}},
			Processes: []Process{{PID: 2401, GPU: g, MemoryBytes: 512 << 20, SM: 0.02}},
		}}},
	}
	return n, nil
}

// PyTorchOOM is the log line of a PyTorch CUDA OOM, as PyTorch 2 prints it.
const PyTorchOOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 47.99 GiB of which 1.12 GiB is free. Process 2301 has 44.10 GiB memory in use. Of the allocated memory 41.30 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated."

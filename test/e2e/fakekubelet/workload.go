package fakekubelet

import (
	"fmt"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Annotations a pod carries to say what its GPU containers do once they run.
// They are the workload trace of the end-to-end tests: the kubelet reads them
// when the pod starts and again whenever they change, so a test can change a
// running pod's behaviour with `kubectl annotate`.
const (
	// AnnotationMemory is the GPU memory (a quantity: "6Gi") that each GPU
	// container's process holds on each GPU it was given.
	AnnotationMemory = "e2e.gpuslice.io/memory"
	// AnnotationSM is each GPU process's SM utilization, a ratio in [0, 1].
	AnnotationSM = "e2e.gpuslice.io/sm"
	// AnnotationOOMAfter (a Go duration from the container's start) makes
	// every GPU container log a PyTorch CUDA out-of-memory traceback once.
	// A duration already past when it is set fires at once.
	AnnotationOOMAfter = "e2e.gpuslice.io/oom-after"
	// AnnotationExitAfter (a Go duration from the start) ends the pod's
	// containers: exit code 1 after an OOM, 0 otherwise. Only pods with
	// restartPolicy Never may carry it (restarts are not simulated).
	AnnotationExitAfter = "e2e.gpuslice.io/exit-after"
)

// workload is a pod's parsed annotations. Zero durations mean "never".
type workload struct {
	memory    uint64
	sm        float64
	oomAfter  time.Duration
	exitAfter time.Duration
	hasOOM    bool
	hasExit   bool
}

// parseWorkload reads a pod's annotations; errors name the annotation and
// its value.
func parseWorkload(ann map[string]string) (workload, error) {
	var w workload
	if v, ok := ann[AnnotationMemory]; ok {
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() < 0 {
			return workload{}, fmt.Errorf("annotation %s=%q: want a non-negative quantity such as 6Gi", AnnotationMemory, v)
		}
		w.memory = uint64(q.Value())
	}
	if v, ok := ann[AnnotationSM]; ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			return workload{}, fmt.Errorf("annotation %s=%q: want a ratio between 0 and 1", AnnotationSM, v)
		}
		w.sm = f
	}
	dur := func(key string, dst *time.Duration, has *bool) error {
		v, ok := ann[key]
		if !ok {
			return nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("annotation %s=%q: want a non-negative Go duration such as 3s", key, v)
		}
		*dst, *has = d, true
		return nil
	}
	if err := dur(AnnotationOOMAfter, &w.oomAfter, &w.hasOOM); err != nil {
		return workload{}, err
	}
	if err := dur(AnnotationExitAfter, &w.exitAfter, &w.hasExit); err != nil {
		return workload{}, err
	}
	return w, nil
}

// oomTraceback is what PyTorch prints when its caching allocator cannot get
// memory: the lines a real training container leaves in its log.
func oomTraceback(tried, total, free uint64) []string {
	gib := func(b uint64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }
	return []string{
		"Traceback (most recent call last):",
		`  File "/app/train.py", line 88, in <module>`,
		"    loss = model(batch).loss",
		fmt.Sprintf("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %s. GPU 0 has a total capacity of %s of which %s is free. "+
			"Of the allocated memory %s is allocated by PyTorch. See documentation for Memory Management "+
			"(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)", gib(tried), gib(total), gib(free), gib(tried)),
	}
}

package main

import (
	"fmt"
	"sort"
)

// oomInfo is what a framework knows when its allocation fails.
type oomInfo struct {
	request, held, total, free uint64
	pid                        int
}

// oomMessages print what each framework writes on stderr when the CUDA
// allocation fails, in the framework's own wording (PyTorch 2.x's caching
// allocator, TensorFlow's BFC allocator, XLA under current JAX and under
// jaxlib 0.4, llama.cpp's CUDA backend, CuPy's memory pool, ONNX Runtime's
// CUDA arena, the bare CUDA runtime). The numbers are the simulated GPU's real ones.
var oomMessages = map[string]func(oomInfo) string{
	"pytorch": func(o oomInfo) string {
		return "Traceback (most recent call last):\n" +
			"  File \"/app/train.py\", line 57, in <module>\n" +
			"    batch = torch.empty(n, device=\"cuda\")\n" +
			fmt.Sprintf("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %s. GPU 0 has a total capacity of %s of which %s is free. "+
				"Process %d has %s memory in use. Of the allocated memory %s is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. "+
				"If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "+
				"See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n",
				gib(o.request), gib(o.total), gib(o.free), o.pid, gib(o.held), gib(o.held))
	},
	"tensorflow": func(o oomInfo) string {
		return fmt.Sprintf("2026-11-23 10:00:00.000000: W tensorflow/core/common_runtime/bfc_allocator.cc:479] Allocator (GPU_0_bfc) ran out of memory trying to allocate %s (rounded to %d)requested by op Fill\n", gib(o.request), o.request) +
			fmt.Sprintf("tensorflow.python.framework.errors_impl.ResourceExhaustedError: {{function_node __wrapped__Fill_device_/job:localhost/replica:0/task:0/device:GPU:0}} OOM when allocating tensor with shape[%d] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc [Op:Fill]\n", o.request/4)
	},
	// JAX 0.8 and later (seen with jaxlib 0.11.2): XLA's BFC allocator warns,
	// then the exception names the size in units, the allocator and the
	// device.
	"jax": func(o oomInfo) string {
		return fmt.Sprintf("W1123 10:00:00.000000  %d bfc_allocator.cc:501] Allocator (GPU_0_bfc) ran out of memory trying to allocate %s (rounded to %d)requested by op \n", o.pid, xlaBytes(o.request), o.request) +
			fmt.Sprintf("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate %s with allocator GPU_0_bfc on device 0.\n", xlaBytes(o.request))
	},
	// jaxlib 0.3 to 0.7: the size in bytes, the exception XlaRuntimeError.
	"jax-0.4": func(o oomInfo) string {
		return fmt.Sprintf("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate %d bytes.\n", o.request)
	},
	"llamacpp": func(o oomInfo) string {
		return fmt.Sprintf("ggml_backend_cuda_buffer_type_alloc_buffer: allocating %.2f MiB on device 0: cudaMalloc failed: out of memory\n", float64(o.request)/(1<<20)) +
			"llama_model_load: error loading model: unable to allocate CUDA0 buffer\n"
	},
	"cupy": func(o oomInfo) string {
		return fmt.Sprintf("cupy.cuda.memory.OutOfMemoryError: Out of memory allocating %d bytes (allocated so far: %d bytes).\n", o.request, o.held)
	},
	"onnxruntime": func(o oomInfo) string {
		return fmt.Sprintf("onnxruntime.capi.onnxruntime_pybind11_state.RuntimeException: [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running Conv node. Name:'/conv1/Conv' Status Message: /onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:376 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*, bool, onnxruntime::WaitNotificationFn) Failed to allocate memory for requested buffer of size %d\n", o.request)
	},
	"cuda": func(o oomInfo) string {
		return "RuntimeError: CUDA error: out of memory\n" +
			"CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n"
	},
}

func frameworks() []string {
	out := make([]string, 0, len(oomMessages))
	for k := range oomMessages {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func gib(b uint64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }

func human(b uint64) string {
	switch {
	case b >= 1<<30:
		return gib(b)
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%d B", b)
}

// xlaBytes writes b as tsl's HumanReadableNumBytes does, which XLA uses in
// its allocation errors: "512B" under 1 KiB, else two decimals and KiB,
// MiB, GiB, TiB, PiB or EiB with no space.
func xlaBytes(b uint64) string {
	if b < 1<<10 {
		return fmt.Sprintf("%dB", b)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v, i := float64(b)/(1<<10), 0
	for v >= 1<<10 && i < len(units)-1 {
		v /= 1 << 10
		i++
	}
	return fmt.Sprintf("%.2f%s", v, units[i])
}

package oom

import (
	"strings"
	"testing"
	"time"
)

// jaxForm is one wording JAX or XLA prints about GPU memory, written from
// the format string in the named source (a file of a repository, and the
// versions that print it), with the numbers filled in. oom says whether
// the detector must count it.
type jaxForm struct {
	name, line, source string
	oom                bool
}

// jaxForms are every form of JAX's GPU out-of-memory report found in JAX's
// and XLA's own sources, for the versions still in use, and the look-alikes
// that are no failure of GPU memory.
//
// The exception's name: jaxlib up to 0.7 raises XlaRuntimeError (printed
// as jaxlib.xla_extension.XlaRuntimeError while the class lived in
// xla_extension); jax-ml/jax 92f5dcba89 (first in jax 0.8.0) renamed it
// JaxRuntimeError, printed as jax.errors.JaxRuntimeError (jaxlib/jax.cc,
// jax/errors.py); jax 0.4.34 had added jax.errors.JaxRuntimeError as an
// alias only. The status code is printed "RESOURCE_EXHAUSTED: " by
// absl::Status, "Resource exhausted: " by the TensorFlow Status XLA used
// before (jaxlib 0.1 to 0.3). The patterns match the message after both.
var jaxForms = []jaxForm{
	// openxla/xla xla/stream_executor/integrations/tf_allocator_adapter.cc
	// (before: tensorflow/tensorflow tensorflow/stream_executor/
	// tf_allocator_adapter.cc), TfAllocatorAdapter::Allocate /
	// MemoryAllocationError: the size as "N bytes.", the wording of every
	// stored revision up to 2025 (jax-ml/jax#13428 in 2022,
	// flatironinstitute/nemos#345 in 2025).
	{"bytes, XlaRuntimeError", "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.", "openxla/xla tf_allocator_adapter.cc; the exception's name up to jaxlib 0.7", true},
	{"bytes, old status text", "RuntimeError: Resource exhausted: Out of memory while trying to allocate 4294967296 bytes.", "tensorflow/tensorflow tensorflow/stream_executor/tf_allocator_adapter.cc, jaxlib 0.1 to 0.3", true},
	{"bytes, JaxRuntimeError", "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.", "openxla/xla tf_allocator_adapter.cc; jax-ml/jax jaxlib/jax.cc, jax 0.8+", true},
	// The same function in a later stored revision (2026): the size by
	// tsl's HumanReadableNumBytes ("%lldB" under 1 KiB, else "%.2f" and
	// KiB, MiB, GiB, TiB, PiB, EiB), then ".".
	{"units", "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 400.00GiB.", "openxla/xla tf_allocator_adapter.cc MemoryAllocationError with HumanReadableNumBytes", true},
	{"units, under 1 KiB", "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 512B.", "openxla/xla tf_allocator_adapter.cc; tsl/platform/numbers.cc HumanReadableNumBytes", true},
	{"units, KiB", "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.50KiB.", "tsl/platform/numbers.cc HumanReadableNumBytes", true},
	{"units, TiB", "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.25TiB.", "tsl/platform/numbers.cc HumanReadableNumBytes", true},
	// jaxlib 0.11.2 on an H200 (gpuslice issue 22): units, then the
	// allocator and the device. The XLA revision that words it so is not
	// in the stored snapshots of openxla/xla; the line is as seen.
	{"units with allocator, jax 0.11", "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 400.00GiB with allocator GPU_0_bfc on device 0.", "jaxlib 0.11.2, seen on a real H200 (issue 22)", true},
	// The host variant of the same function: pinned host memory, no GPU
	// OOM (XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB names the host pool).
	{"host memory, bytes", "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of host memory while trying to allocate 68719476736 bytes. Please set the environment variable XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB to allocate larger host memory than the default 64 GB.", "openxla/xla tf_allocator_adapter.cc MemoryAllocationError(is_host_mem)", false},
	{"host memory, units", "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of host memory while trying to allocate 64.00GiB. Please set the environment variable XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB to allocate larger host memory than the default 64 GB.", "openxla/xla tf_allocator_adapter.cc MemoryAllocationError(is_host_mem)", false},

	// The BFC allocator's warning when an allocation finally fails
	// (dump_log_on_failure): openxla/xla xla/tsl/framework/bfc_allocator.cc
	// AllocateRawInternal, before that tsl/framework/bfc_allocator.cc and
	// tensorflow/core/common_runtime/bfc_allocator.cc. "(rounded to N)"
	// then "requested by op …" with no space in older versions.
	{"bfc failure, jax 0.11", "W1126 04:01:02.345678  1234 bfc_allocator.cc:501] Allocator (GPU_0_bfc) ran out of memory trying to allocate 400.00GiB (rounded to 429496729600) ...", "xla/tsl/framework/bfc_allocator.cc; jaxlib 0.11.2 on an H200 (issue 22)", true},
	{"bfc failure, older", "2025-03-23 20:28:59.832181: W external/xla/xla/tsl/framework/bfc_allocator.cc:501] Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.25TiB (rounded to 1374521760000)requested by op ", "xla/tsl/framework/bfc_allocator.cc, a jaxlib of March 2025 (jax-ml/jax#27354)", true},
	{"bfc failure, second GPU, bytes", "Allocator (GPU_1_bfc) ran out of memory trying to allocate 256B (rounded to 256)requested by op ", "xla/tsl/framework/bfc_allocator.cc with HumanReadableNumBytes under 1 KiB", true},
	// The same allocator when the caller retries or can do without: "The
	// caller indicates that this is not a failure" (same file, AllocateRaw).
	{"bfc not a failure", "W external/xla/xla/tsl/framework/bfc_allocator.cc:310] Allocator (GPU_0_bfc) ran out of memory trying to allocate 3.37GiB with freed_by_count=0. The caller indicates that this is not a failure, but this may mean that there could be performance gains if more memory were available.", "xla/tsl/framework/bfc_allocator.cc AllocateRaw without retry", false},
	// A host pool of the same allocator: pinned host memory.
	{"bfc host pool", "Allocator (xla_gpu_host_bfc) ran out of memory trying to allocate 1.00GiB (rounded to 1073741824)requested by op ", "xla/tsl/framework/bfc_allocator.cc on the pinned host pool", false},

	// XLA_PYTHON_CLIENT_ALLOCATOR=platform: openxla/xla
	// xla/stream_executor/stream_executor_memory_allocator.cc (before:
	// tensorflow/stream_executor/device_memory_allocator.cc),
	// StreamExecutorMemoryAllocator::Allocate, all versions.
	{"platform allocator", "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 400.00GiB (429496729600B) on device ordinal 0", "openxla/xla stream_executor_memory_allocator.cc, all jaxlib", true},
	{"platform allocator, old status text", "Execution of replica 0 failed: Resource exhausted: Failed to allocate request for 32.00MiB (33554432B) on device ordinal 0", "tensorflow/tensorflow tensorflow/stream_executor/device_memory_allocator.cc, jaxlib 0.1 to 0.3", true},

	// XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async: openxla/xla
	// xla/stream_executor/gpu/gpu_cudamallocasync_allocator.cc
	// AllocateRaw logs the driver's error name (CUDA_ERROR_OUT_OF_MEMORY)
	// and returns no memory, so the "Out of memory while trying to
	// allocate" error above follows it.
	{"async allocator", "E1126 04:01:02.345678  1234 gpu_cudamallocasync_allocator.cc:240] gpu_async_0 cuMemAllocAsync failed to allocate 429496729600 bytes: CUDA_ERROR_OUT_OF_MEMORY: out of memory", "openxla/xla gpu_cudamallocasync_allocator.cc", true},
	{"async allocator, TF-era error name line", " Error name: cudaErrorMemoryAllocation", "tensorflow/tensorflow gpu_cudamallocasync_allocator.cc (cudaGetErrorName on its own line)", true},

	// Lines that mention memory and are no OOM.
	{"pool size, no preallocation", "I0000 00:00:1743992045.563251 3890942 gpu_helpers.cc:177] XLA backend will use up to 37565513728 bytes on device 0 for BFCAllocator.", "openxla/xla xla/pjrt/gpu/gpu_helpers.cc (the pool's size at start)", false},
	{"pool size, preallocated", "I0000 00:00:1743992045.563094 3890942 gpu_helpers.cc:136] XLA backend allocating 3825205248 bytes on device 0 for BFCAllocator.", "openxla/xla xla/pjrt/gpu/gpu_helpers.cc", false},
	{"rematerialization", "W external/xla/xla/hlo/transforms/simplifiers/hlo_rematerialization.cc:3021] Can't reduce memory use below 0B (0 bytes) by rematerialization; only reduced to 1.25TiB (1374521760000 bytes), down from 1.25TiB (1374521760000 bytes) originally", "openxla/xla hlo_rematerialization.cc (jax-ml/jax#27354)", false},
	{"both fraction names", "ValueError: XLA_CLIENT_MEM_FRACTION is specified together with XLA_PYTHON_CLIENT_MEM_FRACTION. Remove the latter one, it is deprecated.", "jax-ml/jax jaxlib/xla_client.py generate_pjrt_gpu_plugin_options", false},
	{"cpu fallback", "An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib is not installed. Falling back to cpu.", "jax-ml/jax jax/_src/xla_bridge.py", false},
}

func TestJAXForms(t *testing.T) {
	d := mustDetector(t)
	for _, f := range jaxForms {
		t.Run(f.name, func(t *testing.T) {
			kind, ok := d.Classify(f.line)
			if ok != f.oom {
				t.Fatalf("counted = %v, want %v: %q (%s)", ok, f.oom, f.line, f.source)
			}
			if ok && kind != KindDevice {
				t.Errorf("kind %q, want %q: %q", kind, KindDevice, f.line)
			}
		})
	}
}

// One JAX OOM prints the BFC allocator's warning, its memory dump, then the
// exception (and with it BufferAssignment's report): one event, the
// warning's, by the collapse window. The next failure of the retried step,
// a window later, is another.
func TestJAXFailureCountsOnce(t *testing.T) {
	w, p, d := started(t, Config{})
	warn := "W1126 04:01:02.345678  1234 bfc_allocator.cc:501] Allocator (GPU_0_bfc) ran out of memory trying to allocate 400.00GiB (rounded to 429496729600) requested by op "
	exc := "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 400.00GiB with allocator GPU_0_bfc on device 0."
	w.write(p, noise(0, 3)+
		cri(time.Second, "stderr", "F", warn)+
		cri(time.Second, "stderr", "F", "If this is caused by memory fragmentation, the environment variable 'TF_GPU_ALLOCATOR=cuda_malloc_async' may improve the situation.")+
		cri(time.Second, "stderr", "F", "Current allocation summary follows.")+
		cri(time.Second, "stderr", "F", "Bin (256): \tTotal Chunks: 3, Chunks in use: 3. 768B allocated for chunks. 768B in use in bin. 16B client-requested in use in bin.")+
		cri(1200*time.Millisecond, "stderr", "F", "Traceback (most recent call last):")+
		cri(1200*time.Millisecond, "stderr", "F", exc)+
		cri(1200*time.Millisecond, "stderr", "F", "BufferAssignment OOM Debugging."))
	wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, time.Second, strings.TrimSpace(warn)))
	w.write(p, cri(30*time.Second, "stderr", "F", exc))
	wantEvents(t, w.scan(d, []Container{trainer}), logEv(trainer, 0, 30*time.Second, exc))
}

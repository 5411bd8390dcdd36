package oom

import (
	"bytes"
	"regexp"
	"strconv"
)

// Kind says what ran out when a GPU allocation failed, so that a consumer
// such as the tuner can tell a full GPU, which fewer pods sharing it would
// cure, from a limit the application set itself, which no replica count
// changes.
type Kind string

// The kinds of GPU OOM the catalogue tells apart.
const (
	// KindDevice: the GPU had no free memory for the allocation, whoever
	// holds it. Under time-slicing that is the signal to share less.
	KindDevice Kind = "device"
	// KindProcessCap: the process reached a limit it set itself (PyTorch's
	// set_per_process_memory_fraction, vLLM's gpu_memory_utilization
	// budget) while the GPU may still have had free memory.
	KindProcessCap Kind = "process-cap"
	// KindEncoderSession: NVENC could not open an encoding session. NVENC
	// reports memory exhaustion and, on GeForce cards, the driver's limit on
	// concurrent sessions with the same status (NV_ENC_ERR_OUT_OF_MEMORY,
	// "out of memory (10)"), and the message does not say which. Both are a
	// per-GPU resource that every pod sharing the GPU draws on, so it counts
	// as a GPU OOM; the kind lets a consumer weigh it apart.
	KindEncoderSession Kind = "encoder-session"
	// KindUnknown: a pattern given in Config.Patterns that is not one of the
	// catalogue's, so nothing is known of what it means.
	KindUnknown Kind = ""
)

// UnknownLabel is the value of the `kind` label of
// gpuslice_gpu_oom_events_total for KindUnknown: a label with an empty
// value is no label at all in Prometheus, which would read as an exporter
// that has no kind label.
const UnknownLabel = "unknown"

// Label is the kind as the `kind` label of gpuslice_gpu_oom_events_total
// carries it: the Kind itself, UnknownLabel for KindUnknown.
func (k Kind) Label() string {
	if k == KindUnknown {
		return UnknownLabel
	}
	return string(k)
}

// kindOrder is the order in which Detector.Kinds lists kinds.
var kindOrder = []Kind{KindDevice, KindProcessCap, KindEncoderSession, KindUnknown}

// Signature is one entry of the catalogue: a regular expression (Go RE2,
// case sensitive) for the lines of one family of GPU out-of-memory messages,
// the real message it was written from and where that was published.
type Signature struct {
	Pattern  string
	Software string
	Kind     Kind
	// Refine, where set, reads the kind from the figures the line itself
	// gives, for a message that more than one cause prints; it answers
	// Kind when the figures are missing.
	Refine func(line []byte) Kind
	// Follow, where set, reads the kind from the lines that follow the
	// message, for a message whose own line cannot say: given the lines
	// after it so far (at most maxFollow), it answers true once they tell,
	// and Kind stands until then.
	Follow func(after [][]byte) (Kind, bool)
	// Example is a real log line, copied from Source, that Pattern matches.
	Example string
	Source  string
	// NearMiss, where one exists, is a real line that looks alike but is not
	// a GPU OOM, from NearMissSource; Pattern must not match it.
	NearMiss       string
	NearMissSource string
}

// Catalogue is the list of GPU OOM signatures the detector uses by default.
// Order matters for Kind only: a line takes the kind of the first signature
// it matches, so the narrower process-cap and encoder signatures come before
// the broad device ones that may match the same line (PyTorch's
// per-process-cap message is also a torch.OutOfMemoryError).
//
// Every entry is tested on its Example and NearMiss, and the test corpus in
// catalogue_test.go holds more real messages per family, positive and
// negative. Add a signature only with the real message it was taken from.
var Catalogue = []Signature{
	// Application caps.
	{
		Pattern:  `No available memory for the cache blocks`,
		Software: "vLLM (V0 engine start-up)",
		Kind:     KindProcessCap,
		Example:  "vllm-1  | ERROR 11-18 18:07:28 engine.py:366] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.",
		Source:   "https://github.com/vllm-project/vllm/issues/10439",
	},
	{
		// The V1 engine's wording, then the older one of the same check.
		Pattern:  `larger than the available KV cache memory|larger than the maximum number of tokens that can be stored in KV cache`,
		Software: "vLLM (start-up, KV cache for max_model_len)",
		Kind:     KindProcessCap,
		Example:  "(EngineCore_DP0 pid=1094) ValueError: To serve at least one request with the models's max seq len (262144), (24.0 GiB KV cache is needed, which is larger than the available KV cache memory (3.18 GiB). Based on the available memory, the estimated maximum model length is 34736. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
		Source:   "https://github.com/vllm-project/vllm/issues/34076",
	},
	{
		// The KV cache pool left after the weights, within
		// --mem-fraction-static of the GPU, is empty.
		Pattern:  `\bNot enough memory\. Please try to increase --mem-fraction-static\b`,
		Software: "SGLang (start-up, KV cache pool)",
		Kind:     KindProcessCap,
		Example:  "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
		Source:   "https://github.com/sgl-project/sglang/issues/4330",
	},
	{
		// CatBoost trains in a pool it takes at start (gpu_ram_part of the
		// GPU); this is the pool running out, not the GPU. It names CUDA
		// and an error, so it must come before the runtime error string.
		Pattern:  `\bNCudaLib::TOutOfMemoryError\b`,
		Software: "CatBoost (GPU training, its memory pool)",
		Kind:     KindProcessCap,
		Example:  "(NCudaLib::TOutOfMemoryError) /src/catboost/catboost/cuda/cuda_lib/memory_pool/stack_like_memory_pool.h:303: Error: Out of memory. Requested 8880 MB; Free 5902.061425 MB",
		Source:   "https://github.com/catboost/catboost/issues/2750",
	},
	{
		// RMM's pool resource at the maximum size the program gave it.
		Pattern:  `\bpool_memory_resource\.hpp:\d+: Maximum pool size exceeded\b`,
		Software: "RAPIDS Memory Manager (pool resource: cuDF, cuML, cupoch)",
		Kind:     KindProcessCap,
		Example:  "MemoryError: std::bad_alloc: RMM failure at:/home/adolf/cupoch/third_party/rmm/include/rmm/mr/device/pool_memory_resource.hpp:179: Maximum pool size exceeded",
		Source:   "https://github.com/neka-nat/cupoch/issues/98",
	},

	// NVENC sessions.
	{
		Pattern:        `\b(?:OpenEncodeSessionEx|InitializeEncoder) failed: out of memory`,
		Software:       "FFmpeg NVENC (h264_nvenc, hevc_nvenc, av1_nvenc)",
		Kind:           KindEncoderSession,
		Example:        "[h264_nvenc @ 0x46d8300] OpenEncodeSessionEx failed: out of memory (10): (no details)",
		Source:         "https://github.com/joinhive-ai/transcoder/issues/4",
		NearMiss:       "[h264_nvenc @ 0x5601aa5b40c0] No NVENC capable devices found",
		NearMissSource: "https://github.com/valkjsaaa/auto-bilibili-recorder/issues/9",
	},
	{
		// The Video Codec SDK call with status 10, NV_ENC_ERR_OUT_OF_MEMORY.
		Pattern:  `[Nn]vEncOpenEncodeSessionEx\b[^\n]*?(?:: |returned error )10\b|\bNV_ENC_ERR_OUT_OF_MEMORY\b`,
		Software: "NVIDIA Video Codec SDK (NVEncC, NvPipe, custom encoders)",
		Kind:     KindEncoderSession,
		Example:  "nvenc : Error on nvEncOpenEncodeSessionEx: 10 (NVENC indicates that the API call failed because it was unable to allocate enough memory to perform the requested operation.)",
		Source:   "https://github.com/rigaya/NVEnc/issues/439",
	},

	// A full device.
	{
		// PyTorch's cudaMallocAsync backend (PYTORCH_CUDA_ALLOC_CONF
		// backend:cudaMallocAsync, ComfyUI's default) says this both when
		// cudaMallocAsync fails, the GPU full, and when a fraction set with
		// set_per_process_memory_fraction would be passed; the figures
		// that tell which follow on lines of their own, read by
		// torchAsyncKind. Without them, device: every report found was the
		// GPU full (0 bytes to 7 MiB free by CUDA's account), and no
		// fraction is set unless the program sets one.
		Pattern:  `Allocation on device \d+ would exceed allowed memory`,
		Software: "PyTorch (cudaMallocAsync backend)",
		Kind:     KindDevice,
		Follow:   torchAsyncKind,
		Example:  "Allocation on device 0 would exceed allowed memory. (out of memory)",
		Source:   "https://github.com/EvilBT/ComfyUI_SLK_joy_caption_two/issues/28",
	},
	{
		Pattern:  `on startup is less than desired GPU memory utilization`,
		Software: "vLLM (start-up, memory held by other processes)",
		Kind:     KindDevice,
		Example:  "[release 2.11][vllm] Distributed failures - free memory on device cuda:0 (19.77/22.05 GiB) on startup is less than desired GPU memory utilization (0.9, 19.84 GiB)",
		Source:   "https://github.com/pytorch/pytorch/issues/175666",
	},
	{
		// Every wording of the caching allocator since 1.0 starts "CUDA out
		// of memory." and goes on "Tried to allocate"; a hint that merely
		// names the error goes on with other words.
		Pattern:        `CUDA out of memory(?:[.:]|\s*$)`,
		Software:       "PyTorch caching allocator (all versions since 1.0)",
		Kind:           KindDevice,
		Refine:         torchKind,
		Example:        "RuntimeError: CUDA out of memory. Tried to allocate 288.00 MiB (GPU 0; 2.00 GiB total capacity; 849.59 MiB already allocated; 87.44 MiB free; 326.41 MiB cached)",
		Source:         "https://github.com/Rudrabha/Wav2Lip/issues/221",
		NearMiss:       "If you encounter CUDA out of memory, try to set --tile with a smaller number.",
		NearMissSource: "https://github.com/xinntao/Real-ESRGAN/issues/272",
	},
	{
		// The exception class alone, for re-raised or reformatted errors;
		// the "torch." prefix keeps Java's OutOfMemoryError out.
		Pattern:        `\btorch\.(?:cuda\.)?OutOfMemoryError\b`,
		Software:       "PyTorch (torch.cuda.OutOfMemoryError 1.13+, torch.OutOfMemoryError 2.5+)",
		Kind:           KindDevice,
		Refine:         torchKind,
		Example:        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 496.00 MiB. GPU 0 has a total capacty of 14.75 GiB of which 235.06 MiB is free. Process 20398 has 14.52 GiB memory in use.",
		Source:         "https://github.com/FoundationVision/GenerateU/issues/10",
		NearMiss:       "OpenJDK 64-Bit Server VM warning: INFO: os::commit_memory(0x00000000c5330000, 181207040, 0) failed; error='Cannot allocate memory' (errno=12)",
		NearMissSource: "https://github.com/hyperhq/hyperd/issues/130",
	},
	{
		// The CUDA runtime's error string as each library wraps it: "CUDA
		// error: out of memory" (PyTorch, ggml), "CUDA Error: out of memory"
		// (darknet), "CUDA failed with error out of memory" (CTranslate2),
		// "Cuda failure 'out of memory'" (NCCL), "Cuda Error in allocate: 2
		// (out of memory)" (TensorRT's safe runtime), "cuda runtime error (2)
		// : out of memory" (Torch7, PyTorch 0.x), "Check failed: ...
		// cudaSuccess: CUDA: out of memory" (MXNet). A line must name CUDA as
		// a word and a failure, so ggml's pinned host buffer warnings
		// ("ggml_cuda_host_malloc: ... out of memory") stay out.
		Pattern:        `(?:\b(?:CUDA|Cuda|cuda)\b[^\n]{0,60}?\b(?:[Ee]rror|ERROR|[Ff]ailure|[Ff]ailed)\b|\b(?:[Ee]rror|ERROR|[Ff]ailure|[Ff]ailed)\b[^\n]{0,60}?\b(?:CUDA|Cuda|cuda)\b)[^\n]{0,100}?(?:\b[Oo]ut of memory\b|\bOUT OF MEMORY\b)`,
		Software:       "CUDA runtime error string (PyTorch, llama.cpp, darknet, CTranslate2/faster-whisper, NCCL, TensorRT, Torch7, Paddle)",
		Kind:           KindDevice,
		Example:        "    0 CUDA Error: out of memory",
		Source:         "https://github.com/pjreddie/darknet/issues/499",
		NearMiss:       "CUDA Error Prev: an illegal memory access was encountered",
		NearMissSource: "https://github.com/AlexeyAB/darknet/issues/3259",
	},
	{
		Pattern:  `THCudaCheck FAIL\b[^\n]*\berror=2\b`,
		Software: "Torch7 / PyTorch 0.x (THC)",
		Kind:     KindDevice,
		Example:  "THCudaCheck FAIL file=/home/gpu/torch/extra/cutorch/lib/THC/generic/THCStorage.cu line=66 error=2 : out of memory",
		Source:   "https://github.com/torch/torch7/issues/1140",
	},
	{
		// glog's CHECK_EQ with cudaErrorMemoryAllocation (2).
		Pattern:  `\bcudaSuccess \((?:2 vs\. 0|0 vs\. 2)\)`,
		Software: "Caffe, PaddlePaddle 1.x (glog CHECK on cudaMalloc)",
		Kind:     KindDevice,
		Example:  "F0304 14:26:21.611594  4889 syncedmem.cpp:71] Check failed: error == cudaSuccess (2 vs. 0)  out of memory",
		Source:   "https://github.com/houqb/DSS/issues/25",
	},
	{
		Pattern:  `\bcudaErrorMemoryAllocation\b`,
		Software: "CUDA runtime API (CuPy, Numba, custom kernels)",
		Kind:     KindDevice,
		Example:  "cupy.cuda.runtime.CUDARuntimeError: cudaErrorMemoryAllocation: out of memory",
		Source:   "https://github.com/cupy/cupy/pull/314",
	},
	{
		// The driver API's name; also TensorFlow's and XLA's stream
		// executor, NVDEC's cuvidCreateDecoder and Numba.
		Pattern:        `\bCUDA_ERROR_OUT_OF_MEMORY\b`,
		Software:       "CUDA driver API (TensorFlow, JAX/XLA, NVDEC, Numba, tiny-cuda-nn)",
		Kind:           KindDevice,
		Example:        "failed to allocate 17.79G (19104890880 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
		Source:         "https://github.com/philip-huang/PIXOR/issues/31",
		NearMiss:       "2022-06-16 02:36:14.576914: E tensorflow/stream_executor/cuda/cuda_driver.cc:893] failed to alloc 966367744 bytes on host: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
		NearMissSource: "https://github.com/Accenture/AIR/issues/7",
	},
	{
		// CUresult 2 is CUDA_ERROR_OUT_OF_MEMORY, printed as a number.
		Pattern:  `\bCUresult\b[^\n]{0,30}?\b(?:result|res|code)\s*=\s*2\b`,
		Software: "CUDA driver API, numeric CUresult",
		Kind:     KindDevice,
		Example:  "[torch_memory_saver.cpp] CUresult error  result=2 file=csrc/torch_memory_saver.cpp func=cu_mem_create line=103 (5)",
		Source:   "https://github.com/fzyzcjy/torch_memory_saver/issues/4",
	},
	{
		Pattern:  `\bOPTIX_ERROR_(?:DEVICE_)?OUT_OF_MEMORY\b`,
		Software: "OptiX 7+",
		Kind:     KindDevice,
		Example:  "[2023-08-01 16:53:30.067] [console] [error] OPTIX_ERROR_DEVICE_OUT_OF_MEMORY: Device out of memory",
		Source:   "https://github.com/LuisaGroup/LuisaRender/issues/18",
	},
	{
		// Cycles prints "<CUresult name> in <driver call>".
		Pattern:  `\bOut of memory in cu[A-Z]\w*\(`,
		Software: "Blender Cycles (CUDA and OptiX devices)",
		Kind:     KindDevice,
		Example:  "Out of memory in cuStreamCreate(&cuda_stream_, CU_STREAM_NON_BLOCKING) (C:\\Users\\blender\\git\\blender-v410\\blender.git\\intern\\cycles\\device\\cuda\\queue.cpp:21)",
		Source:   "https://github.com/vosen/ZLUDA/issues/223",
	},
	{
		Pattern:        `\bCUBLAS_STATUS_ALLOC_FAILED\b`,
		Software:       "cuBLAS",
		Kind:           KindDevice,
		Example:        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
		Source:         "https://github.com/QwenLM/Qwen3/issues/873",
		NearMiss:       "failed to create cublas handle: CUBLAS_STATUS_NOT_INITIALIZED",
		NearMissSource: "https://github.com/tensorflow/tensorflow/issues/9489",
	},
	{
		Pattern:        `\bCUDNN_STATUS_ALLOC_FAILED\b`,
		Software:       "cuDNN",
		Kind:           KindDevice,
		Example:        "Could not create cudnn handle: CUDNN_STATUS_ALLOC_FAILED",
		Source:         "https://github.com/kbardool/Keras-frcnn/issues/97",
		NearMiss:       "2019-01-23 21:21:11.073710: E tensorflow/stream_executor/cuda/cuda_dnn.cc:455] could not create cudnn handle: CUDNN_STATUS_NOT_INITIALIZED",
		NearMissSource: "https://github.com/stephen-v/tensorflow_alexnet_classify/issues/4",
	},
	{
		// NCCL's own allocation failure; its "Cuda failure 'out of memory'"
		// is the CUDA error string signature.
		Pattern:        `NCCL WARN Failed to CUDA calloc\b`,
		Software:       "NCCL",
		Kind:           KindDevice,
		Example:        "ng30903:3063028:3066152 [3] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 6291456 bytes",
		Source:         "https://github.com/NVIDIA/nccl/issues/1235",
		NearMiss:       "(train_rft pid=2657296) 2024-05-11 14:10:52.227 n176-080-198:2657296:2658232 [0] include/alloc.h:102 NCCL WARN Cuda failure 1 'invalid argument'",
		NearMissSource: "https://github.com/NVIDIA/nccl/issues/1283",
	},
	{
		// The error XLA returns when its device allocator (the BFC pool by
		// default) gives no memory, under JAX and TensorFlow's XLA. The size
		// is printed in bytes ("N bytes.", XLA's wording for years) or, in
		// later XLA, by tsl's HumanReadableNumBytes ("512B", "400.00GiB"),
		// then "." or, in jaxlib 0.11, " with allocator GPU_0_bfc on device
		// 0.". The host
		// variant ("Out of host memory while ...") is pinned host memory and
		// does not match. Every form with its source: jaxForms in
		// catalogue_test.go.
		Pattern:        `\bOut of memory while trying to allocate (?:\d+ bytes|\d+(?:\.\d+)?(?:[KMGTPE]i)?B)\b`,
		Software:       "JAX / XLA (all jaxlib versions; XlaRuntimeError, JaxRuntimeError)",
		Kind:           KindDevice,
		Example:        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 6291456 bytes.",
		Source:         "https://github.com/jax-ml/jax/issues/13428",
		NearMiss:       "RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem.",
		NearMissSource: "https://github.com/pytorch/xla/issues/9524",
	},
	{
		// The BFC allocator's warning when an allocation has finally failed
		// (tsl, now xla/tsl/framework/bfc_allocator.cc): only then does it
		// print "(rounded to N)". The same allocator's "with
		// freed_by_count=…" warning is a retried or optional allocation and
		// no failure. GPU_<n>_bfc is a device pool; the host pools are named
		// otherwise (gpu_host_bfc, xla_gpu_host_bfc). It precedes JAX's
		// and TensorFlow's exception by milliseconds, so the collapse window
		// makes the two one event.
		Pattern:        `\bAllocator \(GPU_\d+_bfc\) ran out of memory trying to allocate \d+(?:\.\d+)?(?:[KMGTPE]i)?B \(rounded to \d+\)`,
		Software:       "XLA / TensorFlow BFC allocator (JAX, TensorFlow)",
		Kind:           KindDevice,
		Example:        "2025-03-23 20:28:59.832181: W external/xla/xla/tsl/framework/bfc_allocator.cc:501] Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.25TiB (rounded to 1374521760000)requested by op ",
		Source:         "https://github.com/jax-ml/jax/issues/27354",
		NearMiss:       "2025-05-18 21:59:55.086788: W external/xla/xla/tsl/framework/bfc_allocator.cc:310] Allocator (GPU_0_bfc) ran out of memory trying to allocate 3.37GiB with freed_by_count=0. The caller indicates that this is not a failure, but this may mean that there could be performance gains if more memory were available.",
		NearMissSource: "https://github.com/flatironinstitute/nemos/issues/345",
	},
	{
		// XLA's stream-executor allocator ("RESOURCE_EXHAUSTED" since
		// jaxlib 0.3, "Resource exhausted" before).
		Pattern:        `(?:RESOURCE_EXHAUSTED|Resource exhausted): Failed to allocate request for [^\n]*\bon device ordinal\b`,
		Software:       "JAX / XLA (PJRT)",
		Kind:           KindDevice,
		Example:        "RESOURCE_EXHAUSTED: Failed to allocate request for 256.00MiB (268435456B) on device ordinal 0",
		Source:         "https://github.com/kingoflolz/mesh-transformer-jax/issues/209",
		NearMiss:       "grpc._channel._Rendezvous: <_Rendezvous of RPC that terminated with (StatusCode.RESOURCE_EXHAUSTED, Resource has been exhausted (e.g check quota).)>",
		NearMissSource: "https://github.com/GoogleCloudPlatform/python-docs-samples/issues/1238",
	},
	{
		// Since TF 1.8 the line names the device; only GPU ones count.
		Pattern:        `\bOOM when allocating tensor\b[^\n]*?(?:device:GP|/gpu:|\bGPU_\d+_bfc\b)`,
		Software:       "TensorFlow GPU allocators (BFC, cuda_malloc_async)",
		Kind:           KindDevice,
		Example:        "OOM when allocating tensor with shape[3,3,512,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc [Op:Mul]",
		Source:         "https://github.com/tensorflow/tensorflow/issues/47820",
		NearMiss:       "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[16,19,19,1024] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu",
		NearMissSource: "https://github.com/thtrieu/darkflow/issues/873",
	},
	{
		// Before TF 1.8 the line ends after the shape (and type), and the
		// device is on the [[Node: …]] line that follows. A CPU one reads
		// alike; TensorFlow's CPU allocator rarely fails in a container
		// (Linux overcommits and the cgroup OOM killer acts instead), so a
		// line with no device counts.
		Pattern:  `\bOOM when allocating tensor (?:with|of) shape ?\[[\d,\s]*\](?: and type \w+)?\s*$`,
		Software: "TensorFlow < 1.8",
		Kind:     KindDevice,
		Example:  "ResourceExhaustedError (see above for traceback): OOM when allocating tensor with shape[2048,1024]",
		Source:   "https://github.com/bshao001/ChatLearner/issues/34",
	},
	{
		Pattern:        `\bEigenAllocator for GPU ran out of memory\b`,
		Software:       "TensorFlow 1.x",
		Kind:           KindDevice,
		Example:        ": F tensorflow/core/common_runtime/gpu/gpu_device.cc:103] EigenAllocator for GPU ran out of memory when allocating 0. See error logs for more detailed info.",
		Source:         "https://github.com/CharlesShang/FastMaskRCNN/issues/129",
		NearMiss:       "2020-09-24 21:35:23.363348: W tensorflow/core/common_runtime/bfc_allocator.cc:246] Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.02GiB with freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be performance gains if more memory were available.",
		NearMissSource: "https://github.com/tensorflow/tensorflow/issues/43546",
	},
	{
		// The arena's line does not name its device. Counted as the CUDA
		// arena: in a container the CPU arena's malloc rarely fails (Linux
		// overcommits; the cgroup OOM killer acts instead).
		Pattern:        `\bBFCArena::AllocateRawInternal\b[^\n]*?\bFailed to allocate memory for requested buffer\b`,
		Software:       "ONNX Runtime CUDA execution provider (BFC arena)",
		Kind:           KindDevice,
		Example:        "onnx runtime error 6: Non-zero status code returned while running Mul node. Name:'Mul_8702' Status Message: /workspace/onnxruntime/onnxruntime/core/framework/bfc_arena.cc:368 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*, bool, onnxruntime::WaitNotificationFn) Failed to allocate memory for requested buffer of size 2830172160",
		Source:         "https://github.com/microsoft/onnxruntime/issues/20038",
		NearMiss:       "tritonclient.utils.InferenceServerException: [StatusCode.INTERNAL] onnx runtime error 2: not enough space: expected 270080, got 261760",
		NearMissSource: "https://github.com/triton-inference-server/onnxruntime_backend/issues/95",
	},
	{
		Pattern:  `\bError Code 2: OutOfMemory\b|\bOutOfMemory Error in \w+`,
		Software: "TensorRT (builder and runtime allocators)",
		Kind:     KindDevice,
		Example:  "ERROR: [TRT]: 2: [virtualMemoryBuffer.cpp::resizePhysical::160] Error Code 2: OutOfMemory (no further information)",
		Source:   "https://github.com/marcoslucianops/DeepStream-Yolo/issues/366",
	},
	{
		Pattern:        `\bcudaMalloc failed: out of memory\b`,
		Software:       "llama.cpp / ollama (ggml CUDA backend)",
		Kind:           KindDevice,
		Example:        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 144817.04 MiB on device 0: cudaMalloc failed: out of memory",
		Source:         "https://github.com/ggml-org/llama.cpp/issues/20431",
		NearMiss:       "WARNING: failed to allocate 4096.02 MB of pinned memory: out of memory",
		NearMissSource: "https://github.com/ollama/ollama/issues/1955",
	},
	{
		// CUDA<n> is a device buffer; CUDA_Host is pinned host memory.
		Pattern:  `\b(?:failed|unable) to allocate CUDA\d+ buffer\b`,
		Software: "llama.cpp / ollama (ggml buffer allocation)",
		Kind:     KindDevice,
		Example:  "alloc_tensor_range: failed to allocate CUDA0 buffer of size 151851674624",
		Source:   "https://github.com/ggml-org/llama.cpp/issues/20431",
	},
	{
		Pattern:  `\bcupy\.cuda\.memory\.OutOfMemoryError\b|\b[Oo]ut of memory allocating [\d,]+ bytes \(allocated so far|\bout of memory to allocate \d+ bytes \(total \d+ bytes\)`,
		Software: "CuPy (and Chainer on CuPy)",
		Kind:     KindDevice,
		Example:  "Exception in main training loop: Out of memory allocating 25,600,000 bytes (allocated so far: 3,635,267,072 bytes).",
		Source:   "https://github.com/cupy/cupy/issues/2537",
	},
	{
		Pattern:  `\bOut of memory error on GPU \d+`,
		Software: "PaddlePaddle",
		Kind:     KindDevice,
		Example:  "Out of memory error on GPU 0. Cannot allocate 3.125000GB memory on GPU 0, available memory is only 117.750000MB.",
		Source:   "https://github.com/PaddlePaddle/PaddleOCR/issues/645",
	},
	{
		// TGI's warm-up catches the CUDA OOM of its largest prefill batch
		// and raises this instead.
		Pattern:  `\bNot enough memory to handle \d+ prefill tokens\b`,
		Software: "Hugging Face text-generation-inference (warm-up)",
		Kind:     KindDevice,
		Example:  "RuntimeError: Not enough memory to handle 4096 prefill tokens. You need to decrease `--max-batch-prefill-tokens`",
		Source:   "https://github.com/huggingface/text-generation-inference/issues/1067",
	},
	{
		Pattern:  `\bExecutor creation failed due to insufficient GPU memory\b`,
		Software: "TensorRT-LLM (executor start-up)",
		Kind:     KindDevice,
		Example:  "[07/08/2025-19:47:15] [TRT-LLM] [RANK 1] [E] Failed to initialize executor on rank 1: Executor creation failed due to insufficient GPU memory.",
		Source:   "https://github.com/NVIDIA/TensorRT-LLM/issues/5872",
	},
	{
		Pattern:  `\bInsufficient VRAM for model and cache\b`,
		Software: "ExLlamaV2 (loading with a cache)",
		Kind:     KindDevice,
		Example:  "RuntimeError: Insufficient VRAM for model and cache",
		Source:   "https://github.com/turboderp-org/exllamav2/issues/383",
	},
	{
		// rmm::out_of_memory from the CUDA resource itself (cudaMalloc
		// failed), and thrust's allocation failure in its CUDA backend.
		Pattern:        `\bout_of_memory: CUDA error at\b|\bparallel_for failed: out of memory\b|\bthrust::system::detail::bad_alloc\b`,
		Software:       "RAPIDS Memory Manager and thrust (cuDF, cuML, XGBoost)",
		Kind:           KindDevice,
		Example:        "MemoryError: std::bad_alloc: out_of_memory: CUDA error at: /usr/local/miniconda3/envs/rapids-22.02/include/rmm/mr/device/cuda_memory_resource.hpp",
		Source:         "https://github.com/NVIDIA/cudf/issues/10517",
		NearMiss:       "XGBoostError: std::bad_alloc",
		NearMissSource: "https://github.com/dmlc/xgboost/issues/1032",
	},
	{
		// OpenCL's CL_MEM_OBJECT_ALLOCATION_FAILURE as boost.compute words
		// it (LightGBM's GPU build).
		Pattern:        `\bMemory Object Allocation Failure\b`,
		Software:       "OpenCL through boost.compute (LightGBM GPU)",
		Kind:           KindDevice,
		Example:        "  what():  Memory Object Allocation Failure",
		Source:         "https://github.com/lightgbm-org/LightGBM/issues/4480",
		NearMiss:       "lightgbm.basic.LightGBMError: Out of Host Memory",
		NearMissSource: "https://github.com/Kaggle/docker-python/pull/693",
	},
	{
		Pattern:  `\bCritical error in pipeline: CUDA allocation failed\b|\bCan't allocate \d+ bytes on device \d+`,
		Software: "NVIDIA DALI",
		Kind:     KindDevice,
		Example:  "Can't allocate 129499136 bytes on device 0.",
		Source:   "https://github.com/NVIDIA/DALI/issues/1137",
	},
	{
		Pattern:  `\bSystem is out of GPU and shared host memory\b`,
		Software: "Blender Cycles",
		Kind:     KindDevice,
		Example:  "System is out of GPU and shared host memory",
		Source:   "https://github.com/ynshung/blender-colab/issues/5",
	},
}

// torchFigure is one size in PyTorch's OOM message as format_size writes
// it ("0 bytes", "453.00 MiB", "17.69 GiB").
const torchFigure = `(\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB|TiB)`

var (
	torchTried = regexp.MustCompile(`Tried to allocate ` + torchFigure)
	// The GPU's total and free memory by CUDA's account: "has a total
	// capacity of T of which F is free" since 2.1 (2.1 spelt it "capacty"),
	// "(GPU 0; T total capacity; ...; F free;" before.
	torchTotal   = regexp.MustCompile(`total capac(?:i)?ty of ` + torchFigure + `|; ` + torchFigure + ` total capacity\b`)
	torchFree    = regexp.MustCompile(`of which ` + torchFigure + ` is free|; ` + torchFigure + ` free;`)
	torchAllowed = regexp.MustCompile(torchFigure + ` allowed;`)
)

// torchKind tells the two causes of PyTorch's caching-allocator OOM apart.
// With a per-process fraction set (set_per_process_memory_fraction, the
// opt-in docs/plugin.md gives a pod for its share), the message says what
// it allows ("13.98 GiB allowed;"). When that is less than the GPU and the
// GPU's free memory covered the request, the fraction refused it, not the
// GPU: process-cap (seen on an H200 with PyTorch 2.11: "Tried to allocate
// 16.78 GiB. GPU 0 has a total capacity of 139.80 GiB of which 138.77 GiB
// is free. ... 13.98 GiB allowed;"). A GPU with less free than asked was
// full, whatever the fraction ("of which 0 bytes is free. 50.00 GiB
// allowed;", other tenants holding the card), and a fraction of the whole
// card (TGI sets 1.0 by default: "3.12 MiB free; 22.20 GiB allowed" on a
// 22.20 GiB card) caps nothing the GPU does not: device. Figures missing
// or unread: device, as without a fraction.
func torchKind(line []byte) Kind {
	allowed, ok := torchBytes(torchAllowed.FindSubmatch(line))
	if !ok {
		return KindDevice
	}
	total, okT := torchBytes(torchTotal.FindSubmatch(line))
	tried, okR := torchBytes(torchTried.FindSubmatch(line))
	free, okF := torchBytes(torchFree.FindSubmatch(line))
	if okT && okR && okF {
		return torchCap(allowed, total, free, tried)
	}
	return KindDevice
}

// torchCap is the rule both PyTorch readings share: a limit below the
// GPU's total, with CUDA's free memory covering the request, is the
// program's own fraction refusing it; anything else is the GPU full. The
// figures are rounded to two decimals, so a fraction of 1 reads as the
// total give or take that.
func torchCap(limit, total, free, requested float64) Kind {
	if limit < 0.995*total && free >= requested {
		return KindProcessCap
	}
	return KindDevice
}

// maxFollow bounds the lines a Follow reads after its message.
const maxFollow = 8

// torchAsyncKind reads the figures PyTorch's cudaMallocAsync backend
// prints after its OOM line, one to a line:
//
//	Currently allocated     : 0 bytes
//	Requested               : 16.78 GiB
//	Device limit            : 139.80 GiB
//	Free (according to CUDA): 33.83 GiB
//	PyTorch limit (set by user-supplied memory fraction)
//	                        : 13.98 GiB
//
// (an H200, past a fraction of 0.1). With no fraction set the limit reads
// 17179869184.00 GiB (the largest uint64 in bytes). The kind is torchCap's;
// it answers once the limit is read, device when a figure before it was
// missing.
func torchAsyncKind(after [][]byte) (Kind, bool) {
	var requested, device, free float64
	var okR, okD, okF bool
	for i, l := range after {
		label, value, _ := bytes.Cut(bytes.TrimSpace(l), []byte(":"))
		label = bytes.TrimSpace(label)
		switch {
		case bytes.Equal(label, []byte("Requested")):
			requested, okR = torchBytes(torchSize.FindSubmatch(value))
		case bytes.Equal(label, []byte("Device limit")):
			device, okD = torchBytes(torchSize.FindSubmatch(value))
		case bytes.Equal(label, []byte("Free (according to CUDA)")):
			free, okF = torchBytes(torchSize.FindSubmatch(value))
		case bytes.HasPrefix(label, []byte("PyTorch limit")):
			if i+1 >= len(after) {
				return KindDevice, false // its value is on the next line
			}
			limit, okL := torchBytes(torchSize.FindSubmatch(after[i+1]))
			if okR && okD && okF && okL {
				return torchCap(limit, device, free, requested), true
			}
			return KindDevice, true
		}
	}
	return KindDevice, false
}

var torchSize = regexp.MustCompile(torchFigure)

var torchUnits = map[string]float64{"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}

// torchBytes reads the first figure a torchFigure match captured.
func torchBytes(m [][]byte) (float64, bool) {
	for i := 1; i+1 < len(m); i += 2 {
		if m[i] == nil {
			continue
		}
		v, err := strconv.ParseFloat(string(m[i]), 64)
		if err != nil {
			return 0, false
		}
		return v * torchUnits[string(m[i+1])], true
	}
	return 0, false
}

// HostMemoryPattern marks lines about host memory. Some libraries report a
// failed pinned (page-locked) host allocation with CUDA's own words, e.g.
// TensorFlow's "failed to alloc 8589934592 bytes on host:
// CUDA_ERROR_OUT_OF_MEMORY" and ggml's "failed to allocate … of pinned
// memory: out of memory"; those are host memory, usually a warning that the
// library falls back from, and no GPU OOM. A line this pattern matches is
// not an event, whatever pattern (default or configured) matched it.
const HostMemoryPattern = `\bbytes on host\b|\b[Pp]inned (?:host )?memory\b|\bCUDA_Host\b`

// DefaultPatterns are the patterns of the Catalogue, in its order: what the
// detector uses when Config.Patterns is nil.
var DefaultPatterns = cataloguePatterns()

func cataloguePatterns() []string {
	ps := make([]string, len(Catalogue))
	for i, s := range Catalogue {
		ps[i] = s.Pattern
	}
	return ps
}

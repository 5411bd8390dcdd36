package oom

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// realMessage is a log line copied from a public issue, with where it was
// published. Lines are as posted (some titles, some log lines); a few are
// cut to the line the library printed.
type realMessage struct {
	line, source string
	kind         Kind // for positives: the kind the detector must report
}

// realPositives are GPU out-of-memory failures as users of each library
// posted them. The detector must count every one, with its kind.
var realPositives = []realMessage{
	// PyTorch, every wording of the caching allocator and the runtime.
	{"RuntimeError: CUDA out of memory. Tried to allocate 288.00 MiB (GPU 0; 2.00 GiB total capacity; 849.59 MiB already allocated; 87.44 MiB free; 326.41 MiB cached)", "https://github.com/Rudrabha/Wav2Lip/issues/221", KindDevice},
	{"RuntimeError: CUDA out of memory. Tried to allocate 9.80 GiB (GPU 0; 14.76 GiB total capacity; 9.94 GiB already allocated; 3.89 GiB free; 160.79 MiB cached).", "https://github.com/daitao/SAN/issues/39", KindDevice},
	{"RuntimeError: CUDA out of memory. Tried to allocate 1.12 MiB (GPU 0; 22.37 GiB total capacity; 15.87 GiB already allocated; 3.56 MiB free; 787.74 MiB cached)", "https://github.com/neurosim/DNN_NeuroSim_V1.3/issues/28", KindDevice},
	{"whyCUDA out of memory. Tried to allocate 130.00 MiB (GPU 1; 7.80 GiB total capacity; 5.91 GiB already allocated; 33.56 MiB free; 6.09 GiB reserved in total by PyTorch)", "https://github.com/JDAI-CV/centerX/issues/51", KindDevice},
	{"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 496.00 MiB. GPU 0 has a total capacty of 14.75 GiB of which 235.06 MiB is free. Process 20398 has 14.52 GiB memory in use. Of the allocated memory 14.06 GiB is allocated by PyTorch, and 330.42 MiB is reserved by PyTorch but unallocated.", "https://github.com/FoundationVision/GenerateU/issues/10", KindDevice},
	{"2026-01-08 00:35:04 - whisperjav - ERROR - Failed: 1,MP4 - CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 4.00 GiB of which 0 bytes is free. Of the allocated memory 3.27 GiB is allocated by PyTorch, and 257.08 MiB is reserved by PyTorch but unallocated.", "https://github.com/meizhong986/WhisperJAV/issues/118", KindDevice},
	{`an NCCL timeout and the error "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate more than 1EB memory"`, "https://github.com/NVIDIA/nccl/issues/1284", KindDevice},
	{"RuntimeError: CUDA error: out of memory", "https://github.com/nunchux-ai/nunchaku/issues/144", KindDevice},
	{"RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "https://github.com/QwenLM/Qwen3/issues/873", KindDevice},
	{"报这种错误 RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "https://github.com/JDAI-CV/fast-reid/issues/625", KindDevice},
	{"THCudaCheck FAIL file=/opt/conda/conda-bld/pytorch_1513368888240/work/torch/lib/THC/generic/THCStorage.c line=82 error=2 : out of memory", "https://github.com/Cadene/vqa.pytorch/issues/47", KindDevice},
	{"THCudaCheck FAIL file=/home/gpu/torch/extra/cutorch/lib/THC/generic/THCStorage.cu line=66 error=2 : out of memory", "https://github.com/torch/torch7/issues/1140", KindDevice},
	{"...ayci/torch-distro/install/share/lua/5.1/cutorch/test.lua:483: cuda runtime error (2) : out of memory at /home/bozkalayci/torch-distro/extra/cutorch/lib/THC/THCStorage.cu:30", "https://github.com/torch/cunn/issues/117", KindDevice},
	// PyTorch's cudaMallocAsync backend (ComfyUI's default), the GPU full.
	{"Allocation on device 0 would exceed allowed memory. (out of memory)", "https://github.com/EvilBT/ComfyUI_SLK_joy_caption_two/issues/28", KindDevice},
	{"Allocation on device 0 would exceed allowed memory. (out of memory)", "https://github.com/kijai/ComfyUI-FluxTrainer/issues/98", KindDevice},
	// TensorFlow GPU allocators.
	{"OOM when allocating tensor with shape[3,3,512,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc [Op:Mul]", "https://github.com/tensorflow/tensorflow/issues/47820", KindDevice},
	{`ResourceExhaustedError (see above for traceback): OOM when allocating tensor with shape[123008,500] [[Node: training_10/Adam/mul_23 = Mul[T=DT_FLOAT, _device="/job:localhost/replica:0/task:0/device:GP`, "https://github.com/tensorflow/tensor2tensor/issues/782", KindDevice},
	{"ResourceExhaustedError (see above for traceback): OOM when allocating tensor with shape[2048,1024]", "https://github.com/bshao001/ChatLearner/issues/34", KindDevice},
	{"tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor of shape [4096] and type float", "https://github.com/lc222/seq2seq_chatbot_new/issues/19", KindDevice},
	{"(pid=4241) 2021-01-25 03:36:41.436526: I tensorflow/stream_executor/cuda/cuda_driver.cc:775] failed to allocate 3.88G (4162022400 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory", "https://github.com/ray-project/ray/issues/13680", KindDevice},
	{"2019-07-21 23:26:35.082216: E tensorflow/stream_executor/cuda/cuda_driver.cc:828] failed to allocate 159.69M (167444480 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory", "https://github.com/tensorflow/tensorflow/issues/30912", KindDevice},
	{`2018-03-14 11:33:52.456418: E c:\users\u\bin\tensorflow\tensorflow\stream_executor\cuda\cuda_driver.cc:924] failed to allocate 968.17M (1015196672 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY`, "https://github.com/ymgaq/AQ/issues/91", KindDevice},
	{": F tensorflow/core/common_runtime/gpu/gpu_device.cc:103] EigenAllocator for GPU ran out of memory when allocating 0. See error logs for more detailed info.", "https://github.com/CharlesShang/FastMaskRCNN/issues/129", KindDevice},
	{`E c:\tf_jenkins\home\workspace\release-win\device\gpu\os\windows\tensorflow\stream_executor\cuda\cuda_blas.cc:372] failed to create cublas handle: CUBLAS_STATUS_ALLOC_FAILED`, "https://github.com/tensorflow/tensorflow/issues/7072", KindDevice},
	{"Could not create cudnn handle: CUDNN_STATUS_ALLOC_FAILED", "https://github.com/kbardool/Keras-frcnn/issues/97", KindDevice},
	{"Keras Tensorflow R Could not create cudnn handle: CUDNN_STATUS_ALLOC_FAILED", "https://github.com/tensorflow/tensorflow/issues/30523", KindDevice},
	// JAX / XLA.
	{"jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 6291456 bytes.", "https://github.com/jax-ml/jax/issues/13428", KindDevice},
	{"jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7406166528 bytes.", "https://github.com/google-deepmind/alphafold/issues/1023", KindDevice},
	{"RuntimeError: Resource exhausted: Out of memory while trying to allocate 12582912 bytes.", "https://github.com/google-deepmind/alphafold/issues/197", KindDevice},
	{"2021-10-15 15:01:44.577626: E external/org_tensorflow/tensorflow/stream_executor/cuda/cuda_driver.cc:764] failed to alloc 2740606464 bytes unified memory; result: CUDA_ERROR_OUT_OF_MEMORY: out of memory", "https://github.com/google-deepmind/alphafold/issues/197", KindDevice},
	{"2021-07-21 16:15:16.513776: E external/org_tensorflow/tensorflow/compiler/xla/pjrt/pjrt_stream_executor_client.cc:1981] Execution of replica 0 failed: Resource exhausted: Failed to allocate request for 32.00MiB (33554432B) on device ordinal 0", "https://github.com/kingoflolz/mesh-transformer-jax/issues/66", KindDevice},
	{"RESOURCE_EXHAUSTED: Failed to allocate request for 256.00MiB (268435456B) on device ordinal 0", "https://github.com/kingoflolz/mesh-transformer-jax/issues/209", KindDevice},
	{"2025-03-23 20:28:59.832181: W external/xla/xla/tsl/framework/bfc_allocator.cc:501] Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.25TiB (rounded to 1374521760000)requested by op ", "https://github.com/jax-ml/jax/issues/27354", KindDevice},
	{"jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 3199993600 bytes.", "https://github.com/flatironinstitute/nemos/issues/345", KindDevice},
	// llama.cpp and ollama.
	{"ggml_backend_cuda_buffer_type_alloc_buffer: allocating 144817.04 MiB on device 0: cudaMalloc failed: out of memory", "https://github.com/ggml-org/llama.cpp/issues/20431", KindDevice},
	{"alloc_tensor_range: failed to allocate CUDA0 buffer of size 151851674624", "https://github.com/ggml-org/llama.cpp/issues/20431", KindDevice},
	{"llama_model_load: error loading model: unable to allocate CUDA0 buffer", "https://github.com/ggml-org/llama.cpp/issues/20431", KindDevice},
	{"1.06.520.077 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 51748.72 MiB on device 1: cudaMalloc failed: out of memory", "https://github.com/ggml-org/llama.cpp/pull/26297", KindDevice},
	{"1.06.520.084 E ggml_gallocr_reserve_n_impl: failed to allocate CUDA1 buffer of size 54262464512", "https://github.com/ggml-org/llama.cpp/pull/26297", KindDevice},
	{"   ggml_backend_cuda_buffer_type_alloc_buffer: allocating 204800.00 MiB on device 0: cudaMalloc failed: out of memory", "https://github.com/abetlen/llama-cpp-python/issues/1944", KindDevice},
	{"cudaMalloc failed: out of memory - ubuntu server - 4 16 GB GPUs & 768 GB RAM - deepseek-r1:671b", "https://github.com/ollama/ollama/issues/9295", KindDevice},
	{"CUDA error: out of memory after b1697", "https://github.com/ggml-org/llama.cpp/issues/4680", KindDevice},
	{"WSL: CUDA error 2 at ggml-cuda.cu:359: out of memory", "https://github.com/ggml-org/llama.cpp/issues/1230", KindDevice},
	// vLLM start-up.
	{"vllm-1  | ERROR 11-18 18:07:28 engine.py:366] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.", "https://github.com/vllm-project/vllm/issues/10439", KindProcessCap},
	{`raise ValueError("No available memory for the cache blocks. " ValueError: No available memory for the cache blocks. Try increasing ` + "`gpu_memory_utilization`" + ` when initializing the engine.`, "https://github.com/QwenLM/Qwen3/issues/12", KindProcessCap},
	{"(EngineCore_DP0 pid=1094) ValueError: To serve at least one request with the models's max seq len (262144), (24.0 GiB KV cache is needed, which is larger than the available KV cache memory (3.18 GiB). Based on the available memory, the estimated maximum model length is 34736.", "https://github.com/vllm-project/vllm/issues/34076", KindProcessCap},
	{"ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in KV cache (7344). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.", "https://github.com/QwenLM/Qwen3/issues/295", KindProcessCap},
	{"ValueError: The model's max seq len (163840) is larger than the maximum number of tokens that can be stored in KV cache (13360). Try increasing gpu_memory_utilization or decreasing max_model_len when", "https://github.com/deepseek-ai/DeepSeek-V2/issues/83", KindProcessCap},
	{"[release 2.11][vllm] Distributed failures - free memory on device cuda:0 (19.77/22.05 GiB) on startup is less than desired GPU memory utilization (0.9, 19.84 GiB)", "https://github.com/pytorch/pytorch/issues/175666", KindDevice},
	// ONNX Runtime.
	{"onnx runtime error 6: Non-zero status code returned while running Mul node. Name:'Mul_8702' Status Message: /workspace/onnxruntime/onnxruntime/core/framework/bfc_arena.cc:368 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*, bool, onnxruntime::WaitNotificationFn) Failed to allocate memory for requested buffer of size 2830172160", "https://github.com/microsoft/onnxruntime/issues/20038", KindDevice},
	{"Non-zero status code returned while running ReduceSum node. onnxruntime::BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer of size 939524096", "https://github.com/microsoft/onnxruntime/issues/16307", KindDevice},
	{"/onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:368 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*, bool, onnxruntime::WaitNotificationFn) Failed to allocate memory for requested buffer of size 15728896", "https://github.com/triton-inference-server/onnxruntime_backend/issues/249", KindDevice},
	// TensorRT.
	{"ERROR: [TRT]: 2: [virtualMemoryBuffer.cpp::resizePhysical::160] Error Code 2: OutOfMemory (no further information)", "https://github.com/marcoslucianops/DeepStream-Yolo/issues/366", KindDevice},
	{"[09/04/2023-22:30:21] [TRT] [E] 2: [virtualMemoryBuffer.cpp::nvinfer1::StdVirtualMemoryBufferImpl::resizePhysical::145] Error Code 2: OutOfMemory (no further information)", "https://github.com/Kiteretsu77/FAST_Anime_VSR/issues/9", KindDevice},
	{"E:onnxruntime:Default, tensorrt_execution_provider.h:50 log] [2022-03-04 13:39:28 ERROR] ../rtSafe/safeRuntime.cpp (25) - Cuda Error in allocate: 2 (out of memory)", "https://github.com/microsoft/onnxruntime/issues/10770", KindDevice},
	{`[E] [TRT] C:\source\rtSafe\safeRuntime.cpp (25) - Cuda Error in nvinfer1::internal::DefaultAllocator::allocate: 2 (out of memory)`, "https://github.com/NVIDIA/TensorRT/issues/948", KindDevice},
	{"[TensorRT] ERROR: ../rtSafe/WeightsPtr.cpp (92) - OutOfMemory Error in allocate: 0", "https://github.com/NVIDIA-AI-IOT/torch2trt/issues/661", KindDevice},
	// FFmpeg NVENC / NVDEC and the Video Codec SDK.
	{"[h264_nvenc @ 0x46d8300] OpenEncodeSessionEx failed: out of memory (10): (no details)", "https://github.com/joinhive-ai/transcoder/issues/4", KindEncoderSession},
	{"[h264_nvenc @ 0x5601aa5b40c0] OpenEncodeSessionEx failed: out of memory (10)", "https://github.com/valkjsaaa/auto-bilibili-recorder/issues/9", KindEncoderSession},
	{"[h264_nvenc @ 0x6090380] InitializeEncoder failed: out of memory (10): ", "https://github.com/joinhive-ai/transcoder/issues/8", KindEncoderSession},
	{"nvenc : Error on nvEncOpenEncodeSessionEx: 10 (NVENC indicates that the API call failed because it was unable to allocate enough memory to perform the requested operation.)", "https://github.com/rigaya/NVEnc/issues/439", KindEncoderSession},
	{"Error on NvEncOpenEncodeSessionEx(device_type=NV_ENC_DEVICE_TYPE_CUDA): 10 (NVENC indicates that the API call failed because it was unable to allocate enough memory to perform the requested operation.)", "https://github.com/rigaya/NVEnc/issues/173", KindEncoderSession},
	{"NvEncoder : m_nvenc.nvEncOpenEncodeSessionEx(&encodeSessionExParams, &hEncoder) returned error 10", "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/415", KindEncoderSession},
	{"NV_ENC_ERR_OUT_OF_MEMORY", "https://github.com/facebookarchive/360-Capture-SDK/issues/43", KindEncoderSession},
	{"cuvid: Failed cuvidCreateDecoder 2 (CUDA_ERROR_OUT_OF_MEMORY)", "https://github.com/Nevcairiel/LAVFilters/issues/99", KindDevice},
	// CTranslate2 / faster-whisper.
	{"RuntimeError: CUDA failed with error out of memory", "https://github.com/SYSTRAN/faster-whisper/issues/442", KindDevice},
	{"RuntimeError: CUDA failed with error out of memory 2x rtx 4090", "https://github.com/m-bain/whisperX/issues/504", KindDevice},
	{"Cuda failed with error out of memory", "https://github.com/m-bain/whisperX/issues/315", KindDevice},
	{"cuda failed with error 2 out of memory. use CUDA_LAUNCH_BLOCKING=1 to get correct traceback.", "https://github.com/junjie18/CMT/issues/15", KindDevice},
	// CuPy.
	{`"cupy.cuda.memory.OutOfMemoryError: out of memory to allocate 1073741824 bytes (total 12373894656 bytes)"`, "https://github.com/cupy/cupy/issues/1912", KindDevice},
	{"Exception in main training loop: Out of memory allocating 25,600,000 bytes (allocated so far: 3,635,267,072 bytes).", "https://github.com/cupy/cupy/issues/2537", KindDevice},
	{"Exception in main training loop: out of memory to allocate 163840000 bytes (total 1673061376 bytes)", "https://github.com/motokimura/spacenet_building_detection/issues/3", KindDevice},
	{"cupy.cuda.runtime.CUDARuntimeError: cudaErrorMemoryAllocation: out of memory", "https://github.com/cupy/cupy/pull/314", KindDevice},
	{"cupy.cuda.memory.OutOfMemoryError in forward", "https://github.com/oreilly-japan/deep-learning-from-scratch-2/issues/16", KindDevice},
	// PaddlePaddle and Caffe.
	{"Out of memory error on GPU 0. Cannot allocate 3.125000GB memory on GPU 0, available memory is only 117.750000MB.", "https://github.com/PaddlePaddle/PaddleOCR/issues/645", KindDevice},
	{"Out of memory error on GPU 0. Cannot allocate 98.000244MB memory on GPU 0, 6.000000GB memory has been allocated and available memory is only 0.000000B.", "https://github.com/PaddlePaddle/Paddle/issues/42228", KindDevice},
	{"Out of memory error on GPU 0. Cannot allocate 145.468994MB GPU memory, available memory is 72.312500MB.", "https://github.com/PaddlePaddle/Paddle/pull/19779", KindDevice},
	{"Check failed: cudaSuccess == cudaStat (0 vs. 2) Cuda Error: out of memory", "https://github.com/PaddlePaddle/Paddle/issues/8949", KindDevice},
	{"F0304 14:26:21.611594  4889 syncedmem.cpp:71] Check failed: error == cudaSuccess (2 vs. 0)  out of memory", "https://github.com/houqb/DSS/issues/25", KindDevice},
	// darknet.
	{"    0 CUDA Error: out of memory", "https://github.com/pjreddie/darknet/issues/499", KindDevice},
	{`   29 CUDA Error: out of memory`, "https://github.com/pjreddie/darknet/issues/1796", KindDevice},
	// OptiX, Cycles and other renderers on the driver API.
	{"[2023-08-01 16:53:30.067] [console] [error] OPTIX_ERROR_DEVICE_OUT_OF_MEMORY: Device out of memory [/media/liusheng/Projects/project/game_engines/LuisaRender/github/LuisaGroup/LuisaRender/LuisaRender/src/compute/src/backe", "https://github.com/LuisaGroup/LuisaRender/issues/18", KindDevice},
	{"[2023-08-01 16:53:30.057] [console] [warning] Logs from OptiX (ACCEL): Error launching command list (CUDA error string: out of memory, CUDA error code: 2)", "https://github.com/LuisaGroup/LuisaRender/issues/18", KindDevice},
	{"[2023-08-01 10:28:19.473] [console] [error] CUDA_ERROR_OUT_OF_MEMORY: out of memory [/media/liusheng/Projects/project/game_engines/LuisaRender/github/LuisaGroup/LuisaRender/LuisaRender/src/compute/src/backends/cuda/cuda_buffer.cpp:9]", "https://github.com/LuisaGroup/LuisaRender/issues/18", KindDevice},
	{`  what():  Memory allocation failed (Details: Function "RTresult _rtBufferCreate(RTcontext, unsigned int, RTbuffer_api**)" caught exception: Encountered a CUDA error: cudaDriver().CuDevicePrimaryCtxRetain( &context, dev.get() ) returned (2): Out of memory`, "https://github.com/lzqsd/VirtualObjectInsertion/issues/1", KindDevice},
	{`Out of memory in cuStreamCreate(&cuda_stream_, CU_STREAM_NON_BLOCKING) (C:\Users\blender\git\blender-v410\blender.git\intern\cycles\device\cuda\queue.cpp:21)`, "https://github.com/vosen/ZLUDA/issues/223", KindDevice},
	{"CUDA error at cuCtxCreate: Out of memory", "https://github.com/zju3dv/pvnet-rendering/issues/13", KindDevice},
	{"Crash while rendering CUDA Driver API error out of memory code 2", "https://github.com/LuxCoreRender/LuxCore/issues/372", KindDevice},
	// The driver API directly.
	{"[torch_memory_saver.cpp] CUresult error  result=2 file=csrc/torch_memory_saver.cpp func=cu_mem_create line=103 (5)", "https://github.com/fzyzcjy/torch_memory_saver/issues/4", KindDevice},
	{"numba.cuda.cudadrv.driver.CudaAPIError: [2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY", "https://github.com/rapidsai/dask-cuda/issues/225", KindDevice},
	{"[KeOps] error: cuMemAlloc(&p_data, sizeof(TYPE *) * nargs) failed with error CUDA_ERROR_OUT_OF_MEMORY", "https://github.com/fwilliams/scalable-pytorch-sinkhorn/issues/2", KindDevice},
	{` Uncaught exception: C:\ngp\instant-ngp\dependencies\tiny-cuda-nn\include\tiny-cuda-nn/gpu_memory.h:592 cuMemSetAccess(m_base_address + m_size, n_bytes_to_allocate, &access_desc, 1) failed with error CUDA_ERROR_OUT_OF_MEMORY`, "https://github.com/NVlabs/instant-ngp/issues/1231", KindDevice},
	{"failed to allocate 17.79G (19104890880 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory", "https://github.com/philip-huang/PIXOR/issues/31", KindDevice},
	// cuBLAS (CNTK's wording) and NCCL.
	{"RuntimeError: CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED ; GPU=0 ; ", "https://github.com/microsoft/CNTK/issues/1688", KindDevice},
	{"ng30903:3063028:3066152 [3] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'", "https://github.com/NVIDIA/nccl/issues/1235", KindDevice},
	{"ng30903:3063028:3066152 [3] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 6291456 bytes", "https://github.com/NVIDIA/nccl/issues/1235", KindDevice},
	{"VM-0-16-ubuntu:392:494 [2] enqueue.cc:43 NCCL WARN Cuda failure 'out of memory'", "https://github.com/NVIDIA/TensorRT-LLM/issues/1670", KindDevice},
	{"ins-7df6eojsifuykig9:3018451:3018451 [0] enqueue.cc:1085 NCCL WARN Cuda failure 'out of memory'", "https://github.com/PKU-YuanGroup/Open-Sora-Plan/issues/386", KindDevice},
	// Servers, training libraries and media tools beyond the frameworks above.
	{`RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.`, "https://github.com/sgl-project/sglang/issues/4330", KindProcessCap},
	{"RuntimeError: Not enough memory to handle 4096 prefill tokens. You need to decrease `--max-batch-prefill-tokens`", "https://github.com/huggingface/text-generation-inference/issues/1067", KindDevice},
	{"Error: Warmup(Generation(\"Not enough memory to handle 4096 prefill tokens. You need to decrease `--max-batch-prefill-tokens`\"))", "https://github.com/huggingface/text-generation-inference/issues/755", KindDevice},
	{`[2026-02-24T20:21:58Z] (EngineCore_DP0 pid=6940) ValueError: Free memory on device cuda:1 (19.77/22.05 GiB) on startup is less than desired GPU memory utilization (0.9, 19.84 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.`, "https://github.com/pytorch/pytorch/issues/175666", KindDevice},
	{`[TensorRT-LLM][ERROR] [TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): out of memory (/data/TensorRT-LLM/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)`, "https://github.com/NVIDIA/TensorRT-LLM/issues/498", KindDevice},
	{`RuntimeError: [TensorRT-LLM][ERROR] CUDA runtime error in error: out of memory (/home/jenkins/agent/workspace/LLM/main/L0_PostMerge/tensorrt_llm/cpp/tensorrt_llm/runtime/ipcUtils.cpp:48)`, "https://github.com/NVIDIA/TensorRT-LLM/issues/1060", KindDevice},
	{`[07/08/2025-19:47:15] [TRT-LLM] [RANK 1] [E] Failed to initialize executor on rank 1: Executor creation failed due to insufficient GPU memory.`, "https://github.com/NVIDIA/TensorRT-LLM/issues/5872", KindDevice},
	{`Model 'tensorrt_llm' loading failed with error: version 1 is at UNAVAILABLE state: Internal: unexpected error when creating modelInstanceState: [TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): out of memory (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)`, "https://github.com/triton-inference-server/tensorrtllm_backend/issues/281", KindDevice},
	{`[05/08/2024-20:47:56] [TRT] [E] 1: [defaultAllocator.cpp::allocate::19] Error Code 1: Cuda Runtime (out of memory)`, "https://github.com/pytorch/TensorRT/issues/2836", KindDevice},
	{`RuntimeError: Insufficient VRAM for model and cache`, "https://github.com/turboderp-org/exllamav2/issues/383", KindDevice},
	{`mlc-llm/tvm/src/runtime/cuda/cuda_device_api.cc:129: InternalError: Check failed: (e == cudaSuccess || e == cudaErrorCudartUnloading) is false: CUDA: out of memory`, "https://github.com/mlc-ai/mlc-llm/issues/1462", KindDevice},
	{`RuntimeError: CUDA failed with error out of memory`, "https://github.com/SYSTRAN/faster-whisper/issues/442", KindDevice},
	{`Processing Prompt [BLAS] (3584 / 5525 tokens)CUDA error: out of memory`, "https://github.com/LostRuins/koboldcpp/issues/612", KindDevice},
	{`Error: llama runner process has terminated: CUDA error: out of memory`, "https://github.com/ollama/ollama/issues/9782", KindDevice},
	{`mxnet.base.MXNetError: [18:53:03] src/storage/./pooled_storage_manager.h:157: cudaMalloc failed: out of memory`, "https://github.com/apache/mxnet/issues/17126", KindDevice},
	{`MemoryError: std::bad_alloc: out_of_memory: CUDA error at: /usr/local/miniconda3/envs/rapids-22.02/include/rmm/mr/device/cuda_memory_resource.hpp`, "https://github.com/NVIDIA/cudf/issues/10517", KindDevice},
	{`MemoryError: std::bad_alloc: RMM failure at:/home/adolf/cupoch/third_party/rmm/include/rmm/mr/device/pool_memory_resource.hpp:179: Maximum pool size exceeded`, "https://github.com/neka-nat/cupoch/issues/98", KindProcessCap},
	{`  what():  parallel_for failed: out of memory`, "https://github.com/rapidsai/rmm/issues/130", KindDevice},
	{`../src/tree/updater_gpu_hist.cu:784: Exception in gpu_hist: [11:01:50] ../src/c_api/../data/../common/device_helpers.cuh:431: Memory allocation error on worker 0: std::bad_alloc: cudaErrorMemoryAllocation: out of memory`, "https://github.com/dmlc/xgboost/issues/8484", KindDevice},
	{`terminate called after throwing an instance of 'thrust::system::detail::bad_alloc'`, "https://github.com/dmlc/xgboost/issues/4184", KindDevice},
	{`(NCudaLib::TOutOfMemoryError) /src/catboost/catboost/cuda/cuda_lib/memory_pool/stack_like_memory_pool.h:303: Error: Out of memory. Requested 8880 MB; Free 5902.061425 MB`, "https://github.com/catboost/catboost/issues/2750", KindProcessCap},
	{`Application terminated with error: (NCudaLib::TOutOfMemoryError) catboost/cuda/cuda_lib/memory_pool/stack_like_memory_pool.h:294: Error: Out of memory. Requested 1070.546387; Free 1010.952393`, "https://github.com/catboost/catboost/issues/302", KindProcessCap},
	{`  what():  Memory Object Allocation Failure`, "https://github.com/lightgbm-org/LightGBM/issues/4480", KindDevice},
	{`RuntimeError: Critical error in pipeline: CUDA allocation failed`, "https://github.com/NVIDIA/DALI/issues/144", KindDevice},
	{`Can't allocate 129499136 bytes on device 0.`, "https://github.com/NVIDIA/DALI/issues/1137", KindDevice},
	{`cuvid: Failed cuvidCreateDecoder 2 (CUDA_ERROR_OUT_OF_MEMORY)`, "https://github.com/Nevcairiel/LAVFilters/issues/99", KindDevice},
	{`  what():  OpenCV(3.4.13) /home/mwy/opencv-3.4.13/modules/core/src/cuda/gpu_mat.cu:116: error: (-217:Gpu API call) out of memory in function 'allocate'`, "https://github.com/xuhao1/VINS-Fisheye/issues/16", KindDevice},
	{`System is out of GPU and shared host memory`, "https://github.com/ynshung/blender-colab/issues/5", KindDevice},
	{`torch.cuda.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)`, "https://github.com/Comfy-Org/ComfyUI/issues/2021", KindDevice},
	// PyTorch with a per-process fraction set ("allowed;"): its own cap when
	// the GPU had the room, the GPU full otherwise (torchKind).
	{`batch{batch_size=1}:prefill:prefill{id=13 size=1}:prefill{id=13 size=1}: lorax_client: router/client/src/lib.rs:33: Server error: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 47.54 GiB total capacity; 23.68 GiB already allocated; 23.44 GiB free; 23.77 GiB allowed; 23.77 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF`, "https://github.com/predibase/lorax/pull/94", KindProcessCap},
	{`2023-07-19T21:02:09.363452Z ERROR batch{batch_size=1}:prefill:prefill{id=9 size=1}:prefill{id=9 size=1}: text_generation_client: router/client/src/lib.rs:33: Server error: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 22.20 GiB total capacity; 20.75 GiB already allocated; 3.12 MiB free; 22.20 GiB allowed; 20.86 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF`, "https://github.com/huggingface/text-generation-inference/issues/653", KindDevice},
	{`OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB (GPU 3; 11.93 GiB total capacity; 10.67 GiB already allocated; 515.38 MiB free; 11.93 GiB allowed; 10.92 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF`, "https://github.com/pytorch/pytorch/issues/111729", KindDevice},
	{`torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 GiB (GPU 0; 23.99 GiB total capacity; 7.85 GiB already allocated; 14.25 GiB free; 21.59 GiB allowed; 8.14 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF`, "https://github.com/zsyOAOA/ResShift/issues/13", KindDevice},
	{`:infer:send_error: text_generation_router::infer: router/src/infer.rs:554: Request failed during generation: Server error: CUDA out of memory. Tried to allocate 16.00 MiB (GPU 0; 22.20 GiB total capacity; 20.75 GiB already allocated; 5.12 MiB free; 22.20 GiB allowed; 20.86 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF`, "https://github.com/huggingface/text-generation-inference/issues/653", KindDevice},
	{`torch.cuda.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)`, "https://github.com/AIFSH/ComfyUI-ChatTTS/issues/9", KindDevice},
	{`torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)`, "https://github.com/richservo/rs-nodes/issues/4", KindDevice},
}

// realNegatives look like memory failures but are not GPU OOMs: host and
// cgroup OOM, other runtimes' heaps, shared memory, quotas, pinned host
// memory, CPU allocators, TPU, and near-misses of the GPU signatures.
var realNegatives = []realMessage{
	{"[ 7063.247407] Memory cgroup out of memory: Killed process 63214 (uwsgi) total-vm:3149468kB, anon-rss:164992kB, file-rss:52176kB, shmem-rss:92kB, UID:0 pgtables:1372kB oom_score_adj:986", "https://github.com/reportportal/kubernetes/issues/203", ""},
	{"[ 7093.543707] uwsgi invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=986", "https://github.com/reportportal/kubernetes/issues/203", ""},
	{"(Crashing on Low Memory SBC) main invoked oom-killer: gfp_mask=0x1100dca(GFP_HIGHUSER_MOVABLE|__GFP_ZERO), order=0, oom_score_adj=0", "https://github.com/b4rtaz/distributed-llama/issues/59", ""},
	{"[Thu Dec  7 00:05:15 2017] Memory cgroup out of memory: Kill process 24572 (java) score 0 or sacrifice child", "https://github.com/kubernetes/kubernetes/issues/56891", ""},
	{"[Thu Dec  7 00:05:15 2017] [ pid ]   uid  tgid total_vm      rss nr_ptes swapents oom_score_adj name", "https://github.com/kubernetes/kubernetes/issues/56891", ""},
	{"Warning OOMKilling  Memory cgroup out of memory: Kill process 4481 (stress) score 1994 or sacrifice child", "https://github.com/kubernetes/website/pull/12576", ""},
	{"Jan  5 02:12:02 iZbp153spuk45ulvkwxf34Z kernel: memory: usage 1048576kB, limit 1048576kB, failcnt 189", "https://github.com/istio/istio/issues/42734", ""},
	{`        "OOMKilled": false,`, "https://github.com/kubernetes/kubernetes/issues/19825", ""},
	{"LastState: map[terminated:map[exitCode:137 reason:OOM Killed startedAt:2015-07-07T20:58:43Z finishedAt:2015-07-07T20:58:43Z containerID:docker://0e4095bba1feccdfe7ef9fb6ebffe972b4b14285d5acdec6f0d3ae8a22fad8b2]]", "https://github.com/ContainerSolutions/runbooks/issues/45", ""},
	{"OpenJDK 64-Bit Server VM warning: INFO: os::commit_memory(0x00000000c5330000, 181207040, 0) failed; error='Cannot allocate memory' (errno=12)", "https://github.com/hyperhq/hyperd/issues/130", ""},
	{"# There is insufficient memory for the Java Runtime Environment to continue.", "https://github.com/tobert/cassandra-docker/issues/8", ""},
	{"# Native memory allocation (malloc) failed to allocate 3293577216 bytes for committing reserved memory.", "https://github.com/tobert/cassandra-docker/issues/8", ""},
	{"FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory", "https://github.com/slidevjs/slidev/issues/1790", ""},
	{"FATAL ERROR: Ineffective mark-compacts near heap limit Allocation failed - JavaScript heap out of memory", "https://github.com/vtex/toolbelt/issues/1166", ""},
	{"RuntimeError: DataLoader worker (pid 46794) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.", "https://github.com/hkchengrex/STCN/issues/132", ""},
	{"ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).", "https://github.com/open-mmlab/mmsegmentation/issues/1356", ""},
	{"RuntimeError: [enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 132426121216 bytes. Error code 12 (Cannot allocate memory)", "https://github.com/mxfold/mxfold2/issues/20", ""},
	{"DefaultCPUAllocator: not enough memory: you tried to allocate 5077901088 bytes.", "https://github.com/IvanoLauriola/MKLpy/issues/27", ""},
	{"If you encounter CUDA out of memory, try to set --tile with a smaller number.", "https://github.com/xinntao/Real-ESRGAN/issues/272", ""},
	{"2019-01-23 21:21:10.376879: W tensorflow/core/framework/allocator.cc:101] Allocation of 79148544 exceeds 10% of system memory.", "https://github.com/stephen-v/tensorflow_alexnet_classify/issues/4", ""},
	{"grpc._channel._Rendezvous: <_Rendezvous of RPC that terminated with (StatusCode.RESOURCE_EXHAUSTED, Resource has been exhausted (e.g check quota).)>", "https://github.com/GoogleCloudPlatform/python-docs-samples/issues/1238", ""},
	{"2017/11/30 13:19:18 rpc error: code = ResourceExhausted desc = Quota exceeded.", "https://github.com/googleapis/google-cloud-go/issues/815", ""},
	{"2026-01-25T17:42:14.231+0300 [QUIET] [system.out] io.grpc.StatusException: RESOURCE_EXHAUSTED: ResourceExhausted", "https://github.com/D00mch/souz/issues/270", ""},
	{"RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem.", "https://github.com/pytorch/xla/issues/9524", ""},
	// XLA's BFC allocator on a retried or optional allocation: no failure.
	{"2025-05-18 21:59:55.086788: W external/xla/xla/tsl/framework/bfc_allocator.cc:310] Allocator (GPU_0_bfc) ran out of memory trying to allocate 3.37GiB with freed_by_count=0. The caller indicates that this is not a failure, but this may mean that there could be performance gains if more memory were available.", "https://github.com/flatironinstitute/nemos/issues/345", ""},
	// XLA's rematerialization pass reports what it could not save; the
	// allocation that may follow is counted on its own lines.
	{"2025-03-23 20:28:49.804627: W external/xla/xla/hlo/transforms/simplifiers/hlo_rematerialization.cc:3021] Can't reduce memory use below 0B (0 bytes) by rematerialization; only reduced to 1.25TiB (1374521760000 bytes), down from 1.25TiB (1374521760000 bytes) originally", "https://github.com/jax-ml/jax/issues/27354", ""},
	// Pinned host memory.
	{"WARNING: failed to allocate 1024.00 MB of pinned memory: out of memory", "https://github.com/ggml-org/llama.cpp/pull/1233", ""},
	{"WARNING: failed to allocate 4096.02 MB of pinned memory: out of memory", "https://github.com/ollama/ollama/issues/1955", ""},
	{"Bug: ggml_cuda_host_malloc: failed to allocate 1900,00 MiB of pinned memory: invalid argument", "https://github.com/ggml-org/llama.cpp/issues/9629", ""},
	{"0.05.025.382 W ggml_cuda_moe_cached_pinned_malloc: failed to allocate 24000.00 MiB of pinned memory: out of memory; using pageable cached fallback", "https://github.com/GenerelSchwerz/llama.cpp/issues/101", ""},
	{"ggml_vulkan: Failed to allocate pinned memory.", "https://github.com/ggml-org/llama.cpp/issues/9271", ""},
	{"2022-06-16 02:36:14.576914: E tensorflow/stream_executor/cuda/cuda_driver.cc:893] failed to alloc 966367744 bytes on host: CUDA_ERROR_OUT_OF_MEMORY: out of memory", "https://github.com/Accenture/AIR/issues/7", ""},
	{"2024-10-22 09:22:17.233972: E tensorflow/stream_executor/cuda/cuda_driver.cc:802] failed to alloc 34359738368 bytes on host: CUDA_ERROR_OUT_OF_MEMORY: out of memory", "https://github.com/talmolab/sleap/issues/2001", ""},
	{"2022-06-28 17:20:07.861732: W external/org_tensorflow/tensorflow/core/common_runtime/device/device_host_allocator.h:46] could not allocate pinned host memory of size: 221074944", "https://github.com/jina-ai/dalle-flow/issues/57", ""},
	// TensorFlow's CPU allocator and its not-a-failure warning.
	{"tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[16,19,19,1024] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu", "https://github.com/thtrieu/darkflow/issues/873", ""},
	{"OOM when allocating tensor with shape[24,1,2304,1152,3] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu", "https://github.com/tensorflow/models/issues/6450", ""},
	{"2020-09-24 21:35:23.363348: W tensorflow/core/common_runtime/bfc_allocator.cc:246] Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.02GiB with freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be performance gains if more memory were available.", "https://github.com/tensorflow/tensorflow/issues/43546", ""},
	// Near-misses of GPU signatures.
	{"tritonclient.utils.InferenceServerException: [StatusCode.INTERNAL] onnx runtime error 2: not enough space: expected 270080, got 261760", "https://github.com/triton-inference-server/onnxruntime_backend/issues/95", ""},
	{"[h264_nvenc @ 0x5601aa5b40c0] No NVENC capable devices found", "https://github.com/valkjsaaa/auto-bilibili-recorder/issues/9", ""},
	{"CUDA Error Prev: an illegal memory access was encountered", "https://github.com/AlexeyAB/darknet/issues/3259", ""},
	{"failed to create cublas handle: CUBLAS_STATUS_NOT_INITIALIZED", "https://github.com/tensorflow/tensorflow/issues/9489", ""},
	{"2019-01-23 21:21:11.073710: E tensorflow/stream_executor/cuda/cuda_dnn.cc:455] could not create cudnn handle: CUDNN_STATUS_NOT_INITIALIZED", "https://github.com/stephen-v/tensorflow_alexnet_classify/issues/4", ""},
	{"(train_rft pid=2657296) 2024-05-11 14:10:52.227 n176-080-198:2657296:2658232 [0] include/alloc.h:102 NCCL WARN Cuda failure 1 'invalid argument'", "https://github.com/NVIDIA/nccl/issues/1283", ""},
	{"HCA-14: Test NCCL failure common.cu:1204 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '", "https://github.com/NVIDIA/nccl-tests/issues/322", ""},
	{"2018-04-19 09:42:36.892859: E tensorflow/stream_executor/cuda/cuda_driver.cc:967] failed to alloc 2304 bytes on host: CUDA_ERROR_UNKNOWN", "https://github.com/rishizek/tensorflow-deeplab-v3-plus/issues/8", ""},
	// Near-misses from the same servers and libraries: other resources,
	// host memory, pinned host buffers, warnings that are no failure.
	// SGLang under load hands requests back to the queue and goes on.
	{"[2025-03-07 21:49:33 TP13] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.1474 -> 0.1845", "https://github.com/sgl-project/sglang/issues/4184", ""},
	{`[TensorRT-LLM][ERROR] CUDA runtime error in cudaSetDevice(device): invalid device ordinal (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/utils/sessionUtils.cpp:34)`, "https://github.com/NVIDIA/TensorRT-LLM/issues/1556", ""},
	{`WARNING: [TRT]: Skipping tactic 3 due to insufficient memory on requested size of 4294967296 detected for tactic 0x0000000000000004.`, "https://github.com/marcoslucianops/DeepStream-Yolo/issues/366", ""},
	{`[05:04:00] /home/local/llm/omniquant/mlc-llm/3rdparty/tvm/src/runtime/relax_vm/memory_manager.cc:115: InternalError: Check failed: (offset + needed_size <= this->buffer.size) is false: storage allocation failure, attempted to allocate 16785408 at offset 0 in region that is 16777216bytes`, "https://github.com/mlc-ai/mlc-llm/issues/860", ""},
	{`ggml_cuda_host_malloc: failed to allocate 349659.17 MiB of pinned memory: out of memory`, "https://github.com/ollama/ollama/issues/8964", ""},
	{`ggml_new_object: not enough space in the context's memory pool (needed 19176000, available 19136512)`, "https://github.com/leejet/stable-diffusion.cpp/issues/566", ""},
	{`2023-03-20 20:38:19,874] [WARNING] [stage3.py:1939:step] 13 pytorch allocator cache flushes since last step. this happens when there is high memory pressure and is detrimental to performance. if this is happening frequently consider adjusting settings to reduce memory consumption. If you are unable to make the cache flushes go away consider adding torch.cuda.empty_cache() calls in your training loop to ensure that all ranks flush their caches at the same time`, "https://github.com/huggingface/peft/issues/194", ""},
	{`XGBoostError: std::bad_alloc`, "https://github.com/dmlc/xgboost/issues/1032", ""},
	{`  what():  /home/chris/Downloads/xgboost/src/predictor/gpu_predictor.cu(322): unspecified launch failure`, "https://github.com/dmlc/xgboost/issues/2874", ""},
	{`lightgbm.basic.LightGBMError: Out of Host Memory`, "https://github.com/Kaggle/docker-python/pull/693", ""},
	{`W0121 22:12:18.273157 1 pinned_memory_manager.cc:271] Unable to allocate pinned system memory, pinned memory pool will not be available: operation not supported`, "https://github.com/triton-inference-server/server/issues/7958", ""},
	{`opencv/modules/core/src/cuda_host_mem.cpp:95: error: (-217:Gpu API call) out of memory in function 'allocate'`, "https://github.com/opencv/opencv/issues/23392", ""},
	{`RuntimeError: CUDA error: an illegal memory access was encountered`, "https://github.com/evo-design/evo/issues/136", ""},
	{`RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to allocate 31850496000 bytes.`, "https://github.com/Comfy-Org/Nvidia_RTX_Nodes_ComfyUI/issues/13", ""},
	{"triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 98304, Hardware limit: 49152. Reducing block sizes or `num_stages` may help.", "https://github.com/sasha0552/pascal-pkgs-ci/issues/50", ""},
	{`[441280.839852] Out of memory: Killed process 698405 (python) total-vm:49978204kB, anon-rss:12918388kB, file-rss:68668kB, shmem-rss:53352kB, UID:1000 pgtables:49772kB oom_score_adj:0`, "https://github.com/ShengcaiLiao/QAConv/issues/19", ""},
}

func TestCatalogueEntries(t *testing.T) {
	m, err := newMatcher(DefaultPatterns)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range Catalogue {
		t.Run(s.Software, func(t *testing.T) {
			if s.Example == "" || !strings.HasPrefix(s.Source, "https://") {
				t.Fatalf("entry %d has no real example with its source", i)
			}
			if (s.NearMiss == "") != (s.NearMissSource == "") {
				t.Errorf("entry %d: a near-miss needs its source and a source its near-miss", i)
			}
			if !regexp.MustCompile(s.Pattern).MatchString(s.Example) {
				t.Errorf("pattern %q does not match its example %q", s.Pattern, s.Example)
			}
			if got := m.kind([]byte(s.Example)); got != s.Kind {
				t.Errorf("example %q is of kind %q, want the entry's %q", s.Example, got, s.Kind)
			}
			if s.NearMiss != "" && m.match([]byte(s.NearMiss)) {
				t.Errorf("near-miss %q counts as a GPU OOM", s.NearMiss)
			}
			if s.Kind == KindUnknown {
				t.Errorf("entry %d has no kind", i)
			}
		})
	}
}

// The corpus is the measure of the catalogue: every real positive found
// with its kind, every real negative quiet.
func TestRealMessages(t *testing.T) {
	d, err := NewDetector(Config{})
	if err != nil {
		t.Fatal(err)
	}
	found, quiet := 0, 0
	for _, msg := range realPositives {
		kind, ok := d.Classify(msg.line)
		switch {
		case !ok:
			t.Errorf("missed %q (%s)", msg.line, msg.source)
		case kind != msg.kind:
			t.Errorf("%q (%s) is of kind %q, want %q", msg.line, msg.source, kind, msg.kind)
		default:
			found++
		}
	}
	for _, msg := range realNegatives {
		if d.Match(msg.line) {
			t.Errorf("counted %q (%s), which is no GPU OOM", msg.line, msg.source)
		} else {
			quiet++
		}
	}
	t.Logf("real positives detected: %d/%d; real negatives quiet: %d/%d", found, len(realPositives), quiet, len(realNegatives))
}

// Every catalogue pattern must be needed by some real positive, or a typo in
// one would go unnoticed behind the others.
func TestEveryPatternHasRealPositives(t *testing.T) {
	for _, s := range Catalogue {
		re := regexp.MustCompile(s.Pattern)
		n := 0
		for _, msg := range realPositives {
			if re.MatchString(msg.line) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("pattern %q (%s) matches none of realPositives", s.Pattern, s.Software)
		}
	}
}

func TestCorpusSources(t *testing.T) {
	for _, msg := range append(append([]realMessage{}, realPositives...), realNegatives...) {
		if !strings.HasPrefix(msg.source, "https://github.com/") {
			t.Errorf("%q has no public source: %q", msg.line, msg.source)
		}
	}
}

// Every default pattern must let the prefilter work: one pattern without a
// literal makes every line run the whole regular expression.
func TestDefaultPatternsHaveLiterals(t *testing.T) {
	for _, p := range DefaultPatterns {
		if requiredLiterals(p) == nil {
			t.Errorf("pattern %q has no required literal of %d bytes or more", p, minLiteral)
		}
	}
}

// A pattern copied from the catalogue into Config.Patterns keeps its kind;
// any other is KindUnknown.
func TestCustomPatternKinds(t *testing.T) {
	capPattern := Catalogue[0].Pattern
	if Catalogue[0].Kind != KindProcessCap {
		t.Fatalf("the catalogue's first entry is of kind %q; the test wants a cap", Catalogue[0].Kind)
	}
	d, err := NewDetector(Config{Patterns: []string{capPattern, `CUDA out of memory`, `GPU OOM in step`}})
	if err != nil {
		t.Fatal(err)
	}
	for line, want := range map[string]Kind{
		"ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.": KindProcessCap,
		"GPU OOM in step 3": KindUnknown,
		// A pattern outside the catalogue gets no refinement either.
		"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 996.00 MiB. GPU 0 has a total capacity of 44.43 GiB of which 9.06 GiB is free. 17.69 GiB allowed;": KindUnknown,
	} {
		if got, ok := d.Classify(line); !ok || got != want {
			t.Errorf("Classify(%q) = %q, %v; want %q, true", line, got, ok, want)
		}
	}
	// The cudaMallocAsync message raised as torch.OutOfMemoryError matches
	// both PyTorch signatures, and is of kind device either way.
	if got, _ := mustDetector(t).Classify("torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)"); got != KindDevice {
		t.Errorf("the cudaMallocAsync message raised as torch.OutOfMemoryError is of kind %q, want %q", got, KindDevice)
	}
	// Host memory lines stay out whatever the patterns.
	if d, _ := NewDetector(Config{Patterns: []string{`out of memory`}}); d.Match("WARNING: failed to allocate 1024.00 MB of pinned memory: out of memory") {
		t.Error("a custom pattern counted a pinned host memory line")
	}
}

func mustDetector(t *testing.T) *Detector {
	t.Helper()
	d, err := NewDetector(Config{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// torchKind reads PyTorch's own figures; the ROCm build prints the same
// message with HIP for CUDA, and its lines test the reading as well.
func TestTorchKind(t *testing.T) {
	for _, c := range []struct {
		line, source string
		want         Kind
	}{
		{"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.78 GiB. GPU 0 has a total capacity of 139.80 GiB of which 138.77 GiB is free. Process 811 has 528.00 MiB memory in use. Including non-PyTorch memory, this process has 518.00 MiB memory in use. 13.98 GiB allowed; Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.", "make test-gpu on an H200, PyTorch 2.11 (docs/real-gpu.md)", KindProcessCap},
		{"`torch.OutOfMemoryError: HIP out of memory. Tried to allocate 76.00 MiB. GPU 0 has a total capacity of 255.69 GiB of which 252.97 GiB is free. 1.20 GiB allowed; Of the allocated memory 1.14 GiB is allocated by PyTorch, with 17.00 MiB allocated in private pools (e.g., HIP Graphs), and 18.63 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)`", "https://github.com/pytorch/pytorch/pull/164000", KindProcessCap},
		{`2025-11-14T09:33:56.2332545Z FAILED [0.0003s] external-builds/pytorch/pytorch/test/test_autograd.py::TestAutogradDeviceTypeCUDA::test_parameter_resize_cuda - torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 23.41 GiB of which 21.22 GiB is free. 1.05 GiB allowed; Of the allocated memory 1017.01 MiB is allocated by PyTorch, with 17.00 MiB allocated in private pools (e.g., HIP Graphs), and 54.99 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)`, "https://github.com/ROCm/TheRock/issues/2118", KindProcessCap},
		// No fraction: the GPU, whatever the figures.
		{"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 496.00 MiB. GPU 0 has a total capacty of 14.75 GiB of which 235.06 MiB is free. Process 20398 has 14.52 GiB memory in use.", "https://github.com/FoundationVision/GenerateU/issues/10", KindDevice},
		{"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total capacity of 31.47 GiB of which 12.73 GiB is free. Including non-PyTorch memory, this process has 18.73 GiB memory in use. Of the allocated memory 9.08 GiB is allocated by PyTorch, and 9.35 GiB is reserved by PyTorch but unallocated.", "https://github.com/murong-xu/CADS/issues/4", KindDevice},
		// A fraction, but the figures cut off before the GPU's: unread.
		{"CUDA out of memory. Tried to allocate 2.00 MiB. 23.77 GiB allowed;", "the lorax line below, cut", KindDevice},
	} {
		if got := torchKind([]byte(c.line)); got != c.want {
			t.Errorf("torchKind(%q) (%s) = %q, want %q", c.line, c.source, got, c.want)
		}
	}
}

// The figures PyTorch's cudaMallocAsync backend prints after its OOM line,
// as they came: make test-gpu on an H200 with PyTorch 2.11 (docs/real-gpu.md),
// past a fraction of 0.1 and asking for twice the GPU, and two reports.
var (
	asyncPastFraction = []string{
		"Currently allocated     : 0 bytes",
		"Requested               : 16.78 GiB",
		"Device limit            : 139.80 GiB",
		"Free (according to CUDA): 33.83 GiB",
		"PyTorch limit (set by user-supplied memory fraction)",
		"                        : 13.98 GiB",
	}
	asyncGPUFull = []string{
		"Currently allocated     : 0 bytes",
		"Requested               : 279.60 GiB",
		"Device limit            : 139.80 GiB",
		"Free (according to CUDA): 31.12 MiB",
		"PyTorch limit (set by user-supplied memory fraction)",
		"                        : 17179869184.00 GiB",
	}
)

func TestTorchAsyncKind(t *testing.T) {
	for _, c := range []struct {
		source string
		after  []string
		want   Kind
	}{
		{"make test-gpu, past a fraction of 0.1", asyncPastFraction, KindProcessCap},
		{"make test-gpu, twice the GPU", asyncGPUFull, KindDevice},
		{"https://github.com/AIFSH/ComfyUI-ChatTTS/issues/9", []string{"Currently allocated     : 6.89 GiB", "Requested               : 320.00 MiB", "Device limit            : 23.69 GiB", "Free (according to CUDA): 2.94 MiB", "PyTorch limit (set by user-supplied memory fraction)", "                        : 17179869184.00 GiB"}, KindDevice},
		{"https://github.com/richservo/rs-nodes/issues/4", []string{"Currently allocated     : 10.48 GiB", "Requested               : 21.81 GiB", "Device limit            : 15.93 GiB", "Free (according to CUDA): 0 bytes", "PyTorch limit (set by user-supplied memory fraction)", "                        : 17179869184.00 GiB"}, KindDevice},
		// A fraction whose limit is read but a figure before it is not.
		{"make test-gpu's lines without Free", slices.Delete(slices.Clone(asyncPastFraction), 3, 4), KindDevice},
	} {
		var after [][]byte
		got, done := KindUnknown, false
		for _, l := range c.after {
			if done {
				t.Errorf("%s: answered %q before %q", c.source, got, l)
				break
			}
			after = append(after, []byte(l))
			got, done = torchAsyncKind(after)
		}
		if !done || got != c.want {
			t.Errorf("%s: torchAsyncKind = %q, %v; want %q, true", c.source, got, done, c.want)
		}
	}
}

// The lines after the message reach the event, in a log and in a
// termination message; with none, or past a Scan, the line's own kind.
func TestFollowingLines(t *testing.T) {
	const msg = "torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)"
	log := func(after []string) string {
		s := cri(time.Second, "stderr", "F", msg)
		for _, l := range after {
			s += cri(time.Second, "stderr", "F", l)
		}
		return s
	}
	t.Run("log", func(t *testing.T) {
		for _, c := range []struct {
			name  string
			after []string
			want  Kind
		}{
			{"past a fraction", asyncPastFraction, KindProcessCap},
			{"the GPU full", asyncGPUFull, KindDevice},
			{"no figures", []string{"Traceback (most recent call last):"}, KindDevice},
		} {
			t.Run(c.name, func(t *testing.T) {
				w, p, d := started(t, Config{})
				w.write(p, noise(0, 2)+log(c.after)+noise(2*time.Second, 2))
				evs := w.scan(d, []Container{trainer})
				if len(evs) != 1 || evs[0].Kind != c.want {
					t.Fatalf("events %+v, want one of kind %q", evs, c.want)
				}
			})
		}
	})
	t.Run("figures in a later Scan", func(t *testing.T) {
		w, p, d := started(t, Config{})
		w.write(p, log(asyncPastFraction[:3]))
		evs := w.scan(d, []Container{trainer})
		w.write(p, cri(time.Second, "stderr", "F", asyncPastFraction[3])+cri(time.Second, "stderr", "F", asyncPastFraction[4])+cri(time.Second, "stderr", "F", asyncPastFraction[5]))
		evs = append(evs, w.scan(d, []Container{trainer})...)
		if len(evs) != 1 || evs[0].Kind != KindDevice {
			t.Fatalf("events %+v, want one of kind device: it was returned before its figures came", evs)
		}
	})
	t.Run("termination", func(t *testing.T) {
		w := newWorld(t)
		d := w.detector(Config{})
		text := "Traceback (most recent call last):\n" + msg + "\n" + strings.Join(asyncPastFraction, "\n") + "\n"
		evs := w.scan(d, nil, Termination{Container: trainer, Instance: 0, Reason: "Error", Message: text, ExitCode: 1, FinishedAt: t0.Add(time.Minute)})
		if len(evs) != 1 || evs[0].Kind != KindProcessCap {
			t.Fatalf("events %+v, want one of kind process-cap", evs)
		}
	})
}

"""GPU workloads for `make test-gpu` (test/gpu): one process per pod.

Each mode prints what it did on stdout, which test-gpu keeps as the pod's CRI
log, and exits 0 when it did what the mode says, 3 when it hit an out-of-memory
error (after printing the framework's own message, as a real program's log
would hold it), 2 on anything else.

    python3 workload.py hold-torch GIB SECONDS     # hold GIB of memory, idle
    python3 workload.py busy-torch SECONDS         # matmul loop, SM busy
    python3 workload.py hold-busy-torch GIB SECONDS  # both
    python3 workload.py oom-torch | oom-jax | oom-cupy | oom-numba
    python3 workload.py oom-torch-cap     # 0.12 of the GPU past a fraction of 0.1
        # (torch.cuda.set_per_process_memory_fraction) with the GPU free
    python3 workload.py oom-torch-async   # the GPU's memory twice over, with
        # PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync set by test-gpu
    python3 workload.py oom-torch-async-cap  # oom-torch-cap, the same backend
    python3 workload.py jax-share GIB              # platform, then allocate GIB
    python3 workload.py jax-optin GIB              # the same, after passing
        # GPUSLICE_GPU_MEMORY_FRACTION to JAX as docs/plugin.md says to
    python3 workload.py hold-jax GIB SECONDS       # JAX arrays of GIB, held
"""
import sys
import time
import traceback


def out(*a):
    print(*a, flush=True)


def hold_torch(gib, seconds):
    import torch
    x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    out("holding", gib, "GiB on", torch.cuda.get_device_name(0))
    time.sleep(seconds)
    return 0


def busy_torch(seconds, hold_gib=0):
    import torch
    if hold_gib:
        x = torch.empty(int(hold_gib * (1 << 30)), dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        out("holding", hold_gib, "GiB on", torch.cuda.get_device_name(0))
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    out("busy on", torch.cuda.get_device_name(0))
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            a = (a @ b).clamp_(-1, 1)
        torch.cuda.synchronize()
    return 0


def oom_torch():
    import torch
    free, total = torch.cuda.mem_get_info()
    try:
        torch.empty(total * 2, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        traceback.print_exc(file=sys.stdout)
        return 3
    return 0


def oom_torch_cap():
    import torch
    torch.cuda.set_per_process_memory_fraction(0.1)
    free, total = torch.cuda.mem_get_info()
    try:
        torch.empty(int(total * 0.12), dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        traceback.print_exc(file=sys.stdout)
        return 3
    return 0


def oom_jax():
    import jax
    import jax.numpy as jnp
    out("platform", jax.devices()[0].platform)
    try:
        x = jnp.ones((400 << 30) // 4, dtype=jnp.float32)
        x.block_until_ready()
    except Exception as e:  # jax.errors.JaxRuntimeError / XlaRuntimeError by version
        out(type(e).__module__ + "." + type(e).__name__ + ": " + str(e))
        return 3 if "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower() else 2
    return 0


def oom_cupy():
    import cupy
    free, total = cupy.cuda.runtime.memGetInfo()
    try:
        cupy.empty(total * 2, dtype=cupy.uint8)
    except cupy.cuda.memory.OutOfMemoryError:
        traceback.print_exc(file=sys.stdout)
        return 3
    return 0


def oom_numba():
    import numpy as np
    from numba import cuda
    free, total = cuda.current_context().get_memory_info()
    try:
        cuda.device_array(total * 2, dtype=np.uint8)
    except Exception as e:  # CudaAPIError, numba's and numba-cuda's
        traceback.print_exc(file=sys.stdout)
        return 3 if "OUT_OF_MEMORY" in str(e) or "out of memory" in str(e).lower() else 2
    return 0


def jax_optin(gib):
    import os
    # docs/plugin.md's recipe: the program passes the plugin's share to JAX
    # under the name it uses, unless it set one already.
    if "XLA_CLIENT_MEM_FRACTION" not in os.environ:
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", os.environ["GPUSLICE_GPU_MEMORY_FRACTION"])
    return jax_share(gib)


def jax_share(gib):
    import jax
    import jax.numpy as jnp
    platform = jax.devices()[0].platform
    out("platform", platform)
    if platform != "gpu":
        return 2
    try:
        x = jnp.ones(int(gib * (1 << 30)) // 4, dtype=jnp.float32)
        x.block_until_ready()
    except Exception as e:
        out(type(e).__name__ + ": " + str(e))
        return 3
    out("allocated", gib, "GiB")
    return 0


def hold_jax(gib, seconds):
    import jax
    import jax.numpy as jnp
    out("platform", jax.devices()[0].platform)
    x = jnp.ones(int(gib * (1 << 30)) // 4, dtype=jnp.float32)
    x.block_until_ready()
    out("holding", gib, "GiB")
    time.sleep(seconds)
    return 0


def main(argv):
    mode = argv[1]
    try:
        if mode == "hold-torch":
            return hold_torch(float(argv[2]), float(argv[3]))
        if mode == "busy-torch":
            return busy_torch(float(argv[2]))
        if mode == "hold-busy-torch":
            return busy_torch(float(argv[3]), float(argv[2]))
        if mode == "oom-torch":
            return oom_torch()
        if mode == "oom-torch-cap":
            return oom_torch_cap()
        if mode == "oom-torch-async":
            return oom_torch()
        if mode == "oom-torch-async-cap":
            return oom_torch_cap()
        if mode == "oom-jax":
            return oom_jax()
        if mode == "oom-cupy":
            return oom_cupy()
        if mode == "oom-numba":
            return oom_numba()
        if mode == "jax-optin":
            return jax_optin(float(argv[2]))
        if mode == "jax-share":
            return jax_share(float(argv[2]))
        if mode == "hold-jax":
            return hold_jax(float(argv[2]), float(argv[3]))
    except Exception as e:
        traceback.print_exc(file=sys.stdout)
        return 3 if "out of memory" in str(e).lower() or "RESOURCE_EXHAUSTED" in str(e) else 2
    out("unknown mode", mode)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

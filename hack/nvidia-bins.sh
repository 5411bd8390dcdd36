#!/usr/bin/env bash
# Builds (once) NVIDIA's own components that the real-node tests run against
# the simulated libnvidia-ml (hack/libnvml.sh): nvidia-device-plugin and
# config-manager from github.com/NVIDIA/k8s-device-plugin (v0.19.0), pinned
# by the separate module test/nvtools. They land in $GPUSLICE_ASSETS (default
# .cache/bin) beside the control plane and are kept when present.
# nvidia-device-plugin links go-nvml, which needs cgo; it dlopens
# libnvidia-ml.so.1 at run time, so no NVIDIA driver is needed to build it.
# Also nvidia-container-runtime.cdi (github.com/NVIDIA/nvidia-container-toolkit,
# same module pin): the real node's containerd 1.6 runs it as the nvidia-cdi
# runtime, so CDI device requests reach containers (test/realnode/scripts/up.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${GPUSLICE_ASSETS:-$root/.cache/bin}
mkdir -p "$out"
# One build at a time: `make test` runs this in the background while tests
# that need the result call it too; they wait here for the build in progress.
mkdir -p "$out"
exec 9>"$out/.nvidia-bins.lock"
flock 9
export CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations}
# The version comes from the module pin, so `--version` tells what was built.
version=$(cd "$root/test/nvtools" && go list -m -f '{{.Version}}' github.com/NVIDIA/k8s-device-plugin)
for cmd in nvidia-device-plugin config-manager; do
  if [ ! -x "$out/$cmd" ]; then
    echo "building NVIDIA $cmd $version into $out (slow the first time)" >&2
    # The temporary name keeps a half-written binary from passing the -x
    # test above if the build is interrupted.
    (cd "$root/test/nvtools" && CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X github.com/NVIDIA/k8s-device-plugin/internal/info.version=$version" -o "$out/$cmd.tmp" "github.com/NVIDIA/k8s-device-plugin/cmd/$cmd")
    mv "$out/$cmd.tmp" "$out/$cmd"
  fi
done
ctk_version=$(cd "$root/test/nvtools" && go list -m -f '{{.Version}}' github.com/NVIDIA/nvidia-container-toolkit)
if [ ! -x "$out/nvidia-container-runtime.cdi" ]; then
  echo "building NVIDIA nvidia-container-runtime.cdi $ctk_version into $out" >&2
  (cd "$root/test/nvtools" && CGO_ENABLED=1 go build -trimpath -ldflags "-s -w" -o "$out/nvidia-container-runtime.cdi.tmp" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime.cdi)
  mv "$out/nvidia-container-runtime.cdi.tmp" "$out/nvidia-container-runtime.cdi"
fi
echo "$out"

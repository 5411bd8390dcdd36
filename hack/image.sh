#!/usr/bin/env bash
# image.sh: builds the one gpuslice image on this machine, with no container
# engine and no registry: the three programs built with cgo here, the shared
# libraries they link as ldd resolves them here (glibc and its loader), an
# /etc/passwd naming root and nonroot, and the CA bundle, in one layer written
# by test/realnode/cmd/mkimage as a docker-archive tarball (what `docker load`,
# `ctr images import` and `k3s ctr images import` read). The layout, USER, ENV,
# EXPOSE and labels are the Dockerfile's (deploy/deploy_test.go
# TestLocalImage keeps the two in step), so the chart runs either image.
#
# The programs link this machine's glibc: run the image on nodes of any
# distribution, but build it on a glibc at least as old as the one the
# Dockerfile's build image has (Debian 12) if you also run that image's
# programs elsewhere. NVML is not in the image: the NVIDIA container runtime
# mounts the node's libnvidia-ml.so.1 into /usr/lib/x86_64-linux-gnu, which
# the loader searches.
#
# Usage: hack/image.sh [OUT.tar]   (default .cache/image/gpuslice.tar)
# Env:   VERSION (the chart's appVersion), IMAGE (ghcr.io/gpuslice/gpuslice:$VERSION)
# Prints the tarball's path and the image reference, KEY=value.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${VERSION:-$(sed -n 's/^appVersion: "\(.*\)"/\1/p' deploy/helm/gpuslice/Chart.yaml)}
[[ -n "$version" ]] || { echo "image.sh: no appVersion in deploy/helm/gpuslice/Chart.yaml and no VERSION" >&2; exit 1; }
image=${IMAGE:-ghcr.io/gpuslice/gpuslice:$version}
out=${1:-$root/.cache/image/gpuslice.tar}
work=$root/.cache/image/build
mkdir -p "$work/bin" "$(dirname "$out")"

export CGO_ENABLED=1 CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations}
files=()
for c in exporter tuner plugin; do
  go build -trimpath -ldflags="-s -w" -o "$work/bin/gpuslice-$c" "./cmd/$c"
  files+=("$work/bin/gpuslice-$c=/usr/local/bin/gpuslice-$c")
done
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/mkimage" ./test/realnode/cmd/mkimage

# The libraries, at the paths ldd names (the loader's at its ELF interpreter
# path) and, for a symlink, at the path of the file it names too.
declare -A seen=()
for c in exporter tuner plugin; do
  lddout=$(ldd "$work/bin/gpuslice-$c")
  if grep -q "not found" <<<"$lddout"; then
    echo "image.sh: gpuslice-$c needs libraries this machine lacks:" >&2
    grep "not found" <<<"$lddout" >&2
    exit 1
  fi
  for lib in $(grep -o '/[^ ]*' <<<"$lddout"); do
    for p in "$lib" "$(readlink -f "$lib")"; do
      [[ -n "${seen[$p]:-}" ]] && continue
      seen[$p]=1
      files+=("$(readlink -f "$p")=$p")
    done
  done
done

# distroless's users: root and nonroot (65532), the tuner's uid in the chart.
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$work/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$work/group"
files+=("$work/passwd=/etc/passwd" "$work/group=/etc/group")
ca=/etc/ssl/certs/ca-certificates.crt
[[ -f "$ca" ]] && files+=("$ca=$ca")

"$work/mkimage" -o "$out" -tag "$image" \
  -user 65532:65532 \
  -env PATH=/usr/local/bin:/usr/bin:/bin \
  -expose 9846 -expose 9847 -expose 9848 \
  -label org.opencontainers.image.title=gpuslice \
  -label "org.opencontainers.image.description=Safe NVIDIA GPU time-slicing on Kubernetes: gpuslice-exporter, gpuslice-tuner, gpuslice-plugin" \
  -label org.opencontainers.image.source=https://github.com/gpuslice/gpuslice \
  -label org.opencontainers.image.url=https://github.com/gpuslice/gpuslice \
  -label "org.opencontainers.image.version=$version" \
  "${files[@]}"
echo "IMAGE_TAR=$out"
echo "IMAGE=$image"

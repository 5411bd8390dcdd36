#!/usr/bin/env bash
# Builds libnvidia-ml.so.1 made from the simulated GPU (package test/libnvml)
# into $GPUSLICE_LIB_DIR (default .cache/lib, git-ignored), for programs that
# run their real NVML path without a GPU: LD_LIBRARY_PATH=<that dir>.
# It is built again when a Go file it is made from (test/libnvml, the sim
# backend and the packages they import from this module) or go.mod/go.sum is
# newer than the library. Prints the library's path.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${GPUSLICE_LIB_DIR:-$root/.cache/lib}
lib="$out/libnvidia-ml.so.1"
# One build at a time: `make test` runs this in the background while tests
# that need the result call it too; they wait here for the build in progress.
mkdir -p "$out"
exec 9>"$out/.libnvml.lock"
flock 9
export CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations}
stale=1
if [ -f "$lib" ]; then
  stale=0
  # The module's own source files the library is built from.
  srcs=$(cd "$root" && go list -deps -f '{{if not .Standard}}{{if .Module}}{{if .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}} {{end}}{{range .CgoFiles}}{{$d}}/{{.}} {{end}}{{end}}{{end}}{{end}}' ./test/libnvml)
  for f in $srcs "$root/go.mod" "$root/go.sum"; do
    if [ "$f" -nt "$lib" ]; then
      stale=1
      break
    fi
  done
fi
if [ "$stale" = 1 ]; then
  mkdir -p "$out"
  echo "building $lib" >&2
  # A temporary name keeps a half-written library from looking current.
  (cd "$root" && CGO_ENABLED=1 go build -trimpath -buildmode=c-shared -o "$lib.tmp" ./test/libnvml)
  # go build writes a C header beside it, not needed by anyone.
  rm -f "$lib.h" "$lib.tmp.h"
  mv "$lib.tmp" "$lib"
fi
echo "$lib"

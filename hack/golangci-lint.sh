#!/usr/bin/env bash
# Installs (once) golangci-lint from the Go module proxy and runs it on the
# module with .golangci.yml. The binary lands in $GPUSLICE_LINT_DIR (default
# .cache/bin, git-ignored) under its version's name, so that a change of
# version below installs the new one. `make lint` and `make test` call it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${GPUSLICE_LINT_DIR:-$root/.cache/bin}
version=v2.15.0
lint="$out/golangci-lint-$version"
mkdir -p "$out"
(
  flock 9
  if [ ! -x "$lint" ]; then
    echo "installing golangci-lint $version into $out" >&2
    # Into a directory of its own first: an interrupted install leaves
    # nothing that passes the -x test above.
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    GOBIN="$tmp" go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$version"
    mv "$tmp/golangci-lint" "$lint"
  fi
) 9>"$out/.golangci-lint.lock"
cd "$root"
exec "$lint" run --timeout 15m ./...

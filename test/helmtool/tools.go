//go:build tools

// Package helmtool pins the Helm command-line tool that deploy tests run
// (helm lint, helm template). It is a separate module so Helm's large
// dependency tree stays out of the main module's go.mod.
package helmtool

import (
	_ "helm.sh/helm/v3/cmd/helm"
)

package kube

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kc := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Config(path, "gpuslice-test")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.0.1:6443" || cfg.BearerToken != "abc" || cfg.UserAgent != "gpuslice-test" {
		t.Fatalf("config %+v", cfg)
	}
	if _, err := Config(filepath.Join(t.TempDir(), "missing"), "x"); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing kubeconfig: %v", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := Config("", "x"); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Fatalf("outside a cluster: %v", err)
	}
}

package kube

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
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

// TestHealthTracksLastCall: a failed list or watch sets the error, one
// that succeeds clears it, and a call cancelled by its context (the
// informer stopping) is no failure.
func TestHealthTracksLastCall(t *testing.T) {
	var listErr, watchErr error
	lw := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			return nil, listErr
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			return nil, watchErr
		},
	}
	var h Health
	h.Track(lw)
	ctx := context.Background()
	refused := errors.New("pods is forbidden")
	listErr = refused
	_, _ = lw.ListWithContextFunc(ctx, metav1.ListOptions{})
	if !errors.Is(h.Err(), refused) {
		t.Errorf("after a refused list: %v", h.Err())
	}
	_, _ = lw.WatchFuncWithContext(ctx, metav1.ListOptions{})
	if h.Err() != nil {
		t.Errorf("after a watch that succeeded: %v", h.Err())
	}
	watchErr = context.Canceled
	_, _ = lw.WatchFuncWithContext(ctx, metav1.ListOptions{})
	if h.Err() != nil {
		t.Errorf("after a cancelled watch: %v", h.Err())
	}
	watchErr = refused
	_, _ = lw.WatchFuncWithContext(ctx, metav1.ListOptions{})
	listErr = nil
	if !errors.Is(h.Err(), refused) {
		t.Errorf("after a refused watch: %v", h.Err())
	}
	_, _ = lw.ListWithContextFunc(ctx, metav1.ListOptions{})
	if h.Err() != nil {
		t.Errorf("after a list that succeeded: %v", h.Err())
	}
}

// Package testenv starts a real kube-apiserver backed by a real etcd for
// integration tests, through controller-runtime's envtest. The binaries are
// built once by hack/test-bins.sh (make test-bins) into .cache/bin; a test
// that needs them fails with a message saying how to build them rather than
// silently skipping, so CI can never pass without having run it. Only an
// explicit `go test -short` skips them.
package testenv

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// AssetsDir returns the directory holding kube-apiserver and etcd:
// $KUBEBUILDER_ASSETS when set, else <repo>/.cache/bin.
func AssetsDir() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", ".cache", "bin")
}

// Env is a running control plane.
type Env struct {
	Config *rest.Config
	Client kubernetes.Interface
	env    *envtest.Environment
}

// Start runs kube-apiserver and etcd for the duration of the test (stopped
// with t.Cleanup).
func Start(t testing.TB) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("testenv: -short skips tests that need kube-apiserver and etcd")
	}
	dir := AssetsDir()
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			t.Fatalf("testenv: %s not found in %s (run `make test-bins`, or set KUBEBUILDER_ASSETS): %v", bin, dir, err)
		}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    dir,
		ControlPlaneStartTimeout: 60 * time.Second,
		ControlPlaneStopTimeout:  20 * time.Second,
	}
	// This machine's only network is loopback: the API server must not try
	// to advertise or reconcile another address.
	api := env.ControlPlane.GetAPIServer()
	api.Configure().Set("advertise-address", "127.0.0.1")
	api.Configure().Set("endpoint-reconciler-type", "none")
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("testenv: starting kube-apiserver and etcd from %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("testenv: stopping control plane: %v", err)
		}
	})
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("testenv: client: %v", err)
	}
	return &Env{Config: cfg, Client: cs, env: env}
}

// Kubeconfig writes a kubeconfig for this control plane into dir and returns
// its path, for programs started as separate processes.
func (e *Env) Kubeconfig(t testing.TB, dir string) string {
	t.Helper()
	return e.KubeconfigAs(t, dir, "gpuslice-test", "system:masters")
}

// KubeconfigAs is Kubeconfig for a user of that name and groups, with only
// the rights RBAC gives them. A ServiceAccount's user name
// (system:serviceaccount:<namespace>:<name>) gets what is bound to the
// ServiceAccount: RBAC matches such subjects by user name.
func (e *Env) KubeconfigAs(t testing.TB, dir, name string, groups ...string) string {
	t.Helper()
	user, err := e.env.ControlPlane.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		t.Fatalf("testenv: adding user: %v", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		t.Fatalf("testenv: kubeconfig: %v", err)
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return path
}

// CreateNamespace creates a namespace (ignoring that envtest has "default").
func (e *Env) CreateNamespace(t testing.TB, name string) {
	t.Helper()
	_, err := e.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("testenv: namespace %s: %v", name, err)
	}
}

// Apply creates every object of a manifest of RBAC objects (ServiceAccount,
// ClusterRole, ClusterRoleBinding, Role, RoleBinding), documents separated
// by "---" lines.
func (e *Env) Apply(t testing.TB, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for i, doc := range bytes.Split(data, []byte("\n---\n")) {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("testenv: %s: document %d: %v", path, i, err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = e.Client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = e.Client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = e.Client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = e.Client.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = e.Client.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("testenv: %s: document %d: unexpected %T", path, i, obj)
		}
		if err != nil {
			t.Fatalf("testenv: %s: document %d: %v", path, i, err)
		}
	}
}

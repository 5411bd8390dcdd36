package pods

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuslice/gpuslice/internal/testenv"
)

func pod(ns, name, uid, node string, containers map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	for n, id := range containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: n, ContainerID: id})
	}
	return p
}

func TestContainerName(t *testing.T) {
	p := pod("ns", "p", "u1", "n", map[string]string{"app": "containerd://abc", "side": "cri-o://def"})
	p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "init", ContainerID: "docker://123"}}
	for _, tc := range []struct{ id, want string }{{"abc", "app"}, {"def", "side"}, {"123", "init"}, {"zzz", ""}, {"", ""}} {
		got, ok := ContainerName(p, tc.id)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("ContainerName(%q) = %q, %v; want %q", tc.id, got, ok, tc.want)
		}
	}
}

func TestKubeletSource(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	list := corev1.PodList{Items: []corev1.Pod{*pod("ml", "yolo", "uid-1", "n1", map[string]string{"app": "containerd://aa"})}}
	fail := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/pods" || r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		if fail {
			_, _ = w.Write([]byte("{not json"))
			return
		}
		_ = json.NewEncoder(w).Encode(list)
	}))
	defer srv.Close()

	k, err := NewKubelet(KubeletConfig{URL: srv.URL, TokenFile: tokenFile, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if k.Err() == nil {
		t.Fatal("Err() is nil before the first read")
	}
	if err := k.Refresh(t.Context()); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	p, ok := k.Get("uid-1")
	if !ok || p.Name != "yolo" || len(k.List()) != 1 || k.Err() != nil {
		t.Fatalf("Get = %v, %v; List %d; Err %v", p, ok, len(k.List()), k.Err())
	}
	// A broken answer keeps the last good list and reports the error.
	fail = true
	err = k.Refresh(t.Context())
	if err == nil || !strings.Contains(err.Error(), "decoding pod list") {
		t.Fatalf("Refresh on bad JSON = %v", err)
	}
	if _, ok := k.Get("uid-1"); !ok || k.Err() == nil {
		t.Fatal("last good list lost or error not reported")
	}

	bad, _ := NewKubelet(KubeletConfig{URL: srv.URL, TokenFile: filepath.Join(dir, "missing")})
	if err := bad.Refresh(t.Context()); err == nil || !strings.Contains(err.Error(), "token") {
		t.Fatalf("missing token file: %v", err)
	}
	if _, err := NewKubelet(KubeletConfig{}); err == nil {
		t.Fatal("empty URL accepted")
	}
}

// TestInformerNodeScoped runs the informer against a real kube-apiserver and
// checks that it sees only this node's pods, and sees status updates.
func TestInformerNodeScoped(t *testing.T) {
	env := testenv.Start(t)
	ctx := t.Context()
	gpuPod := pod("default", "mine", "", "node-a", nil)
	gpuPod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	gpuPod.Spec.InitContainers = []corev1.Container{{Name: "fetch", Image: "busybox"}}
	for _, p := range []*corev1.Pod{gpuPod, pod("default", "other", "", "node-b", nil)} {
		if _, err := env.Client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	inf, err := NewInformer(env.Config, "node-a", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := inf.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := inf.Err(); err != nil {
		t.Fatal(err)
	}
	got := inf.List()
	if len(got) != 1 || got[0].Name != "mine" {
		t.Fatalf("informer for node-a lists %d pods: %v", len(got), got)
	}
	// The spec is trimmed to what the exporter reads: each container's
	// name and limits (the OOM watch finds GPU containers by them).
	if cs, ics := got[0].Spec.Containers, got[0].Spec.InitContainers; len(cs) != 1 || cs[0].Name != "c" || cs[0].Resources.Limits.Name("nvidia.com/gpu", resource.DecimalSI).Value() != 1 ||
		cs[0].Image != "" || len(ics) != 1 || ics[0].Name != "fetch" {
		t.Fatalf("trimmed spec: containers %+v, init containers %+v; want c with its nvidia.com/gpu limit and fetch, images dropped", cs, ics)
	}
	mine, _ := env.Client.CoreV1().Pods("default").Get(ctx, "mine", metav1.GetOptions{})
	mine.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", ContainerID: "containerd://f00"}}
	if _, err := env.Client.CoreV1().Pods("default").UpdateStatus(ctx, mine, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, ok := inf.Get(string(mine.UID))
		if ok {
			if name, found := ContainerName(p, "f00"); found && name == "c" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("status update not seen by the informer")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := NewInformer(env.Config, "", 0); err == nil {
		t.Fatal("empty node name accepted")
	}
}

package fakekubelet

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuslice/gpuslice/internal/gpu/sim"
	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/test/simnode"
)

func TestParseWorkload(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		want    workload
		wantErr string
	}{
		{name: "none", ann: nil, want: workload{}},
		{name: "all", ann: map[string]string{AnnotationMemory: "6Gi", AnnotationSM: "0.5", AnnotationOOMAfter: "3s", AnnotationExitAfter: "1m"},
			want: workload{memory: 6 << 30, sm: 0.5, oomAfter: 3 * time.Second, hasOOM: true, exitAfter: time.Minute, hasExit: true}},
		{name: "zero durations are set", ann: map[string]string{AnnotationOOMAfter: "0s"}, want: workload{hasOOM: true}},
		{name: "bad memory", ann: map[string]string{AnnotationMemory: "lots"}, wantErr: AnnotationMemory + `="lots"`},
		{name: "negative memory", ann: map[string]string{AnnotationMemory: "-1Gi"}, wantErr: AnnotationMemory},
		{name: "sm above 1", ann: map[string]string{AnnotationSM: "1.5"}, wantErr: AnnotationSM + `="1.5"`},
		{name: "bad duration", ann: map[string]string{AnnotationOOMAfter: "soon"}, wantErr: AnnotationOOMAfter + `="soon"`},
		{name: "negative duration", ann: map[string]string{AnnotationExitAfter: "-1s"}, wantErr: AnnotationExitAfter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseWorkload(tc.ann)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := New(Options{}); err == nil || !strings.Contains(err.Error(), "Client and Sim") {
		t.Fatalf("New(empty) = %v", err)
	}
}

// TestKubeletRunsPods drives the kubelet against a real API server with
// static devices, binding pods by hand (no scheduler): the Node, a pod's
// life from admission to its OOM and exit, refusals, and deletion.
func TestKubeletRunsPods(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	env.CreateNamespace(t, "ml")
	n, err := simnode.New("node-a", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	uuid := simnode.GPUUUID("node-a", 0)
	n.GPUs = []*simnode.GPU{{UUID: uuid, MemoryBytes: simnode.A6000Bytes}}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	k, err := New(Options{Client: env.Client, Sim: n, StaticDevices: map[string][]string{"nvidia.com/gpu": {uuid + "::0", uuid + "::1"}},
		Heartbeat: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Run(ctx); err != nil {
		t.Fatal(err)
	}

	node, err := env.Client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := node.Status.Allocatable["nvidia.com/gpu"]; q.Value() != 2 {
		t.Errorf("allocatable nvidia.com/gpu = %s, want 2", q.String())
	}
	if !ready(node) {
		t.Errorf("node conditions %+v, want Ready", node.Status.Conditions)
	}
	// The API server's TaintNodesByCondition admission taints a new Node
	// not-ready; lifting it is kube-controller-manager's job (the e2e runs
	// one), not the kubelet's.
	if len(node.Spec.Taints) != 1 || node.Spec.Taints[0].Key != corev1.TaintNodeNotReady {
		t.Errorf("taints %+v, want the API server's not-ready taint", node.Spec.Taints)
	}
	lease, err := env.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first := lease.Spec.RenewTime.Time
	poll(t, "the lease renewed", func() string {
		l, err := env.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil || !l.Spec.RenewTime.After(first) {
			return fmt.Sprintf("renewTime still %v (%v)", first, err)
		}
		return ""
	})

	create(t, env.Client, pod("oom", corev1.RestartPolicyNever, 1, map[string]string{
		AnnotationMemory: "3Gi", AnnotationSM: "0.25", AnnotationOOMAfter: "300ms", AnnotationExitAfter: "1500ms"}))
	var cid string
	poll(t, "pod oom running", func() string {
		p, err := env.Client.CoreV1().Pods("ml").Get(ctx, "oom", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 {
			return "phase " + string(p.Status.Phase)
		}
		cid = strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
		return ""
	})
	pr, err := podresources.NewClient(n.PodResourcesSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	allocs, err := pr.List(ctx)
	if err != nil || len(allocs) != 1 || allocs[0].Pod != "oom" || len(allocs[0].DeviceIDs) != 1 || !strings.HasPrefix(allocs[0].DeviceIDs[0], uuid+"::") {
		t.Fatalf("PodResources List = %+v, %v; want one replica of %s for pod oom", allocs, err, uuid)
	}
	snap, err := sim.New(n.SimFile()).Snapshot(ctx)
	if err != nil || len(snap.Devices) != 1 || len(snap.Devices[0].Processes) != 1 || snap.Devices[0].Processes[0].UsedMemoryBytes != 3<<30 {
		t.Fatalf("sim GPU = %+v, %v; want one process of 3 GiB", snap.Devices, err)
	}
	cg, err := os.ReadFile(filepath.Join(n.Procfs(), fmt.Sprint(snap.Devices[0].Processes[0].PID), "cgroup"))
	if err != nil || !strings.Contains(string(cg), cid) {
		t.Fatalf("cgroup of the process = %q, %v; want container %s", cg, err, cid)
	}
	poll(t, "the OOM in the log", func() string {
		if len(k.OOMLines()) != 1 {
			return fmt.Sprintf("OOM lines %v", k.OOMLines())
		}
		return ""
	})
	p := n.Pods[0]
	log, err := os.ReadFile(n.LogFile(p, p.Containers[0]))
	if err != nil || !strings.Contains(string(log), " stderr F torch.OutOfMemoryError: CUDA out of memory.") {
		t.Fatalf("log = %q, %v", log, err)
	}
	poll(t, "pod oom Failed with exit code 1", func() string {
		p, err := env.Client.CoreV1().Pods("ml").Get(ctx, "oom", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p.Status.Phase != corev1.PodFailed || p.Status.ContainerStatuses[0].State.Terminated == nil || p.Status.ContainerStatuses[0].State.Terminated.ExitCode != 1 {
			return fmt.Sprintf("phase %s, %+v", p.Status.Phase, p.Status.ContainerStatuses)
		}
		return ""
	})
	if allocs, err := pr.List(ctx); err != nil || len(allocs) != 0 {
		t.Errorf("PodResources List after the exit = %+v, %v; want nothing", allocs, err)
	}

	for _, tc := range []struct {
		name, reason, msg string
		pod               *corev1.Pod
	}{
		{"too-many", "UnexpectedAdmissionError", "Requested: 3, Available: 2", pod("too-many", corev1.RestartPolicyAlways, 3, nil)},
		{"restarts", "InvalidWorkload", AnnotationExitAfter, pod("restarts", corev1.RestartPolicyAlways, 1, map[string]string{AnnotationExitAfter: "1s"})},
		{"bad-memory", "InvalidWorkload", AnnotationMemory, pod("bad-memory", corev1.RestartPolicyAlways, 1, map[string]string{AnnotationMemory: "x"})},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			create(t, env.Client, tc.pod)
			poll(t, "pod "+tc.name+" refused", func() string {
				p, err := env.Client.CoreV1().Pods("ml").Get(ctx, tc.name, metav1.GetOptions{})
				if err != nil {
					return err.Error()
				}
				if p.Status.Phase != corev1.PodFailed || p.Status.Reason != tc.reason || !strings.Contains(p.Status.Message, tc.msg) {
					return fmt.Sprintf("phase %s reason %q message %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
				}
				return ""
			})
		})
	}

	t.Run("a deleted pod ends and frees its devices", func(t *testing.T) {
		create(t, env.Client, pod("long", corev1.RestartPolicyAlways, 2, map[string]string{AnnotationMemory: "1Gi"}))
		poll(t, "pod long holding both replicas", func() string {
			allocs, err := pr.List(ctx)
			if err != nil || len(allocs) != 1 || len(allocs[0].DeviceIDs) != 2 {
				return fmt.Sprintf("%+v %v", allocs, err)
			}
			return ""
		})
		// A graceful delete, as kubectl sends: the kubelet confirms it.
		if err := env.Client.CoreV1().Pods("ml").Delete(ctx, "long", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, "pod long gone", func() string {
			_, err := env.Client.CoreV1().Pods("ml").Get(ctx, "long", metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return fmt.Sprintf("still there (%v)", err)
			}
			if allocs, err := pr.List(ctx); err != nil || len(allocs) != 0 {
				return fmt.Sprintf("PodResources still lists %+v (%v)", allocs, err)
			}
			return ""
		})
	})
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func pod(name string, restart corev1.RestartPolicy, gpus int64, ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, Annotations: ann},
		Spec: corev1.PodSpec{NodeName: "node-a", RestartPolicy: restart, Containers: []corev1.Container{{
			Name: "main", Image: "example.com/main",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI)}},
		}}},
	}
}

func create(t *testing.T, c kubernetes.Interface, p *corev1.Pod) {
	t.Helper()
	if _, err := c.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// poll checks cond every 50 ms for up to 20 s.
func poll(t *testing.T, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
	"github.com/gpuslice/gpuslice/internal/tuner/signals"
)

// BenchmarkRound is one decision round for 100 nodes of 8 GPUs each, the
// window (10 min at 15 s, the defaults) gathered from the in-memory
// signals.Window the exporters source keeps, decided, and found to need no
// write (every node has a free replica): the steady state of a cluster.
func BenchmarkRound(b *testing.B) {
	const nodes, gpus = 100, 8
	cfg := testConfig(config.ModeConfigManager, "bench")
	cfg.Policy = policy.DefaultConfig()
	now := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)

	win := signals.NewWindow(cfg.Policy.Window + cfg.Policy.SampleInterval)
	objs := []runtime.Object{&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "plugin-configs", Namespace: "bench"},
		Data: map[string]string{"default": baseConfig}}}
	for i := range nodes {
		name := fmt.Sprintf("gpu-node-%03d", i)
		objs = append(objs, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{ConfigLabel: "gpuslice-4"}},
			Status:     corev1.NodeStatus{Allocatable: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(gpus*4, resource.DecimalSI)}},
		})
		for t := now.Add(-cfg.Policy.Window); !t.After(now); t = t.Add(cfg.Policy.SampleInterval) {
			look := map[string]policy.Sample{}
			for g := range gpus {
				look[fmt.Sprintf("GPU-%s-%d", name, g)] = policy.Sample{Time: t, MemoryTotalBytes: 48 * gib, MemoryUsedBytes: 20 * gib,
					ContainerPeaks:     map[string]uint64{"ml/yolo/main": 6 * gib, "ml/rife/main": 8 * gib, "media/ffmpeg/enc": gib / 2},
					ReplicasAdvertised: 4, ReplicasAllocated: 3}
			}
			win.Add(name, look)
		}
	}
	client := fake.NewClientset(objs...)
	c, err := New(Options{Config: cfg, Client: client, Source: win, Recorder: record.NewFakeRecorder(10000), Now: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := c.startInformers(ctx); err != nil {
		b.Fatal(err)
	}
	// The first round writes the named configs and each node's hold
	// annotation; wait until the informer has them, so measured rounds
	// write nothing.
	if err := c.round(ctx, nil); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := c.nodes.Get(fmt.Sprintf("gpu-node-%03d", nodes-1))
		if r, _ := ParseRecord(n.Annotations[AnnotationLastDecision]); err == nil && r != nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("informer never saw the annotations")
		}
		time.Sleep(10 * time.Millisecond)
	}
	writes := len(client.Actions())
	b.ResetTimer()
	for b.Loop() {
		if err := c.round(ctx, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	for _, a := range client.Actions()[writes:] {
		if a.GetVerb() != "get" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			b.Fatalf("a steady-state round wrote: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

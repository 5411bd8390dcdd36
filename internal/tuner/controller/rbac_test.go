package controller

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/signals"
)

// applyRBAC creates every object of deploy/rbac/tuner.yaml.
func applyRBAC(t *testing.T, env *testenv.Env) {
	t.Helper()
	env.Apply(t, filepath.Join("..", "..", "..", "deploy", "rbac", "tuner.yaml"))
}

// testRBAC runs the tuner as its ServiceAccount with only the manifest's
// rights: leader election, exporter discovery, the pending-pod informer,
// Events, both write paths, evicting a pod.
// Then it checks a few things the tuner must not be able to do.
func testRBAC(t *testing.T, env *testenv.Env) {
	const tunerNS, pluginNS, cmName = "gpuslice", "nvidia-device-plugin", "nvidia-device-plugin-configs"
	env.CreateNamespace(t, tunerNS)
	env.CreateNamespace(t, pluginNS)
	applyRBAC(t, env)
	rc := rest.CopyConfig(env.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:gpuslice:gpuslice-tuner"}
	sa, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := &harness{t: t, env: env, ctx: ctx, ns: pluginNS}
	if _, err := env.Client.CoreV1().ConfigMaps(pluginNS).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: cmName, Namespace: pluginNS}, Data: map[string]string{"default": baseConfig}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	admin.node("rbac-node", map[string]string{"scenario": "rbac"}, 4)

	t.Run("exporter discovery", func(t *testing.T) {
		ecfg := config.Default().Signals.Exporters
		pod, err := env.Client.CoreV1().Pods(tunerNS).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "exporter", Namespace: tunerNS, Labels: map[string]string{"app.kubernetes.io/name": "gpuslice-exporter"}},
			Spec:       corev1.PodSpec{NodeName: "rbac-node", Containers: []corev1.Container{{Name: "exporter", Image: "gpuslice-exporter"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}
		if _, err := env.Client.CoreV1().Pods(tunerNS).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		exp, err := signals.NewExporters(signals.ExportersOptions{Config: ecfg, Client: sa, Interval: time.Hour, Keep: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ectx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { _ = exp.Run(ectx) }()
		poll(t, 10*time.Second, func() string {
			targets, err := exp.Targets()
			if err != nil {
				return err.Error()
			}
			if len(targets) != 1 || targets[0].Node != "rbac-node" {
				return fmt.Sprintf("targets %v", targets)
			}
			return ""
		})
	})

	t.Run("config-manager with leader election and Events", func(t *testing.T) {
		cfg := testConfig(config.ModeConfigManager, pluginNS)
		cfg.Apply.ConfigMap.Name = cmName
		cfg.WorkloadMemory.ConfigMap = config.Default().WorkloadMemory.ConfigMap
		cfg.LeaderElection = config.LeaderElection{Enabled: true, Namespace: tunerNS, Name: "gpuslice-tuner",
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond}
		cfg.Interval = 100 * time.Millisecond
		src := &fakeSource{interval: cfg.Policy.SampleInterval}
		src.set("rbac-node", headroom(1))
		c, err := New(Options{Config: cfg, Client: sa, Source: src, Identity: "rbac"})
		if err != nil {
			t.Fatal(err)
		}
		var roundErr error
		c.afterRound = func(err error) {
			if err != nil && roundErr == nil {
				roundErr = err
			}
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(rctx) }()
		poll(t, 30*time.Second, func() string {
			if l := admin.getNode("rbac-node").Labels[ConfigLabel]; l != "gpuslice-5" {
				return "node label " + l
			}
			evs, err := env.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=rbac-node"})
			if err != nil {
				return err.Error()
			}
			for _, e := range evs.Items {
				if e.Reason == ReasonReplicasRaised {
					return ""
				}
			}
			return fmt.Sprintf("no ReplicasRaised Event among %d", len(evs.Items))
		})
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if roundErr != nil {
			t.Errorf("a round failed: %v", roundErr)
		}
		// The workload memory: created and written as the ServiceAccount.
		mem, err := env.Client.CoreV1().ConfigMaps(tunerNS).Get(ctx, "gpuslice-tuner-memory", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the workload memory ConfigMap: %v", err)
		}
		if _, ok := mem.Data["rbac-node.json"]; !ok {
			t.Errorf("the workload memory holds %v, want rbac-node.json", slices.Collect(maps.Keys(mem.Data)))
		}
	})

	t.Run("restart", func(t *testing.T) {
		cfg := testConfig(config.ModeRestart, pluginNS)
		cfg.Apply.ConfigMap.Name = cmName
		cfg.Apply.NodeSelector = "scenario=rbac" // the other scenarios' silent nodes would hold the raise
		cfg.WorkloadMemory.ConfigMap = config.Default().WorkloadMemory.ConfigMap
		h := newHarness(t, env, cfg, sa)
		h.daemonSet()
		h.src.set("rbac-node", headroom(1))
		// The plugin-mode run above changed the node, on the wall clock;
		// with no last change on the ConfigMap, restart mode would take
		// the node's and wait out its cooldown. This run starts afresh.
		n := h.getNode("rbac-node")
		delete(n.Annotations, AnnotationLastDecision)
		if _, err := env.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.round()
		if got := h.getDaemonSet().Spec.Template.Annotations[AnnotationRestartedAt]; got == "" {
			t.Error("DaemonSet not restarted")
		}
	})

	// Pending pods anywhere are demand: list and watch pods cluster-wide.
	t.Run("pods in every namespace", func(t *testing.T) {
		for _, ns := range []string{"", pluginNS, "kube-system"} {
			if _, err := sa.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Pending"}); err != nil {
				t.Errorf("list pods in %q: %v", ns, err)
			}
			w, err := sa.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "status.phase=Pending"})
			if err != nil {
				t.Errorf("watch pods in %q: %v", ns, err)
				continue
			}
			w.Stop()
		}
	})

	// RBAC without the pods rule fails at start, saying so, instead of
	// waiting for ever on an informer the API server refuses.
	t.Run("no pods rule", func(t *testing.T) {
		rc := rest.CopyConfig(env.Config)
		rc.Impersonate = rest.ImpersonationConfig{UserName: "gpuslice-no-rights"}
		none, err := kubernetes.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		c, err := New(Options{Config: testConfig(config.ModePlugin, pluginNS), Client: none, Source: &fakeSource{}, Identity: "none"})
		if err != nil {
			t.Fatal(err)
		}
		sctx, stop := context.WithTimeout(ctx, 10*time.Second)
		defer stop()
		if err := c.Run(sctx); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "list and watch on pods") {
			t.Errorf("Run without the pods rule: %v, want a forbidden error naming the rule", err)
		}
	})

	// policy.evictCrashLoops: the Eviction API, never a plain delete (below).
	t.Run("evicting a crash-looping pod", func(t *testing.T) {
		if _, err := env.Client.CoreV1().Pods(tunerNS).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "looping", Namespace: tunerNS},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "cuda"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := sa.CoreV1().Pods(tunerNS).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "looping", Namespace: tunerNS}}); err != nil {
			t.Errorf("evicting a pod as the tuner: %v", err)
		}
	})

	t.Run("nothing more", func(t *testing.T) {
		for what, err := range map[string]error{
			"list secrets": func() error {
				_, err := sa.CoreV1().Secrets(tunerNS).List(ctx, metav1.ListOptions{})
				return err
			}(),
			"read another ConfigMap": func() error {
				_, err := sa.CoreV1().ConfigMaps(pluginNS).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
				return err
			}(),
			"create a ConfigMap": func() error {
				_, err := sa.CoreV1().ConfigMaps(pluginNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
				return err
			}(),
			"delete a node": sa.CoreV1().Nodes().Delete(ctx, "rbac-node", metav1.DeleteOptions{}),
			// Its node writes are patches; an update would drop fields
			// newer than its client.
			"update a node": func() error {
				_, err := sa.CoreV1().Nodes().Update(ctx, admin.getNode("rbac-node"), metav1.UpdateOptions{})
				return err
			}(),
			"read another ConfigMap in its own namespace": func() error {
				_, err := sa.CoreV1().ConfigMaps(tunerNS).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
				return err
			}(),
			"update a pod": func() error {
				_, err := sa.CoreV1().Pods(tunerNS).Update(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "exporter", Namespace: tunerNS}}, metav1.UpdateOptions{})
				return err
			}(),
			"delete a pod": sa.CoreV1().Pods(tunerNS).Delete(ctx, "exporter", metav1.DeleteOptions{}),
		} {
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s: %v, want forbidden", what, err)
			}
		}
	})
}

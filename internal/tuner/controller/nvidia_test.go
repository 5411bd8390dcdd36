package controller

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/testenv"
	"github.com/gpuslice/gpuslice/internal/testproc"
	"github.com/gpuslice/gpuslice/internal/tuner/config"
)

// volume is a ConfigMap volume laid out as the kubelet's atomic writer lays
// it out: the keys in a timestamped directory, ..data pointing at it, and
// each key a link through ..data. config-manager compares the real paths of
// its link and of the key, so the layout matters.
type volume struct {
	t   *testing.T
	dir string
	gen int
}

// sync makes the volume hold data, as the kubelet does up to a minute after
// the ConfigMap changes.
func (v *volume) sync(data map[string]string) {
	v.t.Helper()
	v.gen++
	ts := fmt.Sprintf("..gen_%d", v.gen)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o755); err != nil {
		v.t.Fatal(err)
	}
	for k, d := range data {
		if err := os.WriteFile(filepath.Join(v.dir, ts, k), []byte(d), 0o644); err != nil {
			v.t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
	entries, _ := os.ReadDir(v.dir)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "..") {
			if _, ok := data[e.Name()]; !ok {
				os.Remove(filepath.Join(v.dir, e.Name()))
			}
		}
	}
	for k := range data {
		link := filepath.Join(v.dir, k)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", k), link); err != nil {
			v.t.Fatal(err)
		}
	}
}

// configManager runs NVIDIA's config-manager (v0.19.0, hack/nvidia-bins.sh)
// for a node, with the chart's fallback strategies and no plugin to signal.
func configManager(t *testing.T, kubeconfig, node, srcdir, dst string, oneshot bool) *exec.Cmd {
	bin := filepath.Join(testenv.AssetsDir(), "config-manager")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("NVIDIA's config-manager not built (run `make test-bins`, which runs hack/nvidia-bins.sh): %v", err)
	}
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--node-name", node, "--config-file-srcdir", srcdir,
		"--config-file-dst", dst, fmt.Sprintf("--oneshot=%v", oneshot), "--send-signal=false")
	cmd.Env = append(os.Environ(), "FALLBACK_STRATEGIES=named,single")
	return cmd
}

// oneshot runs config-manager once (as NVIDIA's init container does) and
// returns the key it linked, or its error output.
func oneshot(t *testing.T, kubeconfig, node string, v *volume) (key string, err error) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "config.yaml")
	out, err := configManager(t, kubeconfig, node, v.dir, dst, true).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%w: %s", err, testproc.Tail(string(out), 3))
	}
	target, err := os.Readlink(dst)
	if err != nil {
		return "", err
	}
	return filepath.Base(target), nil
}

// testNVIDIAConfigManager runs the tuner in config-manager mode against
// NVIDIA's own config-manager, run as a process against the same API
// server, reading a ConfigMap volume the test syncs as the kubelet would.
func testNVIDIAConfigManager(t *testing.T, env *testenv.Env) {
	cfg := testConfig(config.ModeConfigManager, "nv-ns")
	cfg.Apply.Key = "config" // the chart's `config.map` with one entry: no `default` key
	cfg.Apply.PropagationDelay = 90 * time.Second
	cfg.Apply.NodeSelector = "scenario=nvidia"
	h := newHarness(t, env, cfg, nil)
	h.namespace()
	h.configMap(map[string]string{"config": baseConfig})
	h.daemonSet()
	h.c.cfg.Apply.DaemonSet = config.ObjectRef{Namespace: h.ns, Name: "nvidia-device-plugin"}
	mine := map[string]string{"scenario": "nvidia"}
	h.node("nv-a", mine, 8)    // 2 GPUs × 4, tuned
	h.node("nv-never", nil, 4) // a GPU node the tuner never labels
	h.src.set("nv-a", headroom(2))
	kubeconfig := env.Kubeconfig(t, t.TempDir())
	v := &volume{t: t, dir: t.TempDir()}
	v.sync(h.getConfigMap().Data)

	if key, err := oneshot(t, kubeconfig, "nv-never", v); err != nil || key != "config" {
		t.Fatalf("before the tuner, an unlabelled node gets %q (%v), want the only key, config", key, err)
	}
	// A long-running config-manager on nv-a, as NVIDIA's sidecar.
	dst := filepath.Join(t.TempDir(), "config.yaml")
	cm := configManager(t, kubeconfig, "nv-a", v.dir, dst, false)
	var out testproc.Output
	cm.Stdout, cm.Stderr = &out, &out
	if err := cm.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cm.Process.Kill()
		_ = cm.Wait()
		if t.Failed() {
			t.Logf("--- config-manager on nv-a ---\n%s", testproc.Tail(out.String(), 40))
		}
	})
	linked := func(want string) {
		t.Helper()
		testproc.Eventually(t, 20*time.Second, 50*time.Millisecond, func() string {
			target, err := os.Readlink(dst)
			if err != nil || filepath.Base(target) != want {
				return fmt.Sprintf("config-manager on nv-a links %q (%v), want %s", target, err, want)
			}
			return ""
		})
	}
	linked("config")

	h.round() // writes the named keys and `default`; the label waits
	data := h.getConfigMap().Data
	if data[DefaultKey] != baseConfig {
		t.Fatalf("no `default` copy of the base: %q", data[DefaultKey])
	}
	if r := h.record("nv-a"); r.Reason != ReasonAwaitingPropagation {
		t.Errorf("nv-a's last decision %+v, want AwaitingPropagation", r)
	}

	t.Run("without a default key, NVIDIA's fallback fails for unlabelled nodes", func(t *testing.T) {
		without := &volume{t: t, dir: t.TempDir()}
		d := map[string]string{}
		for k, s := range data {
			if k != DefaultKey {
				d[k] = s
			}
		}
		without.sync(d)
		if _, err := oneshot(t, kubeconfig, "nv-never", without); err == nil || !strings.Contains(err.Error(), "all fallbacks failed") {
			t.Errorf("config-manager without `default`: %v, want it to fail with no fallback", err)
		}
		v.sync(data)
		if key, err := oneshot(t, kubeconfig, "nv-never", v); err != nil || key != DefaultKey {
			t.Errorf("with the tuner's keys an unlabelled node gets %q (%v), want default", key, err)
		}
	})

	t.Run("a label naming a key the volume lacks stops config-manager", func(t *testing.T) {
		stale := &volume{t: t, dir: t.TempDir()}
		stale.sync(map[string]string{"config": baseConfig})
		h.node("nv-early", map[string]string{ConfigLabel: "gpuslice-5"}, 4)
		// Not --oneshot: its first read may come before the informer has
		// the node (NVIDIA's SyncableConfig returns the empty label then),
		// and fall back. The sidecar gets the label and exits on it.
		cmd := configManager(t, kubeconfig, "nv-early", stale.dir, filepath.Join(t.TempDir(), "config.yaml"), false)
		var early testproc.Output
		cmd.Stdout, cmd.Stderr = &early, &early
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			if err == nil || !strings.Contains(early.String(), "specified config gpuslice-5 does not exist") {
				t.Errorf("config-manager on a stale volume exited with %v:\n%s", err, testproc.Tail(early.String(), 5))
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("config-manager kept running on a label naming a key its volume lacks:\n%s", testproc.Tail(early.String(), 5))
		}
	})

	t.Run("after the propagation delay the label moves and config-manager follows", func(t *testing.T) {
		h.advance(cfg.Apply.PropagationDelay)
		h.round()
		if got := h.getNode("nv-a").Labels[ConfigLabel]; got != "gpuslice-5" {
			t.Fatalf("label %q, want gpuslice-5", got)
		}
		linked("gpuslice-5")
		if b, err := os.ReadFile(dst); err != nil || replicasOf(t, string(b)) != 5 {
			t.Errorf("nv-a's plugin would read %q (%v), want 5 replicas", b, err)
		}
	})

	t.Run("a rewritten key in use is applied by a restart, not by config-manager", func(t *testing.T) {
		detected := strings.Count(out.String(), "Label change detected")
		cm := h.getConfigMap()
		cm.Data["config"] = strings.Replace(baseConfig, "sharing:\n  timeSlicing:\n", "sharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n", 1)
		if _, err := env.Client.CoreV1().ConfigMaps(h.ns).Update(h.ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.advance(10 * time.Second)
		h.round() // rewrites gpuslice-5, which nv-a uses
		v.sync(h.getConfigMap().Data)
		if n := strings.Count(out.String(), "Label change detected"); n != detected {
			t.Errorf("config-manager reacted to a content change (%d -> %d label events)", detected, n)
		}
		h.restartPaidAfterPropagation(cfg.Apply.PropagationDelay, "the rewritten key")
	})
}

package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
	"github.com/gpuslice/gpuslice/internal/tuner/sim"
)

// recorder is the tuner's replay policy (sim.Tuner), keeping every round it
// is asked: what it was told and what it answered.
type recorder struct {
	sim.Tuner
	rounds []recorded
}

type recorded struct {
	obs policy.Observation
	d   policy.Decision
}

// Round makes the replay carry the workload memory (sim's rounder), as the
// tuner policy does.
func (r *recorder) Round(obs policy.Observation) (policy.Decision, policy.Memory) {
	d, mem := r.Tuner.Round(obs)
	r.rounds = append(r.rounds, recorded{obs: obs, d: d})
	return d, mem
}

// TestRunAndSimulateDecideAlike: `run` and `simulate` make one decision
// sequence from one sequence of rounds (issue 21). A trace is replayed by
// `simulate`'s code (sim.RunWith, the tuner policy, the apply mode's cost),
// recording each round's observation; the same rounds then go through the
// controller's side: the observation built by its own helper
// (Controller.observation: the apply cost of its apply.mode, its workload
// memory, the current count and the last change), the pending pods and
// container workloads it would read from the API taken from the recording,
// policy.Round as decide calls it, and the workload memory carried between
// rounds as the controller carries it.
//
// The harshest carry is a new leader every round: the record is saved to
// the workload-memory ConfigMap (memoryStore.save, with its size bound) and
// read back by a fresh store (memoryStore.load, JSON), so every field a
// decision reads (Sizes, Arrivals, Since, LastOOM, each container's
// Resident, NeedBytes, OOMs, LastOOM and Workload, each workload's Pods,
// MeanPeak and M2, ...) must survive the controller's encoding. A steady
// leader carries it in memory (get/put).
func TestRunAndSimulateDecideAlike(t *testing.T) {
	for _, tc := range []struct {
		trace string
		mode  string
		evict bool
	}{
		{"collide.yaml", config.ModePlugin, false},
		{"family-12g-night-burst.yaml", config.ModeConfigManager, false},
		// OOMs in a row and an eviction: the records of a crash loop
		// (NeedBytes, OOMs, LastOOM) are carried too.
		{"crash-loop", config.ModeRestart, true},
	} {
		for _, leaderEveryRound := range []bool{true, false} {
			name := fmt.Sprintf("%s/%s/new-leader-every-round=%v", tc.trace, tc.mode, leaderEveryRound)
			t.Run(name, func(t *testing.T) {
				cfg := testConfig(tc.mode, "parity-ns")
				cfg.Policy = policy.DefaultConfig()
				cfg.Policy.EvictCrashLoops = tc.evict
				cfg.Interval = cfg.Policy.SampleInterval
				rounds := replayTrace(t, tc.trace, cfg)
				decideAsTheController(t, cfg, rounds, leaderEveryRound)
			})
		}
	}
}

// crashLoopTrace is issue 21's third failure in small: three 4 GiB services
// on 24 GiB and a job admitted at the operator's 4 while it held 2 GiB,
// which grows to 14 GiB three minutes into each attempt and OOMs on every
// one until it is evicted.
const crashLoopTrace = `gpu: {memoryTotalBytes: 25769803776}
initialReplicas: 4
duration: 2h
pods:
  - {name: svc-a, arrive: 0s, run: 2h, memory: [[0s, 4294967296]], workload: svc}
  - {name: svc-b, arrive: 0s, run: 2h, memory: [[0s, 4294967296]], workload: svc}
  - {name: svc-c, arrive: 0s, run: 2h, memory: [[0s, 4294967296]], workload: svc}
  - {name: job, arrive: 1m, run: 90m, memory: [[0s, 2147483648], [3m, 15032385536]]}
`

// replayTrace replays a shipped trace (or crashLoopTrace) as `simulate --apply-mode` does and
// returns its rounds.
func replayTrace(t *testing.T, name string, cfg config.Config) []recorded {
	t.Helper()
	var tr *sim.Trace
	var err error
	if name == "crash-loop" {
		tr, err = sim.ParseTrace(name, []byte(crashLoopTrace))
	} else {
		tr, err = sim.ReadTrace(filepath.Join("..", "..", "..", "test", "traces", name))
	}
	if err != nil {
		t.Fatal(err)
	}
	cost, err := policy.ApplyCostOf(cfg.Apply.Mode)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Tuner: sim.Tuner{Config: cfg.Policy}}
	res, err := sim.RunWith(tr, rec, sim.Options{Apply: cost})
	if err != nil {
		t.Fatal(err)
	}
	if res.ReplicaChanges == 0 {
		t.Fatalf("%s: the replay changed nothing: no decision sequence to compare", name)
	}
	t.Logf("%s: %d rounds, %d changes, %d OOM events, %d evictions", name, len(rec.rounds), res.ReplicaChanges, res.OOMEvents, res.Evictions)
	return rec.rounds
}

// decideAsTheController runs the recorded rounds through the controller's
// observation, policy.Round and workload-memory carry, and fails at the
// first round whose observation, memory or decision differs from the
// replay's.
func decideAsTheController(t *testing.T, cfg config.Config, rounds []recorded, leaderEveryRound bool) {
	t.Helper()
	ctx := context.Background()
	client := fake.NewClientset()
	c, err := New(Options{Config: cfg, Client: client, Source: &fakeSource{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.mem.load(ctx); err != nil {
		t.Fatal(err)
	}
	exists := func(string) bool { return true }
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: rounds[0].obs.Node}}
	// What the controller keeps in the node's last-decision record: the
	// count, and the time and direction of the last change.
	cur, lastChange, lastDir := rounds[0].obs.CurrentReplicas, rounds[0].obs.LastChange, rounds[0].obs.LastDirection
	largest := 0
	for i, r := range rounds {
		w := &work{node: node, gpus: r.obs.GPUs}
		obs := c.observation(w, cur, lastChange, lastDir, r.obs.Now, r.obs.Floor)
		// What decide reads from the API (waiting pods, the owners of
		// the measured containers) is what the replay saw.
		obs.Pending, obs.ContainerWorkloads = r.obs.Pending, r.obs.ContainerWorkloads

		if got, want := encodeMemory(t, obs.Memory), encodeMemory(t, r.obs.Memory); got != want {
			t.Fatalf("round %d (%s): the controller's workload memory differs from the replay's:\ncontroller: %s\nreplay:     %s",
				i, r.obs.Now.Format("15:04:05"), got, want)
		}
		a, b := obs, r.obs
		a.Memory, b.Memory = policy.Memory{}, policy.Memory{}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("round %d (%s): the controller's observation differs from the replay's:\ncontroller: %+v\nreplay:     %+v",
				i, r.obs.Now.Format("15:04:05"), a, b)
		}

		d, mem := policy.Round(c.cfg.Policy, obs)
		c.mem.put(node.Name, mem)
		if !reflect.DeepEqual(d, r.d) {
			t.Fatalf("round %d (%s): the controller decided %+v, the replay %+v", i, r.obs.Now.Format("15:04:05"), d, r.d)
		}
		if d.Replicas != cur {
			lastChange, lastDir = r.obs.Now, policy.DirectionDown
			if d.Replicas > cur {
				lastDir = policy.DirectionUp
			}
			cur = d.Replicas
		}

		if !leaderEveryRound {
			continue
		}
		if err := c.mem.save(ctx, r.obs.Now, exists); err != nil {
			t.Fatal(err)
		}
		cm, err := client.CoreV1().ConfigMaps(cfg.WorkloadMemory.ConfigMap.Namespace).Get(ctx, cfg.WorkloadMemory.ConfigMap.Name, metav1.GetOptions{})
		if err == nil {
			largest = max(largest, len(cm.Data[node.Name+memoryKeySuffix]))
		}
		// A new leader: a store that knows only the ConfigMap.
		c.mem = newMemoryStore(c)
		if err := c.mem.load(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if leaderEveryRound {
		// Within the bound, nothing was trimmed: the JSON alone carried the
		// record.
		t.Logf("largest stored record: %d bytes (bound %d)", largest, maxMemoryBytes)
	}
}

// encodeMemory is m as the controller stores it, for comparing records
// whatever their in-memory form (a nil or an empty map, a time's location).
func encodeMemory(t *testing.T, m policy.Memory) string {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

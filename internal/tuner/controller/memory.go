package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// memoryKeySuffix ends every node's key in the workload-memory ConfigMap:
// <node>.json (node names are DNS subdomains, valid ConfigMap keys).
const memoryKeySuffix = ".json"

// maxMemoryBytes bounds the ConfigMap's data, well under the API server's
// 1 MiB object limit: when every node's record together would pass it, each
// node keeps its most recently seen workloads within an equal share.
const maxMemoryBytes = 768 << 10

// memoryStore is the policy's workload record per node (policy.Memory),
// carried from round to round in memory and kept in the workloadMemory
// ConfigMap, so that a restarted tuner, or a new leader, prices a known
// workload's pending pod at its peak at once and remembers yesterday's OOM.
//
// It is read when a leader starts deciding (its predecessor may have saved
// since) and written at the end of a round: at once when a workload, a peak
// or an OOM record changed, otherwise at most every saveInterval (watch times
// alone). A key that does not parse is never overwritten: that node starts
// from an empty record in memory, and the key stays as it was for a person
// to look at. Dry run reads and never writes.
type memoryStore struct {
	client kubernetes.Interface
	ref    config.ObjectRef
	every  time.Duration
	window time.Duration
	dryRun bool
	log    *slog.Logger

	loaded   bool
	nodes    map[string]policy.Memory
	saved    map[string]policy.Memory
	broken   map[string]error
	lastSave time.Time
}

func newMemoryStore(c *Controller) *memoryStore {
	m := c.cfg.WorkloadMemory
	return &memoryStore{client: c.client, ref: m.ConfigMap, every: m.SaveInterval, window: c.cfg.Policy.Window, dryRun: c.cfg.DryRun, log: c.log,
		nodes: map[string]policy.Memory{}}
}

// reset makes the next round read the ConfigMap again (leadership began).
func (s *memoryStore) reset() { s.loaded = false }

// load reads the ConfigMap once per leadership. An error leaves the store
// unloaded: rounds decide from the record in memory and nothing is saved
// until a read succeeds, so a failed read never overwrites what is stored.
func (s *memoryStore) load(ctx context.Context) error {
	if s.loaded || s.ref.Name == "" {
		s.loaded = s.loaded || s.ref.Name == ""
		return nil
	}
	cm, err := s.client.CoreV1().ConfigMaps(s.ref.Namespace).Get(ctx, s.ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{}
	case err != nil:
		return fmt.Errorf("reading the workload memory (ConfigMap %s): %w", s.ref, err)
	}
	s.broken = map[string]error{}
	s.saved = map[string]policy.Memory{}
	for key, data := range cm.Data {
		node, ok := strings.CutSuffix(key, memoryKeySuffix)
		if !ok {
			continue
		}
		var mem policy.Memory
		if err := json.Unmarshal([]byte(data), &mem); err != nil {
			s.broken[node] = fmt.Errorf("ConfigMap %s key %q: %w", s.ref, key, err)
			s.log.Error("workload memory does not parse; the node starts from an empty record and the key is left as it is",
				"configMap", s.ref.String(), "key", key, "err", err)
			continue
		}
		s.saved[node] = mem
		// A newer record in memory (this replica led before) wins over
		// an older stored one.
		if cur, ok := s.nodes[node]; !ok || cur.Updated.Before(mem.Updated) {
			s.nodes[node] = mem
		}
	}
	s.loaded = true
	return nil
}

func (s *memoryStore) get(node string) policy.Memory { return s.nodes[node] }

func (s *memoryStore) put(node string, mem policy.Memory) { s.nodes[node] = mem }

// save writes the records that changed. exists says whether a node is still
// in the cluster: a deleted node's key is removed.
func (s *memoryStore) save(ctx context.Context, now time.Time, exists func(string) bool) error {
	if !s.loaded || s.dryRun || s.ref.Name == "" {
		return nil
	}
	urgent, changed := false, false
	for node, mem := range s.nodes {
		if s.broken[node] != nil {
			continue
		}
		old, ok := s.saved[node]
		switch {
		case !ok || significant(old, mem, s.window):
			urgent = true
		case !old.Updated.Equal(mem.Updated):
			changed = true
		}
	}
	for node := range s.saved {
		if !exists(node) {
			urgent = true
		}
	}
	if !urgent && (!changed || now.Sub(s.lastSave) < s.every) {
		return nil
	}
	data, err := s.encode(exists)
	if err != nil {
		return err
	}
	cms := s.client.CoreV1().ConfigMaps(s.ref.Namespace)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, s.ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = cms.Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: s.ref.Name, Namespace: s.ref.Namespace,
					Labels: map[string]string{"app.kubernetes.io/managed-by": FieldManager}},
				Data: data,
			}, metav1.CreateOptions{FieldManager: FieldManager})
			return err
		}
		if err != nil {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		for key := range cm.Data {
			node, ok := strings.CutSuffix(key, memoryKeySuffix)
			if ok && s.broken[node] == nil && !exists(node) {
				delete(cm.Data, key)
			}
		}
		maps.Copy(cm.Data, data)
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: FieldManager})
		return err
	})
	if err != nil {
		return fmt.Errorf("saving the workload memory (ConfigMap %s): %w", s.ref, err)
	}
	s.lastSave = now
	s.saved = maps.Clone(s.nodes)
	for node := range s.saved {
		if !exists(node) {
			delete(s.saved, node)
			delete(s.nodes, node)
		}
	}
	return nil
}

// encode is the ConfigMap data of every node's record that parses, each
// trimmed to its most recently seen workloads when all of them together
// would pass maxMemoryBytes.
func (s *memoryStore) encode(exists func(string) bool) (map[string]string, error) {
	nodes := slices.Sorted(maps.Keys(s.nodes))
	nodes = slices.DeleteFunc(nodes, func(n string) bool { return s.broken[n] != nil || !exists(n) })
	out := make(map[string]string, len(nodes))
	total := 0
	for _, n := range nodes {
		b, err := json.Marshal(s.nodes[n])
		if err != nil {
			return nil, fmt.Errorf("encoding the workload memory of node %s: %w", n, err)
		}
		out[n+memoryKeySuffix] = string(b)
		total += len(b)
	}
	if total <= maxMemoryBytes || len(nodes) == 0 {
		return out, nil
	}
	share := maxMemoryBytes / len(nodes)
	for _, n := range nodes {
		mem := s.nodes[n]
		for len(out[n+memoryKeySuffix]) > share && len(mem.Workloads) > 0 {
			mem = dropOldest(mem, max(1, len(mem.Workloads)/8))
			b, err := json.Marshal(mem)
			if err != nil {
				return nil, err
			}
			out[n+memoryKeySuffix] = string(b)
		}
		s.nodes[n] = mem
	}
	return out, nil
}

// dropOldest removes the k least recently seen workloads.
func dropOldest(mem policy.Memory, k int) policy.Memory {
	keys := slices.SortedFunc(maps.Keys(mem.Workloads), func(a, b string) int {
		if c := mem.Workloads[a].LastSeen.Compare(mem.Workloads[b].LastSeen); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	out := mem
	out.Workloads = maps.Clone(mem.Workloads)
	for _, key := range keys[:min(k, len(keys))] {
		delete(out.Workloads, key)
	}
	return out
}

// significant says whether b differs from a in what a decision reads: the
// workloads, their peaks, their OOM records, the base count; the watch times
// (Updated, Seen, LastSeen) alone are not, except a workload's watch time
// reaching window: from then on its record prices its pods.
func significant(a, b policy.Memory, window time.Duration) bool {
	return decisive(a, window) != decisive(b, window)
}

// decisive is m's JSON without its watch times.
func decisive(m policy.Memory, window time.Duration) string {
	m.Updated = time.Time{}
	ws := make(map[string]policy.WorkloadMemory, len(m.Workloads))
	for k, w := range m.Workloads {
		if w.Seen < window {
			w.Seen = 0
		} else {
			w.Seen = window
		}
		w.LastSeen = time.Time{}
		ws[k] = w
	}
	m.Workloads = ws
	b, _ := json.Marshal(m)
	return string(b)
}

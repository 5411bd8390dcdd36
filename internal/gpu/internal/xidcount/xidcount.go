// Package xidcount keeps the cumulative Xid counts of a GPU backend, per GPU
// UUID and Xid, in the order gpu.Backend.Xids promises.
package xidcount

import (
	"cmp"
	"slices"
	"sync"

	"github.com/gpuslice/gpuslice/internal/gpu"
)

type key struct {
	uuid string
	xid  uint64
}

type value struct {
	index int
	count uint64
}

// Counts is safe for concurrent use. The zero value is empty and ready.
type Counts struct {
	mu sync.Mutex
	m  map[key]value
}

// Add counts n more events of xid on the GPU uuid (at index).
func (c *Counts) Add(uuid string, index int, xid, n uint64) {
	c.update(uuid, index, xid, func(old uint64) uint64 { return old + n })
}

// Raise sets the count of xid on the GPU uuid (at index) to n unless it is
// already higher: for a source that reports totals rather than events.
func (c *Counts) Raise(uuid string, index int, xid, n uint64) {
	c.update(uuid, index, xid, func(old uint64) uint64 { return max(old, n) })
}

func (c *Counts) update(uuid string, index int, xid uint64, f func(uint64) uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[key]value)
	}
	k := key{uuid, xid}
	c.m[k] = value{index: index, count: f(c.m[k].count)}
}

// List returns the counts sorted by UUID then Xid (never nil).
func (c *Counts) List() []gpu.XidCount {
	c.mu.Lock()
	out := make([]gpu.XidCount, 0, len(c.m))
	for k, v := range c.m {
		out = append(out, gpu.XidCount{UUID: k.uuid, Index: v.index, Xid: k.xid, Count: v.count})
	}
	c.mu.Unlock()
	Sort(out)
	return out
}

// Sort sorts counts by UUID then Xid.
func Sort(counts []gpu.XidCount) {
	slices.SortFunc(counts, func(a, b gpu.XidCount) int {
		return cmp.Or(cmp.Compare(a.UUID, b.UUID), cmp.Compare(a.Xid, b.Xid))
	})
}

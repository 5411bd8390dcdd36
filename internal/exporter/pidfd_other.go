//go:build !linux

package exporter

import "errors"

// pidfds are Linux's: elsewhere processes are followed through their stat
// files.
var errNoPidfd = errors.New("pidfd_open unavailable")

func ownProcfs(string) bool      { return false }
func pidfdOpen(int) (int, error) { return -1, errNoPidfd }

type pidfdPoller struct{}

func (*pidfdPoller) exited([]int, []bool) error { return errNoPidfd }

//go:build !linux

package oom

// dirWatcher is inotify's, which only Linux has: elsewhere every watched
// container's log directory is read at every Scan.
type dirWatcher struct{}

func newDirWatcher(string) *dirWatcher                 { return nil }
func (*dirWatcher) watch(*containerState, string) bool { return false }
func (*dirWatcher) unwatch(*containerState)            {}
func (*dirWatcher) drain() bool                        { return true }
func (*dirWatcher) rootKnown() bool                    { return false }
func (*dirWatcher) rootChecked(string)                 {}
func (*dirWatcher) close()                             {}

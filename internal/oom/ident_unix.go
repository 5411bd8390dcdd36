//go:build unix

package oom

import (
	"io/fs"
	"syscall"
)

// identOf returns the device and inode of a file, which stay with the file
// across a rename (log rotation) and change when a new file takes the path.
func identOf(fi fs.FileInfo) ident {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ident{}
	}
	return ident{dev: uint64(st.Dev), ino: uint64(st.Ino)} //nolint:unconvert // Dev is not uint64 on every unix
}

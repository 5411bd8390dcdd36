//go:build linux

package exporter

import (
	"errors"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// errNoPidfd: pidfd_open is not to be had (kernel before 5.3, a seccomp
// policy), so processes are followed through their stat files.
var errNoPidfd = errors.New("pidfd_open unavailable")

// ownProcfs reports whether root is the procfs of this process's PID
// namespace, where a PID names the same process for pidfd_open as in root:
// the exporter runs with hostPID and root is the host's /proc, or root is
// /proc itself.
func ownProcfs(root string) bool {
	self, err := os.Readlink(root + "/self")
	return err == nil && self == strconv.Itoa(os.Getpid())
}

// pidfdOpen returns a descriptor that stays bound to the process with pid
// now (close-on-exec).
func pidfdOpen(pid int) (int, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		return -1, errNoPidfd
	}
	return fd, err
}

// pidfdPoller tells which of a set of pidfds belong to processes that
// exited, in one system call.
type pidfdPoller struct{ fds []unix.PollFd }

// exited sets exited[i] for each fds[i] whose process exited. On an
// error the caller must take every process as exited.
func (p *pidfdPoller) exited(fds []int, exited []bool) error {
	p.fds = p.fds[:0]
	for _, fd := range fds {
		p.fds = append(p.fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}) //nolint:gosec // descriptors fit
	}
	for {
		_, err := unix.Poll(p.fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	for i, f := range p.fds {
		exited[i] = f.Revents != 0 // POLLIN: exited; POLLERR, POLLNVAL: not to be trusted
	}
	return nil
}

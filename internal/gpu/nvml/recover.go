package nvmlbackend

import (
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuslice/gpuslice/internal/gpu"
)

// Defaults of Options.InitBackoff and Options.MaxInitBackoff. Scrapes come
// every 15 to 60 s, so the first retries happen at about every scrape and a
// node whose NVML stays broken is tried every 5 minutes.
const (
	DefaultInitBackoff    = 5 * time.Second
	DefaultMaxInitBackoff = 5 * time.Minute
)

// initState is the backend's re-initialization bookkeeping. Its methods
// are called with Backend.mu held, or on a Backend not yet shared.
type initState struct {
	first, most time.Duration
	now         func() time.Time

	// broken is why NVML needs initializing again; nil while it works.
	broken error
	// next is when the next try may be made; wait is the backoff that
	// follows the next failure.
	next time.Time
	wait time.Duration
}

func newInitState(o Options) initState {
	s := initState{first: o.InitBackoff, most: o.MaxInitBackoff, now: o.Now}
	if s.first <= 0 {
		s.first = DefaultInitBackoff
	}
	if s.most <= 0 {
		s.most = DefaultMaxInitBackoff
	}
	s.most = max(s.most, s.first)
	if s.now == nil {
		s.now = time.Now
	}
	s.wait = s.first
	return s
}

// brokenBy records that NVML gave no GPU. The first such reading makes a
// re-initialization due at once; later ones keep the backoff running.
func (s *initState) brokenBy(err error) (first bool) {
	if s.broken != nil {
		return false
	}
	s.broken, s.next = err, s.now()
	return true
}

// due reports whether a re-initialization should be tried now.
func (s *initState) due() bool {
	return s.broken != nil && !s.now().Before(s.next)
}

// tried records a try and returns the wait before the next one: the
// backoff doubles until a reading gives a GPU.
func (s *initState) tried() time.Duration {
	w := s.wait
	s.next = s.now().Add(w)
	s.wait = min(2*s.wait, s.most)
	return w
}

// failed records a failed Init and returns the wait before the next try.
func (s *initState) failed(err error) time.Duration {
	s.broken = err
	return s.tried()
}

// readable records a reading that gave a GPU; it reports whether NVML had
// been broken until then.
func (s *initState) readable() bool {
	was := s.broken != nil
	s.broken, s.wait = nil, s.first
	return was
}

// unavailable is Snapshot's error while NVML is not initialized.
func (s *initState) unavailable(now time.Time) error {
	return fmt.Errorf("%w (next try in %s)", s.broken, max(s.next.Sub(now), 0).Round(time.Second))
}

func (b *Backend) now() time.Time { return b.init.now() }

// brokenBy notes that a reading found no GPU, and logs it the first time.
func (b *Backend) brokenBy(err error) {
	b.mu.Lock()
	first := b.init.brokenBy(err)
	b.mu.Unlock()
	if first {
		b.log.Warn("nvml: no GPU readable; initializing NVML again", "error", err)
	}
}

// reinitIfDue shuts NVML down and initializes it again when a reading found
// it broken and the backoff allows a try. It holds life's write lock, so no
// Snapshot runs on the library while it is unloaded and loaded again.
func (b *Backend) reinitIfDue() {
	b.mu.Lock()
	due := b.init.due()
	b.mu.Unlock()
	if !due {
		return
	}
	b.life.Lock()
	defer b.life.Unlock()
	b.mu.Lock()
	due = b.init.due() // another Snapshot may have just tried
	b.mu.Unlock()
	if !due || b.closed {
		return
	}
	if err := b.stopXids(); err != nil {
		b.log.Warn("nvml: freeing the Xid event set before re-initializing", "error", err)
	}
	if b.ready {
		// Shutdown only after a successful Init: go-nvml's Shutdown calls
		// into the library, which may not be loaded otherwise.
		b.ready = false
		if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
			b.log.Debug("nvml: shutdown before re-initializing", "error", ret.Error())
		}
	}
	ret := b.lib.Init()
	b.mu.Lock()
	var wait time.Duration
	if ret != nvml.SUCCESS {
		wait = b.init.failed(initError(ret))
	} else {
		// broken stays set until a reading gives a GPU, so an Init that
		// succeeds without helping (a GPU that stays lost) is retried with
		// a growing wait rather than at every scrape.
		wait = b.init.tried()
	}
	b.mu.Unlock()
	if ret != nvml.SUCCESS {
		b.log.Error("nvml: cannot initialize NVML again; retrying", "error", initError(ret), "retry_in", wait)
		return
	}
	b.log.Info("nvml: initialized again")
	b.start()
}

// initError is the error of a failed Init: it wraps gpu.ErrUnavailable and
// the nvml.Return, and says what usually fixes it.
func initError(ret nvml.Return) error {
	if h := initHint(ret); h != "" {
		return fmt.Errorf("%w: nvml init: %w: %s", gpu.ErrUnavailable, ret, h)
	}
	return fmt.Errorf("%w: nvml init: %w", gpu.ErrUnavailable, ret)
}

// initHint names the usual cause of an Init failure and its fix, for the
// first install and for the ways a working node breaks.
func initHint(ret nvml.Return) string {
	const runtimeFix = "run the pod with the NVIDIA container runtime (runtimeClassName: nvidia, or nvidia as the node's default runtime), " +
		"or privileged with NVIDIA_VISIBLE_DEVICES=all on a node with the NVIDIA Container Toolkit"
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "libnvidia-ml.so.1 is not in the container (the runtime did not inject the driver libraries): " + runtimeFix
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA kernel driver is not loaded, or the container cannot see it: check nvidia-smi on the node, and " + runtimeFix
	case nvml.ERROR_NO_PERMISSION:
		return "the container may not open /dev/nvidia*: " + runtimeFix
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return "the NVML library does not match the loaded kernel driver (a driver upgrade without a reboot, or a container older than the upgrade): " +
			"restart the pod, and reboot the node if that does not help"
	case nvml.ERROR_UNKNOWN:
		return "NVML lost access to the GPUs, typically after `systemctl daemon-reload` on a node with the systemd cgroup driver, " +
			"which drops the container's device permissions: restarting the container restores them (the exporter's /healthz asks the kubelet to)"
	}
	return ""
}

package serve

import (
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Flags are the web flags of every gpuslice program, as Prometheus
// exporters spell them.
type Flags struct {
	// ListenAddresses is --web.listen-address, which may be given more
	// than once (an IPv4 and an IPv6 address, say), as in node_exporter.
	ListenAddresses []string
	// SystemdSocket is --web.systemd-socket: serve on the sockets systemd
	// passes instead (socket activation).
	SystemdSocket bool
	MetricsPath   string
	ConfigFile    string
}

// addresses is --web.listen-address: the first value given replaces the
// default, each one after it adds to it.
type addresses struct {
	list *[]string
	set  bool
}

func (a *addresses) String() string {
	if a.list == nil {
		return ""
	}
	return strings.Join(*a.list, ",")
}

// Set takes one address, or several separated by commas (no address has
// one), so that GPUSLICE_WEB_LISTEN_ADDRESS, which is set once, can carry
// several too.
func (a *addresses) Set(v string) error {
	if !a.set {
		*a.list, a.set = nil, true
	}
	*a.list = append(*a.list, strings.Split(v, ",")...)
	return nil
}

// Register adds the flags to fs, defaultAddress being the program's port.
func (f *Flags) Register(fs *flag.FlagSet, defaultAddress string) {
	f.ListenAddresses = []string{defaultAddress}
	fs.Var(&addresses{list: &f.ListenAddresses}, "web.listen-address", "The `address` to serve metrics on; repeat the flag, or separate addresses by commas, for several.")
	fs.BoolVar(&f.SystemdSocket, "web.systemd-socket", false, "Serve on the sockets systemd passes (socket activation) instead of --web.listen-address.")
	fs.StringVar(&f.MetricsPath, "web.telemetry-path", "/metrics", "Path of the metrics.")
	fs.StringVar(&f.ConfigFile, "web.config.file", "", "Prometheus exporter-toolkit web config (TLS, basic auth).")
}

// Validate checks the flags once parsed; reserved are the other paths the
// program serves (/healthz, ...), which the metrics may not take.
func (f *Flags) Validate(reserved ...string) error {
	if len(f.ListenAddresses) == 0 && !f.SystemdSocket {
		return fmt.Errorf("--web.listen-address: no address")
	}
	for _, a := range f.ListenAddresses {
		if a == "" {
			return fmt.Errorf("--web.listen-address: an empty address")
		}
	}
	return checkMetricsPath(f.MetricsPath, reserved)
}

// Options fills the serving options' address, path and web config.
func (f *Flags) Options(o Options) Options {
	o.ListenAddresses, o.SystemdSocket = f.ListenAddresses, f.SystemdSocket
	o.MetricsPath, o.WebConfigFile = f.MetricsPath, f.ConfigFile
	return o
}

// checkMetricsPath refuses a metrics path that Go's ServeMux would panic
// on (it must begin with "/"; a space would read as a method) or that
// another handler already serves.
func checkMetricsPath(p string, reserved []string) error {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, " \t\n{}") {
		return fmt.Errorf("--web.telemetry-path %q: must be a path beginning with / (no spaces or braces)", p)
	}
	if slices.Contains(reserved, p) {
		return fmt.Errorf("--web.telemetry-path %q: the program serves something else there", p)
	}
	// Whatever else ServeMux refuses, refuse it here rather than panic.
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("--web.telemetry-path %q: %v", p, r)
			}
		}()
		http.NewServeMux().Handle(p, http.NotFoundHandler())
	}()
	return err
}

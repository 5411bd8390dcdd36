// Package logging builds the slog logger of every gpuslice program from
// --log.level and --log.format, and routes client-go's klog output into it
// so a program has one log stream in one format.
package logging

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"k8s.io/klog/v2"
)

// Flags are the logging flags.
type Flags struct {
	Level  string
	Format string
}

// Register adds --log.level and --log.format to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Level, "log.level", "info", "Log level: debug, info, warn, error.")
	fs.StringVar(&f.Format, "log.format", "logfmt", "Log format: logfmt or json.")
}

// Logger builds the logger writing to w and makes it slog's default and
// klog's sink.
func (f *Flags) Logger(w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.Level)); err != nil {
		return nil, fmt.Errorf("--log.level %q: %w", f.Level, err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch strings.ToLower(f.Format) {
	case "logfmt", "text", "":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log.format %q: want logfmt or json", f.Format)
	}
	l := slog.New(h)
	slog.SetDefault(l)
	klog.SetSlogLogger(l)
	return l, nil
}

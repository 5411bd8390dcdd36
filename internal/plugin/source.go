package plugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Update is one version of the config document as a source read it.
type Update struct {
	// Data is the document (YAML or JSON, NVIDIA's format).
	Data []byte
	// Origin names where it came from, for errors and logs: "file
	// /etc/gpuslice/config.yaml", "ConfigMap gpu/cfg key a6000".
	Origin string
	// Err is set when the source could not produce a document (a missing
	// file, a missing ConfigMap key). The plugin keeps its last good config.
	Err error
}

// Source delivers the config. Run calls apply with the current document as
// soon as it can and again whenever it changes, until ctx ends; apply returns
// the reason a document was rejected (the source may report it further).
type Source interface {
	Run(ctx context.Context, apply func(Update) error) error
}

// StaticSource is a config that never changes: a fixed document (nil for
// NVIDIA's defaults, every GPU exclusive).
type StaticSource []byte

// Run implements Source.
func (s StaticSource) Run(ctx context.Context, apply func(Update) error) error {
	_ = apply(Update{Data: s, Origin: "built-in defaults"})
	<-ctx.Done()
	return nil
}

// FileSource reads a config file and reads it again when it changes. It
// watches the file's directory rather than the file, because a ConfigMap
// volume replaces its files by swapping a symlink (..data), which a watch on
// the old file would never see.
type FileSource struct {
	Path string
	// Resync re-reads the file on this period even without events
	// (filesystems that do not notify); 0 means 30 s.
	Resync time.Duration
	Logger *slog.Logger
}

// Run implements Source.
func (s *FileSource) Run(ctx context.Context, apply func(Update) error) error {
	log := s.Logger
	if log == nil {
		log = slog.Default()
	}
	resync := s.Resync
	if resync <= 0 {
		resync = 30 * time.Second
	}
	origin := "file " + s.Path
	var last Update
	delivered := false
	read := func() {
		data, err := os.ReadFile(s.Path)
		u := Update{Data: data, Origin: origin}
		if err != nil {
			u = Update{Origin: origin, Err: err}
		}
		if delivered && bytes.Equal(u.Data, last.Data) && errString(u.Err) == errString(last.Err) {
			return
		}
		last, delivered = u, true
		_ = apply(u)
	}

	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", s.Path, err)
	}
	defer w.Close()
	dir := filepath.Dir(s.Path)
	watching := false
	watch := func() {
		if watching {
			return
		}
		if err := w.Add(dir); err != nil {
			log.Warn("cannot watch the config directory; re-reading it periodically", "dir", dir, "err", err)
			return
		}
		watching = true
	}
	watch()
	read()
	tick := time.NewTicker(resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("config file watcher closed")
			}
			if ev.Name == dir && ev.Has(fsnotify.Remove) {
				watching = false
			}
			read()
		case err, ok := <-w.Errors:
			if ok {
				log.Warn("config file watcher", "err", err)
			}
		case <-tick.C:
			watch()
			read()
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

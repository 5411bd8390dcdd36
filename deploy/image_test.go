package deploy

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// localImage is a docker-archive tarball read back: the image config and
// the files of its one layer.
type localImage struct {
	tags   []string
	config struct {
		User         string
		Env          []string
		Labels       map[string]string
		ExposedPorts map[string]struct{}
	}
	files map[string][]byte // absolute path → content (regular files)
	links map[string]string // absolute path → target (symlinks)
}

func readLocalImage(file string) (*localImage, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if h.Typeflag == tar.TypeReg {
			if entries[h.Name], err = io.ReadAll(tr); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", file, h.Name, err)
			}
		}
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(entries["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		return nil, fmt.Errorf("%s: manifest.json: want one image (%v)", file, err)
	}
	img := &localImage{tags: manifest[0].RepoTags, files: map[string][]byte{}, links: map[string]string{}}
	var cfg struct{ Config json.RawMessage }
	if err := json.Unmarshal(entries[manifest[0].Config], &cfg); err != nil {
		return nil, fmt.Errorf("%s: config %s: %w", file, manifest[0].Config, err)
	}
	if err := json.Unmarshal(cfg.Config, &img.config); err != nil {
		return nil, fmt.Errorf("%s: config %s: %w", file, manifest[0].Config, err)
	}
	for _, l := range manifest[0].Layers {
		lr := tar.NewReader(bytes.NewReader(entries[l]))
		for {
			h, err := lr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: layer %s: %w", file, l, err)
			}
			name := "/" + strings.TrimSuffix(h.Name, "/")
			switch h.Typeflag {
			case tar.TypeReg:
				if img.files[name], err = io.ReadAll(lr); err != nil {
					return nil, err
				}
			case tar.TypeSymlink:
				img.links[name] = h.Linkname
			}
		}
	}
	return img, nil
}

// readDockerfile parses the repository's Dockerfile and what its final
// stage installs.
func readDockerfile(t *testing.T, root string) ([]dockerStage, imageLayout) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages, err := parseDockerfile(string(data))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	layout, err := layoutOf(stages)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	return stages, layout
}

// has reports whether the image holds a file at p, following symlinks.
func (img *localImage) has(p string) bool {
	for range 10 {
		if _, ok := img.files[p]; ok {
			return true
		}
		t, ok := img.links[p]
		if !ok {
			return false
		}
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(p), t)
		}
		p = t
	}
	return false
}

// TestLocalImage builds the image the way `make image` does (hack/image.sh:
// no container engine, no registry) and checks it against the Dockerfile
// that registry users build: the same binaries at the same paths, each
// built with cgo from its ./cmd package; the ELF interpreter and every
// library the binaries need in the image, so they start; the Dockerfile's
// USER, PATH, EXPOSE and labels in the image config.
func TestLocalImage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the three programs")
	}
	root := repoRoot(t)
	stages, layout := readDockerfile(t, root)
	final := stages[len(stages)-1]

	out := filepath.Join(t.TempDir(), "gpuslice.tar")
	cmd := exec.CommandContext(t.Context(), "bash", filepath.Join(root, "hack", "image.sh"), out)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "IMAGE=gpuslice.test/gpuslice:test")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/image.sh: %v\n%s", err, b)
	}
	img, err := readLocalImage(out)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"gpuslice.test/gpuslice:test"}, img.tags); diff != "" {
		t.Errorf("image tags (-IMAGE +tarball):\n%s", diff)
	}

	t.Run("config", func(t *testing.T) {
		if img.config.User != layout.user {
			t.Errorf("USER %q, the Dockerfile's is %q", img.config.User, layout.user)
		}
		if want := final.vars("ENV"); !slices.Contains(img.config.Env, "PATH="+want["PATH"]) {
			t.Errorf("Env %v, want the Dockerfile's PATH=%s", img.config.Env, want["PATH"])
		}
		if diff := cmp.Diff(final.vars("LABEL"), img.config.Labels); diff != "" {
			t.Errorf("labels (-Dockerfile +image):\n%s", diff)
		}
		var want []string
		for _, e := range final.all("EXPOSE") {
			for p := range strings.FieldsSeq(e) {
				want = append(want, p+"/tcp")
			}
		}
		if diff := cmp.Diff(slices.Sorted(slices.Values(want)), slices.Sorted(maps.Keys(img.config.ExposedPorts))); diff != "" {
			t.Errorf("exposed ports (-Dockerfile +image):\n%s", diff)
		}
	})

	for bin, pkg := range layout.binaries {
		t.Run("binary"+bin, func(t *testing.T) {
			b, ok := img.files[bin]
			if !ok {
				t.Fatalf("the Dockerfile installs %s (from %s); the image has no such file", bin, pkg)
			}
			info, err := buildinfo.Read(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("%s: %v", bin, err)
			}
			if want := "github.com/gpuslice/gpuslice/" + strings.TrimPrefix(pkg, "./"); info.Path != want {
				t.Errorf("%s is built from %s, want %s", bin, info.Path, want)
			}
			settings := map[string]string{}
			for _, s := range info.Settings {
				settings[s.Key] = s.Value
			}
			if settings["CGO_ENABLED"] != "1" {
				t.Errorf("%s built with CGO_ENABLED=%q: go-nvml needs cgo", bin, settings["CGO_ENABLED"])
			}
			ef, err := elf.NewFile(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("%s: %v", bin, err)
			}
			for _, p := range ef.Progs {
				if p.Type != elf.PT_INTERP {
					continue
				}
				interp, err := io.ReadAll(p.Open())
				if err != nil {
					t.Fatal(err)
				}
				if in := strings.TrimRight(string(interp), "\x00"); !img.has(in) {
					t.Errorf("%s: its ELF interpreter %s is not in the image", bin, in)
				}
			}
			needed, err := ef.ImportedLibraries()
			if err != nil {
				t.Fatal(err)
			}
			for _, lib := range needed {
				found := slices.ContainsFunc([]string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/lib", "/usr/lib"},
					func(dir string) bool { return img.has(path.Join(dir, lib)) })
				if !found {
					t.Errorf("%s needs %s, which is in none of the loader's directories in the image", bin, lib)
				}
			}
		})
	}
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		if !img.has(f) {
			t.Errorf("no %s: the Dockerfile's base has one, so user names resolve", f)
		}
	}
}

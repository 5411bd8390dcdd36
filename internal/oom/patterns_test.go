package oom

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// oomLines are GPU OOM messages as the frameworks print them.
var oomLines = []struct{ name, line string }{
	{"pytorch 2.4", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 47.53 GiB of which 1.06 GiB is free. Process 28341 has 46.46 GiB memory in use. Of the allocated memory 45.80 GiB is allocated by PyTorch, and 187.62 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"},
	{"pytorch 1.x", "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity; 9.72 GiB already allocated; 11.69 MiB free; 9.87 GiB reserved in total by PyTorch)"},
	{"pytorch 2.0", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB (GPU 0; 23.69 GiB total capacity; 21.02 GiB already allocated; 562.06 MiB free; 22.11 GiB reserved in total by PyTorch)"},
	{"pytorch data parallel", "torch.cuda.OutOfMemoryError: Caught OutOfMemoryError in replica 0 on device 0."},
	{"cuda runtime", "RuntimeError: CUDA error: out of memory"},
	{"cupy", "cupy.cuda.runtime.CUDARuntimeError: cudaErrorMemoryAllocation: out of memory"},
	{"tensorflow driver", "2026-11-23 09:00:01.123456: E tensorflow/stream_executor/cuda/cuda_driver.cc:733] failed to allocate 1.00G (1073741824 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory"},
	{"cublas", "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"},
	{"cudnn", "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED"},
	{"jax xla", "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes."},
	{"jax old", "RuntimeError: Resource exhausted: Out of memory while trying to allocate 4294967296 bytes."},
	{"jax request", "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 16.00GiB (17179869184B) on device ordinal 0"},
	{"tensorflow tensor", "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[8192,8192] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc [Op:MatMul]"},
	{"nccl", "gpu-0:42:42 [0] misc/utils.cc:131 NCCL WARN Cuda failure 'out of memory'"},
}

// ordinaryLines must not match: host OOM, other runtimes, mentions of memory.
var ordinaryLines = []string{
	"memory usage ok",
	"Out of memory: Killed process 4242 (python) total-vm:81234567kB, anon-rss:61234567kB, file-rss:0kB",
	"Memory cgroup out of memory: Killed process 1234 (python3) total-vm:123456kB",
	"cudaMalloc succeeded: 2147483648 bytes",
	"java.lang.OutOfMemoryError: Java heap space",
	"torch.cuda.memory_allocated(): 1.23 GiB, max_memory_reserved: 4.00 GiB",
	"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
	`grpc._channel._InactiveRpcError: status = StatusCode.RESOURCE_EXHAUSTED details = "Received message larger than max (8388608 vs. 4194304)"`,
	"RESOURCE_EXHAUSTED: Quota exceeded for quota metric 'Requests'",
	// TensorFlow says itself that this one is not a failure.
	"Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.20GiB with freed_by_count=0. The caller indicates that this is not a failure, but this may mean that there could be performance gains if more memory were available.",
	"OOMKilled",
	"Epoch 12/100 - loss: 0.2331 - gpu_mem: 11.2G",
	"",
}

func TestMatch(t *testing.T) {
	d, err := NewDetector(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range oomLines {
		t.Run(tc.name, func(t *testing.T) {
			if !d.Match(tc.line) {
				t.Errorf("Match(%q) = false, want true", tc.line)
			}
		})
	}
	for _, line := range ordinaryLines {
		t.Run("ordinary/"+line, func(t *testing.T) {
			if d.Match(line) {
				t.Errorf("Match(%q) = true, want false", line)
			}
		})
	}
}

// The literal prefilter must give the same answers as the plain regexp.
func TestPrefilterAgreesWithRegexp(t *testing.T) {
	m, err := newMatcher(DefaultPatterns)
	if err != nil {
		t.Fatal(err)
	}
	if m.literals == nil {
		t.Fatal("default patterns got no literal prefilter")
	}
	lines := slices.Concat(ordinaryLines, []string{"CUDA out of memory", "RESOURCE_EXHAUSTED while allocating", "Cuda failure out of memory"})
	for _, tc := range oomLines {
		lines = append(lines, tc.line)
	}
	for _, line := range lines {
		want := m.re.MatchString(line) && !m.host.MatchString(line)
		if got := m.match([]byte(line)); got != want {
			t.Errorf("match(%q) = %v, regexp says %v", line, got, want)
		}
	}
}

func TestRequiredLiterals(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		want    []string
	}{
		{`CUDA out of memory`, []string{"CUDA out of memory"}},
		{`\btorch\.(?:cuda\.)?OutOfMemoryError\b`, []string{"OutOfMemoryError"}},
		{`\bRESOURCE_EXHAUSTED\b.*(?:[Mm]emory|[Aa]llocat)`, []string{"RESOURCE_EXHAUSTED"}},
		// An alternation needs a literal from every branch.
		{`abcd|efgh`, []string{"abcd", "efgh"}},
		{`(?:[Oo]ut of memory|OUT OF MEMORY)`, []string{"ut of memory", "OUT OF MEMORY"}},
		{`foo|barbaz`, nil}, // "foo" is too short to be worth searching for
		{`(?i)cuda out of memory`, nil},
		{`(x+)?`, nil},
		{`(abcd)+e`, []string{"abcd"}},
	} {
		t.Run(tc.pattern, func(t *testing.T) {
			if got := requiredLiterals(tc.pattern); !slices.Equal(got, tc.want) {
				t.Errorf("requiredLiterals(%q) = %q, want %q", tc.pattern, got, tc.want)
			}
		})
	}
}

func TestMinimalLiterals(t *testing.T) {
	got := minimalLiterals([]string{"CUDA out of memory", "out of memory", "OutOfMemory", "out of memory", "cudaMalloc failed: out of memory"})
	want := []string{"OutOfMemory", "out of memory"}
	if !slices.Equal(got, want) {
		t.Errorf("minimalLiterals = %q, want %q", got, want)
	}
}

func TestCustomPatterns(t *testing.T) {
	// A case-insensitive pattern has no literal: every line goes to the regexp.
	d, err := NewDetector(Config{Patterns: []string{`(?i)gpu oom`, `XYZ_FAIL`}})
	if err != nil {
		t.Fatal(err)
	}
	for line, want := range map[string]bool{
		"GPU OOM in step 3":  true,
		"XYZ_FAIL":           true,
		"CUDA out of memory": false, // defaults are replaced, not added to
	} {
		if got := d.Match(line); got != want {
			t.Errorf("Match(%q) = %v, want %v", line, got, want)
		}
	}
}

func TestBadPattern(t *testing.T) {
	for _, tc := range []struct {
		name     string
		patterns []string
		mention  string
	}{
		{"unclosed group", []string{"CUDA out of memory", "torch.(OutOfMemoryError"}, "torch.(OutOfMemoryError"},
		{"bad repeat", []string{"*alloc"}, "*alloc"},
		{"empty list", []string{}, "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewDetector(Config{Patterns: tc.patterns})
			if err == nil {
				t.Fatalf("NewDetector returned %v and no error", d)
			}
			if !errors.Is(err, ErrBadPattern) {
				t.Errorf("error %q does not wrap ErrBadPattern", err)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not name %q", err, tc.mention)
			}
		})
	}
}

func TestExcerpt(t *testing.T) {
	m, err := newMatcher(DefaultPatterns)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("é", 600) // 2 bytes a rune: cuts must respect them
	for _, tc := range []struct {
		name, line string
		contains   string
	}{
		{"short, trimmed", "  RuntimeError: CUDA error: out of memory \t", "RuntimeError: CUDA error: out of memory"},
		{"match at start", "RuntimeError: CUDA error: out of memory " + long, "RuntimeError: CUDA error: out of memory"},
		{"match far in", long + " RuntimeError: CUDA error: out of memory " + long, "RuntimeError: CUDA error: out of memory"},
		{"match at end", long + " CUDA out of memory", "CUDA out of memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := m.excerpt([]byte(tc.line))
			if len(got) > maxMessageBytes {
				t.Errorf("excerpt is %d bytes, more than %d", len(got), maxMessageBytes)
			}
			if !utf8.ValidString(got) {
				t.Errorf("excerpt %q is not valid UTF-8", got)
			}
			if !strings.Contains(got, tc.contains) {
				t.Errorf("excerpt %q lost the match %q", got, tc.contains)
			}
		})
	}
}

// firstBySearch is matcher.first searching for each literal on its own,
// the plain way the literal finder must agree with.
func firstBySearch(m *matcher, b []byte) (int, bool) {
	best := -1
	for li, lit := range m.literals {
		if !bytes.Contains(b, lit) {
			continue
		}
		for _, i := range m.users[li] {
			if (best < 0 || i < best) && m.each[i].Match(b) {
				best = i
				break
			}
		}
	}
	if best < 0 || m.host.Match(b) {
		return 0, false
	}
	return best, true
}

// TestLiteralFinder: the one-pass literal search gives what searching for
// each literal gives, on the corpus and on lines built to find its edges:
// literals at either end, cut short by a byte, repeated, overlapping.
func TestLiteralFinder(t *testing.T) {
	m, err := newMatcher(DefaultPatterns)
	if err != nil {
		t.Fatal(err)
	}
	lines := slices.Clone(ordinaryLines)
	for _, tc := range oomLines {
		lines = append(lines, tc.line)
	}
	for _, msgs := range [][]realMessage{realPositives, realNegatives} {
		for _, r := range msgs {
			lines = append(lines, r.line)
		}
	}
	for _, s := range Catalogue {
		lines = append(lines, s.Example, s.NearMiss)
	}
	for i, lit := range m.literals {
		l := string(lit)
		next := string(m.literals[(i+1)%len(m.literals)])
		lines = append(lines, l, "x"+l, l+"x", l[:len(l)-1], l[1:], l+l, l+" "+l, l[:len(l)/2]+next+l[len(l)/2:],
			"CUDA error: "+l+" (allocating 2 GiB)", "RuntimeError: CUDA"+l+next)
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		var b strings.Builder
		for range rnd.IntN(6) {
			if lit := m.literals[rnd.IntN(len(m.literals))]; rnd.IntN(2) == 0 {
				b.Write(lit[:rnd.IntN(len(lit)+1)])
			} else {
				b.Write(lit[rnd.IntN(len(lit)):])
			}
			b.WriteString([]string{"", " ", "out of memory", "CUDA ", "\t"}[rnd.IntN(5)])
		}
		lines = append(lines, b.String())
	}
	for _, line := range lines {
		gotI, gotOK := m.first([]byte(line))
		wantI, wantOK := firstBySearch(m, []byte(line))
		if gotI != wantI || gotOK != wantOK {
			t.Errorf("first(%q) = %d, %v; searching each literal gives %d, %v", line, gotI, gotOK, wantI, wantOK)
		}
	}
}

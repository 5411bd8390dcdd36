package oom

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"strings"
	"unicode/utf8"
)

// DefaultPatterns are the regular expressions (Go RE2 syntax) that mark a GPU
// out-of-memory failure in a log line or a termination message. They are case
// sensitive because the frameworks print these strings with fixed case, and
// each is specific enough that ordinary lines do not match: the kernel's host
// OOM killer ("Out of memory: Killed process 42"), a Java heap
// OutOfMemoryError, gRPC's RESOURCE_EXHAUSTED for quotas and message sizes,
// and lines that merely mention memory or cudaMalloc.
var DefaultPatterns = []string{
	// PyTorch's caching allocator: "torch.OutOfMemoryError: CUDA out of
	// memory. Tried to allocate 2.00 GiB …" (before 1.13: "RuntimeError:
	// CUDA out of memory.").
	`CUDA out of memory`,
	// The exception class alone, for re-raised or reformatted errors; the
	// "torch." prefix keeps Java's OutOfMemoryError out.
	`\btorch\.(?:cuda\.)?OutOfMemoryError\b`,
	// The CUDA runtime's error string as PyTorch and others raise it:
	// "RuntimeError: CUDA error: out of memory".
	`CUDA error: out of memory`,
	`\bcudaErrorMemoryAllocation\b`,
	// The driver API's name for it, e.g. TensorFlow's "failed to allocate
	// 1.00G (1073741824 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY".
	`\bCUDA_ERROR_OUT_OF_MEMORY\b`,
	`\bCUBLAS_STATUS_ALLOC_FAILED\b`,
	`\bCUDNN_STATUS_ALLOC_FAILED\b`,
	// XLA, under JAX and TensorFlow: "XlaRuntimeError: RESOURCE_EXHAUSTED:
	// Out of memory while trying to allocate 17179869184 bytes."
	`Out of memory while trying to allocate`,
	// RESOURCE_EXHAUSTED is also gRPC's status for quotas and oversized
	// messages, so it counts only next to a word about memory or allocation.
	`\bRESOURCE_EXHAUSTED\b.*(?:[Mm]emory|[Aa]llocat|\bOOM\b)`,
	// TensorFlow: "ResourceExhaustedError: OOM when allocating tensor with
	// shape[8192,8192] and type float on /job:localhost/…/device:GPU:0".
	`\bOOM when allocating tensor\b`,
	// NCCL: "Cuda failure 'out of memory'".
	`Cuda failure '?out of memory`,
}

// ErrBadPattern is wrapped by NewDetector's error for a pattern that is not a
// valid regular expression.
var ErrBadPattern = errors.New("invalid OOM pattern")

// matcher tests text against all patterns at once. Most log lines match
// nothing, so when every pattern has a literal that any match must contain,
// a line is first searched for those literals (fast, vectorised) and the
// regular expression runs only on the few lines that hold one.
type matcher struct {
	re       *regexp.Regexp
	literals [][]byte // nil: no prefilter, run re on every line
}

func newMatcher(patterns []string) (*matcher, error) {
	if len(patterns) == 0 {
		return nil, fmt.Errorf("%w: the pattern list is empty", ErrBadPattern)
	}
	parts := make([]string, len(patterns))
	var literals [][]byte
	prefilter := true
	for i, p := range patterns {
		if _, err := regexp.Compile(p); err != nil {
			return nil, fmt.Errorf("%w %d %q: %w", ErrBadPattern, i, p, err)
		}
		parts[i] = "(?:" + p + ")"
		lit := requiredLiteral(p)
		if lit == "" {
			prefilter = false
		}
		literals = append(literals, []byte(lit))
	}
	re, err := regexp.Compile(strings.Join(parts, "|"))
	if err != nil {
		// Each part compiled alone, so only the joined size can fail here.
		return nil, fmt.Errorf("%w: the %d patterns together: %w", ErrBadPattern, len(patterns), err)
	}
	m := &matcher{re: re}
	if prefilter {
		m.literals = literals
	}
	return m, nil
}

func (m *matcher) match(b []byte) bool {
	if m.literals != nil && !m.hasLiteral(b) {
		return false
	}
	return m.re.Match(b)
}

func (m *matcher) hasLiteral(b []byte) bool {
	for _, lit := range m.literals {
		if bytes.Contains(b, lit) {
			return true
		}
	}
	return false
}

// requiredLiteral returns the longest case-sensitive literal that every match
// of pattern contains, or "" when there is none to rely on.
func requiredLiteral(pattern string) string {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return ""
	}
	return literalOf(re.Simplify())
}

func literalOf(re *syntax.Regexp) string {
	switch re.Op {
	case syntax.OpLiteral:
		if re.Flags&syntax.FoldCase != 0 {
			return ""
		}
		return string(re.Rune)
	case syntax.OpCapture, syntax.OpPlus:
		return literalOf(re.Sub[0])
	case syntax.OpRepeat:
		if re.Min >= 1 {
			return literalOf(re.Sub[0])
		}
	case syntax.OpConcat:
		best := ""
		for _, sub := range re.Sub {
			if lit := literalOf(sub); len(lit) > len(best) {
				best = lit
			}
		}
		return best
	}
	return ""
}

// firstMatchingLine returns the first line of text that matches, trimmed for
// an Event's Message.
func (m *matcher) firstMatchingLine(text string) (string, bool) {
	for line := range strings.Lines(text) {
		if b := []byte(line); m.match(b) {
			return m.excerpt(b), true
		}
	}
	return "", false
}

// maxMessageBytes bounds Event.Message, which ends up in logs and events.
const maxMessageBytes = 512

// excerpt trims a matching line to maxMessageBytes, keeping the match in view
// when the line is longer, and cuts only at UTF-8 boundaries.
func (m *matcher) excerpt(line []byte) string {
	line = bytes.TrimSpace(line)
	if len(line) <= maxMessageBytes {
		return string(line)
	}
	start := 0
	if loc := m.re.FindIndex(line); loc != nil && loc[1] > maxMessageBytes {
		start = max(0, loc[0]-maxMessageBytes/4)
	}
	end := min(len(line), start+maxMessageBytes)
	start = max(0, end-maxMessageBytes)
	for start < end && !utf8.RuneStart(line[start]) {
		start++
	}
	for end < len(line) && end > start && !utf8.RuneStart(line[end]) {
		end--
	}
	return string(line[start:end])
}

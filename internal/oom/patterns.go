package oom

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"unicode/utf8"
)

// ErrBadPattern is wrapped by NewDetector's error for a pattern that is not a
// valid regular expression.
var ErrBadPattern = errors.New("invalid OOM pattern")

// matcher tests text against all patterns at once. Most log lines match
// nothing, so when every pattern has literals one of which any match must
// contain, a line is first searched for those literals (fast, vectorised)
// and the regular expression runs only on the few lines that hold one.
type matcher struct {
	re       *regexp.Regexp
	literals [][]byte // nil: no prefilter, run re on every line
	// users[i] are the indexes in each of the patterns that literals[i]
	// stands for: a line that holds it runs those alone, not all of re.
	users [][]int
	// host marks lines about host memory, which are never events.
	host *regexp.Regexp
	// each and kinds are the patterns one by one with their Kind, consulted
	// only for a line that matched, to say which kind it is.
	each  []*regexp.Regexp
	kinds []Kind
}

// minLiteral is the shortest literal worth a prefilter: shorter ones occur
// in most lines, so the prefilter would only add work.
const minLiteral = 4

var hostMemory = regexp.MustCompile(HostMemoryPattern)

func newMatcher(patterns []string) (*matcher, error) {
	if len(patterns) == 0 {
		return nil, fmt.Errorf("%w: the pattern list is empty", ErrBadPattern)
	}
	kindOf := make(map[string]Kind, len(Catalogue))
	for _, s := range Catalogue {
		kindOf[s.Pattern] = s.Kind
	}
	m := &matcher{host: hostMemory}
	parts := make([]string, len(patterns))
	var literals []string
	own := make([][]string, len(patterns))
	prefilter := true
	for i, p := range patterns {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("%w %d %q: %w", ErrBadPattern, i, p, err)
		}
		m.each = append(m.each, re)
		m.kinds = append(m.kinds, kindOf[p]) // KindUnknown if not catalogued
		parts[i] = "(?:" + p + ")"
		own[i] = requiredLiterals(p)
		if own[i] == nil {
			prefilter = false
		}
		literals = append(literals, own[i]...)
	}
	re, err := regexp.Compile(strings.Join(parts, "|"))
	if err != nil {
		// Each part compiled alone, so only the joined size can fail here.
		return nil, fmt.Errorf("%w: the %d patterns together: %w", ErrBadPattern, len(patterns), err)
	}
	m.re = re
	if prefilter {
		for _, l := range minimalLiterals(literals) {
			var users []int
			for i, lits := range own {
				if slices.ContainsFunc(lits, func(o string) bool { return strings.Contains(o, l) }) {
					users = append(users, i)
				}
			}
			m.literals = append(m.literals, []byte(l))
			m.users = append(m.users, users)
		}
	}
	return m, nil
}

// minimalLiterals drops duplicates and every literal that contains another
// one: a line holding the longer one holds the shorter, so searching for the
// shorter alone gives the same answer with fewer searches.
func minimalLiterals(lits []string) []string {
	slices.SortStableFunc(lits, func(a, b string) int { return cmp.Compare(len(a), len(b)) })
	var out []string
	for _, l := range lits {
		if !slices.ContainsFunc(out, func(o string) bool { return strings.Contains(l, o) }) {
			out = append(out, l)
		}
	}
	return out
}

func (m *matcher) match(b []byte) bool {
	_, ok := m.first(b)
	return ok
}

// kind returns the Kind of a line that match accepted.
func (m *matcher) kind(b []byte) Kind {
	i, _ := m.first(b)
	if i < 0 {
		return KindUnknown
	}
	return m.kinds[i]
}

// first returns the index of the first pattern that matches b, if b is a
// GPU OOM line; -1 with true when the patterns matched but there is no
// prefilter to say which (the caller then asks each pattern).
func (m *matcher) first(b []byte) (int, bool) {
	if m.literals == nil {
		if !m.re.Match(b) || m.host.Match(b) {
			return 0, false
		}
		for i, re := range m.each {
			if re.Match(b) {
				return i, true
			}
		}
		return -1, true
	}
	best := -1
	for li, lit := range m.literals {
		if !bytes.Contains(b, lit) {
			continue
		}
		for _, i := range m.users[li] {
			if (best < 0 || i < best) && m.each[i].Match(b) {
				best = i
				break // users are in pattern order: the rest come later
			}
		}
	}
	if best < 0 || m.host.Match(b) {
		return 0, false
	}
	return best, true
}

// requiredLiterals returns case-sensitive literals, at least minLiteral
// bytes each, one of which every match of pattern contains, or nil when
// there are none to rely on.
func requiredLiterals(pattern string) []string {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil
	}
	return literalsOf(re.Simplify())
}

func literalsOf(re *syntax.Regexp) []string {
	switch re.Op {
	case syntax.OpLiteral:
		if re.Flags&syntax.FoldCase != 0 || len(string(re.Rune)) < minLiteral {
			return nil
		}
		return []string{string(re.Rune)}
	case syntax.OpCapture, syntax.OpPlus:
		return literalsOf(re.Sub[0])
	case syntax.OpRepeat:
		if re.Min >= 1 {
			return literalsOf(re.Sub[0])
		}
	case syntax.OpConcat:
		// Any one part's literals will do; take those whose shortest is
		// longest, as longer literals occur in fewer lines.
		var best []string
		for _, sub := range re.Sub {
			if lits := literalsOf(sub); lits != nil && (best == nil || shortest(lits) > shortest(best)) {
				best = lits
			}
		}
		return best
	case syntax.OpAlternate:
		// A match takes one branch, so it needs one literal of each.
		var all []string
		for _, sub := range re.Sub {
			lits := literalsOf(sub)
			if lits == nil {
				return nil
			}
			all = append(all, lits...)
		}
		return all
	}
	return nil
}

func shortest(lits []string) int {
	n := len(lits[0])
	for _, l := range lits[1:] {
		n = min(n, len(l))
	}
	return n
}

// firstMatchingLine returns the first line of text that matches, trimmed for
// an Event's Message, and its Kind.
func (m *matcher) firstMatchingLine(text string) (string, Kind, bool) {
	for line := range strings.Lines(text) {
		if b := []byte(line); m.match(b) {
			return m.excerpt(b), m.kind(b), true
		}
	}
	return "", KindUnknown, false
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

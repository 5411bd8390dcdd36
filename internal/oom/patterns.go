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
// contain, a line is first searched for those literals, all in one pass
// (literalFinder), and the regular expressions run only on the few lines
// that hold one.
type matcher struct {
	re       *regexp.Regexp
	literals [][]byte // nil: no prefilter, run re on every line
	// find finds the literals of a line in one pass.
	find *literalFinder
	// users[i] are the indexes in each of the patterns that literals[i]
	// stands for: a line that holds it runs those alone, not all of re.
	users [][]int
	// host marks lines about host memory, which are never events.
	host *regexp.Regexp
	// each and kinds are the patterns one by one with their Kind, consulted
	// only for a line that matched, to say which kind it is.
	each  []*regexp.Regexp
	kinds []Kind
	// refine[i] and follow[i], where not nil, are pattern i's
	// Signature.Refine and Signature.Follow.
	refine []func([]byte) Kind
	follow []func([][]byte) (Kind, bool)
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
	refineOf := make(map[string]func([]byte) Kind, len(Catalogue))
	followOf := make(map[string]func([][]byte) (Kind, bool), len(Catalogue))
	for _, s := range Catalogue {
		kindOf[s.Pattern] = s.Kind
		if s.Refine != nil {
			refineOf[s.Pattern] = s.Refine
		}
		if s.Follow != nil {
			followOf[s.Pattern] = s.Follow
		}
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
		m.refine = append(m.refine, refineOf[p])
		m.follow = append(m.follow, followOf[p])
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
		m.find = newLiteralFinder(m.literals)
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
	if r := m.refine[i]; r != nil {
		return r(b)
	}
	return m.kinds[i]
}

// follower is the Signature.Follow of the pattern a matching line b
// matched first, nil for none.
func (m *matcher) follower(b []byte) func([][]byte) (Kind, bool) {
	i, _ := m.first(b)
	if i < 0 {
		return nil
	}
	return m.follow[i]
}

// lineReader feeds the lines after a message, one at a time, to its
// Signature.Follow, in a log and in a termination message alike.
type lineReader struct {
	read  func([][]byte) (Kind, bool)
	after [][]byte
}

// add reads the next line: the kind once the lines tell it (told), and
// done once they did or maxFollow lines came.
func (r *lineReader) add(line []byte) (kind Kind, told, done bool) {
	r.after = append(r.after, bytes.Clone(line))
	kind, told = r.read(r.after)
	return kind, told, told || len(r.after) >= maxFollow
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
	var tried uint64 // literals whose patterns ran, the first 64
	f := m.find
	for i := 0; i+1 < len(b); i++ {
		p := uint16(b[i])<<8 | uint16(b[i+1])
		if f.pairs[p/64]&(1<<(p%64)) == 0 {
			continue
		}
		for _, a := range f.anchors[p] {
			start := i - a.off
			if start < 0 || !bytes.HasPrefix(b[start:], m.literals[a.lit]) {
				continue
			}
			if a.lit < 64 {
				if tried&(1<<a.lit) != 0 {
					continue
				}
				tried |= 1 << a.lit
			}
			for _, pi := range m.users[a.lit] {
				if (best < 0 || pi < best) && m.each[pi].Match(b) {
					best = pi
					break // users are in pattern order: the rest come later
				}
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
	lines := slices.Collect(strings.Lines(text))
	for i, line := range lines {
		b := []byte(line)
		if !m.match(b) {
			continue
		}
		kind := m.kind(b)
		if f := m.follower(b); f != nil {
			r := lineReader{read: f}
			for _, l := range lines[i+1:] {
				k, told, done := r.add([]byte(l))
				if told {
					kind = k
				}
				if done {
					break
				}
			}
		}
		return m.excerpt(b), kind, true
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

// literalFinder finds the literals a line holds in one pass over the line
// instead of one search per literal: with the catalogue's 23 literals, 23
// searches of every log line cost more than all the rest of reading a log.
// Each literal is anchored at the pair of its bytes that is rarest in log
// text (by rough letter frequencies), and a bitmap of the anchor pairs
// (8 KiB, which stays in the first-level cache) is tested at every position
// of the line; only where it holds a pair is a literal compared.
type literalFinder struct {
	pairs   [1 << 16 / 64]uint64
	anchors map[uint16][]anchor
}

// anchor places literal lit (an index in matcher.literals) with its anchor
// pair off bytes into it.
type anchor struct{ lit, off int }

// newLiteralFinder indexes lits, each at least two bytes long.
func newLiteralFinder(lits [][]byte) *literalFinder {
	f := &literalFinder{anchors: map[uint16][]anchor{}}
	for li, l := range lits {
		off := 0
		for i := 1; i+1 < len(l); i++ {
			if pairWeight(l[i], l[i+1]) < pairWeight(l[off], l[off+1]) {
				off = i
			}
		}
		p := uint16(l[off])<<8 | uint16(l[off+1])
		f.pairs[p/64] |= 1 << (p % 64)
		f.anchors[p] = append(f.anchors[p], anchor{lit: li, off: off})
	}
	return f
}

// pairWeight is how common the byte pair a, b is in log text, roughly:
// the product of the bytes' frequencies.
func pairWeight(a, b byte) float64 { return byteWeight(a) * byteWeight(b) }

// letterFrequency is each lower-case letter's share of English text, in
// per mille.
var letterFrequency = [26]float64{
	82, 15, 28, 43, 127, 22, 20, 61, 70, 2, 8, 40, 24, // a-m
	67, 75, 19, 1, 60, 63, 91, 28, 10, 24, 2, 20, 1, // n-z
}

func byteWeight(c byte) float64 {
	switch {
	case c >= 'a' && c <= 'z':
		return letterFrequency[c-'a']
	case c == ' ':
		return 150
	case c >= 'A' && c <= 'Z':
		return letterFrequency[c-'A'] / 4 // log lines are mostly lower case
	case c >= '0' && c <= '9':
		return 30 // numbers fill log lines
	case c == '.' || c == ',' || c == ':' || c == '=' || c == '-' || c == '/':
		return 20
	default:
		return 5
	}
}

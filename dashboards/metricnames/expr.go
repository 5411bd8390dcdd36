package metricnames

import (
	"errors"
	"fmt"
	"strings"
)

// ErrSyntax marks an expression the scanner cannot read. The scanner is not a
// full PromQL parser (github.com/prometheus/prometheus is not a dependency):
// it knows enough of the grammar to tell metric names from function names,
// label names, keywords, durations and Grafana variables, and rejects what it
// does not understand rather than guessing.
var ErrSyntax = errors.New("cannot scan PromQL")

// ErrUnknownFunction marks a call of something that is not a PromQL function,
// which is how a misspelt function (or a metric written as a call) shows up.
var ErrUnknownFunction = errors.New("unknown PromQL function")

// ErrUnknownMetric marks a metric name that none of gpuslice's programs
// exports.
var ErrUnknownMetric = errors.New("metric not exported by gpuslice")

// Aggregation operators are keywords: they may be followed by a by/without
// clause before their parenthesised arguments, and like every PromQL keyword
// they are case-insensitive.
var aggregations = set("sum", "avg", "min", "max", "count", "stddev", "stdvar",
	"topk", "bottomk", "quantile", "count_values", "group", "limitk", "limit_ratio")

// Functions are matched case-sensitively, as Prometheus does. The set is
// Prometheus 2.42's plus later additions, so an expression written for a newer
// server still scans.
var functions = set("abs", "absent", "absent_over_time", "acos", "acosh", "asin",
	"asinh", "atan", "atanh", "avg_over_time", "ceil", "changes", "clamp",
	"clamp_max", "clamp_min", "cos", "cosh", "count_over_time", "day_of_month",
	"day_of_week", "day_of_year", "days_in_month", "deg", "delta", "deriv",
	"double_exponential_smoothing", "exp", "floor", "histogram_avg",
	"histogram_count", "histogram_fraction", "histogram_quantile",
	"histogram_stddev", "histogram_stdvar", "histogram_sum", "holt_winters",
	"hour", "idelta", "increase", "info", "irate", "label_join", "label_replace",
	"last_over_time", "ln", "log10", "log2", "mad_over_time", "max_over_time",
	"min_over_time", "minute", "month", "pi", "predict_linear",
	"present_over_time", "quantile_over_time", "rad", "rate", "resets", "round",
	"scalar", "sgn", "sin", "sinh", "sort", "sort_by_label", "sort_by_label_desc",
	"sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time",
	"tan", "tanh", "time", "timestamp", "vector", "year",
	// The @ modifier's start() and end().
	"start", "end")

// Grouping keywords take a parenthesised list of label names, which must not
// be mistaken for metric names.
var grouping = set("by", "without", "on", "ignoring", "group_left", "group_right")

var keywords = set("and", "or", "unless", "bool", "offset", "atan2", "inf", "nan")

func set(words ...string) map[string]bool {
	m := make(map[string]bool, len(words))
	for _, w := range words {
		m[w] = true
	}
	return m
}

// Extract returns the metric names expr reads, each once, in the order they
// first appear. Grafana variables ($node, ${node:regex}, $__rate_interval,
// [[interval]]) are accepted wherever Grafana allows them.
func Extract(expr string) ([]string, error) {
	s := &scanner{src: expr, seen: map[string]bool{}}
	if err := s.run(); err != nil {
		return nil, fmt.Errorf("%w: %w in %q", ErrSyntax, err, expr)
	}
	return s.names, nil
}

// ExtractVariableQuery returns the metric names a Grafana Prometheus template
// variable query reads: label_values(expr, label), label_values(label),
// label_names(), query_result(expr), or a plain PromQL expression.
// metrics(regex) is rejected because the names it matches are not knowable.
func ExtractVariableQuery(query string) ([]string, error) {
	q := strings.TrimSpace(query)
	if inner, ok := call(q, "label_values"); ok {
		args, err := splitArgs(inner)
		if err != nil {
			return nil, fmt.Errorf("%w: %w in %q", ErrSyntax, err, query)
		}
		switch len(args) {
		case 1: // label_values(label): no metric involved.
			return nil, nil
		case 2:
			return Extract(args[0])
		default:
			return nil, fmt.Errorf("%w: label_values takes 1 or 2 arguments, got %d in %q", ErrSyntax, len(args), query)
		}
	}
	if inner, ok := call(q, "label_names"); ok {
		if strings.TrimSpace(inner) == "" {
			return nil, nil
		}
		return Extract(inner)
	}
	if inner, ok := call(q, "query_result"); ok {
		return Extract(inner)
	}
	if _, ok := call(q, "metrics"); ok {
		return nil, fmt.Errorf("%w: metrics(regex) matches names that cannot be checked: %q", ErrSyntax, query)
	}
	return Extract(q)
}

// Check returns an error wrapping ErrUnknownMetric for every metric name in
// expr that is not Known, or the scanner's error.
func Check(expr string) error {
	names, err := Extract(expr)
	if err != nil {
		return err
	}
	return unknown(names, expr)
}

// CheckVariableQuery is Check for a Grafana template variable query.
func CheckVariableQuery(query string) error {
	names, err := ExtractVariableQuery(query)
	if err != nil {
		return err
	}
	return unknown(names, query)
}

func unknown(names []string, expr string) error {
	var errs []error
	for _, n := range names {
		if !Known(n) {
			errs = append(errs, fmt.Errorf("%w: %q in %q", ErrUnknownMetric, n, expr))
		}
	}
	return errors.Join(errs...)
}

// call reports whether q is name(...) as a whole and returns what is between
// the outer parentheses.
func call(q, name string) (string, bool) {
	rest, ok := strings.CutPrefix(q, name)
	if !ok {
		return "", false
	}
	rest = strings.TrimLeft(rest, " \t\n")
	if !strings.HasPrefix(rest, "(") || !strings.HasSuffix(rest, ")") {
		return "", false
	}
	return rest[1 : len(rest)-1], true
}

// splitArgs splits s at the commas outside brackets and strings.
func splitArgs(s string) ([]string, error) {
	var args []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '(', '{', '[':
			depth++
		case ')', '}', ']':
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("unbalanced %q at offset %d", c, i)
			}
		case '"', '\'', '`':
			end, err := stringEnd(s, i)
			if err != nil {
				return nil, err
			}
			i = end - 1
		case ',':
			if depth == 0 {
				args = append(args, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return nil, errors.New("unbalanced brackets")
	}
	return append(args, strings.TrimSpace(s[start:])), nil
}

// stringEnd returns the offset just past the string literal starting at
// s[i], honouring backslash escapes except in raw (backquoted) strings.
func stringEnd(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			if q != '`' {
				j++
			}
		case q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at offset %d", i)
}

type scanner struct {
	src   string
	pos   int
	depth int
	names []string
	seen  map[string]bool
}

func (s *scanner) add(name string) {
	if !s.seen[name] {
		s.seen[name] = true
		s.names = append(s.names, name)
	}
}

func (s *scanner) peek() byte {
	if s.pos < len(s.src) {
		return s.src[s.pos]
	}
	return 0
}

// skipSpace skips white space and # comments, which run to the end of the
// line in PromQL.
func (s *scanner) skipSpace() {
	for s.pos < len(s.src) {
		switch s.src[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		case '#':
			for s.pos < len(s.src) && s.src[s.pos] != '\n' {
				s.pos++
			}
		default:
			return
		}
	}
}

func (s *scanner) run() error {
	for {
		s.skipSpace()
		if s.pos >= len(s.src) {
			break
		}
		c := s.src[s.pos]
		var err error
		switch {
		case c == '(':
			s.depth++
			s.pos++
		case c == ')':
			s.depth--
			if s.depth < 0 {
				return fmt.Errorf("unbalanced ')' at offset %d", s.pos)
			}
			s.pos++
		case c == '{':
			err = s.matchers()
		case c == '[':
			err = s.skipRange()
		case c == '"' || c == '\'' || c == '`':
			s.pos, err = stringEnd(s.src, s.pos)
		case c == '$':
			err = s.variable()
		case isDigit(c) || (c == '.' && s.pos+1 < len(s.src) && isDigit(s.src[s.pos+1])):
			s.number()
		case isIdentStart(c):
			err = s.identifier()
		case strings.IndexByte("+-*/%^=!<>,@", c) >= 0:
			s.pos++
		default:
			return fmt.Errorf("unexpected %q at offset %d", c, s.pos)
		}
		if err != nil {
			return err
		}
	}
	if s.depth != 0 {
		return errors.New("unbalanced '('")
	}
	return nil
}

func (s *scanner) word() string {
	start := s.pos
	for s.pos < len(s.src) && isIdentChar(s.src[s.pos]) {
		s.pos++
	}
	return s.src[start:s.pos]
}

func (s *scanner) identifier() error {
	at := s.pos
	w := s.word()
	lw := strings.ToLower(w)
	switch {
	case grouping[lw]:
		s.skipSpace()
		if s.peek() == '(' {
			return s.labelList()
		}
		if lw != "group_left" && lw != "group_right" {
			return fmt.Errorf("%q without a label list at offset %d", w, at)
		}
	case keywords[lw], aggregations[lw], functions[w]:
	default:
		s.skipSpace()
		if s.peek() == '(' {
			return fmt.Errorf("%w %q at offset %d", ErrUnknownFunction, w, at)
		}
		s.add(w)
	}
	return nil
}

// labelList skips "(label, label, ...)".
func (s *scanner) labelList() error {
	open := s.pos
	s.pos++
	for {
		s.skipSpace()
		switch c := s.peek(); {
		case c == ')':
			s.pos++
			return nil
		case c == ',':
			s.pos++
		case isIdentStart(c):
			s.word()
		case c == '"' || c == '\'':
			end, err := stringEnd(s.src, s.pos)
			if err != nil {
				return err
			}
			s.pos = end
		case c == 0:
			return fmt.Errorf("unterminated label list at offset %d", open)
		default:
			return fmt.Errorf("unexpected %q in label list at offset %d", c, s.pos)
		}
	}
}

// matchers reads "{name op "value", ...}". A __name__="x" matcher, or a bare
// quoted name (Prometheus 3's syntax for names with dots), names a metric.
func (s *scanner) matchers() error {
	open := s.pos
	s.pos++
	for {
		s.skipSpace()
		c := s.peek()
		switch c {
		case '}':
			s.pos++
			return nil
		case ',':
			s.pos++
			continue
		case 0:
			return fmt.Errorf("unterminated label matchers at offset %d", open)
		}
		var label string
		switch {
		case isIdentStart(c):
			label = s.word()
		case c == '"' || c == '\'' || c == '`':
			v, err := s.stringValue()
			if err != nil {
				return err
			}
			s.skipSpace()
			if c := s.peek(); c == ',' || c == '}' {
				s.add(v)
				continue
			}
			label = v
		default:
			return fmt.Errorf("unexpected %q in label matchers at offset %d", c, s.pos)
		}
		s.skipSpace()
		op, err := s.matchOp()
		if err != nil {
			return err
		}
		s.skipSpace()
		value, err := s.stringValue()
		if err != nil {
			return fmt.Errorf("label %q: %w", label, err)
		}
		if label == "__name__" {
			if op != "=" {
				return fmt.Errorf("__name__%s matches names that cannot be checked (offset %d)", op, open)
			}
			s.add(value)
		}
	}
}

func (s *scanner) matchOp() (string, error) {
	for _, op := range []string{"=~", "!~", "!=", "="} {
		if strings.HasPrefix(s.src[s.pos:], op) {
			s.pos += len(op)
			return op, nil
		}
	}
	return "", fmt.Errorf("expected a label matching operator at offset %d", s.pos)
}

// stringValue reads a string literal and returns its contents; escapes are
// left as written, which is enough to compare names.
func (s *scanner) stringValue() (string, error) {
	c := s.peek()
	if c != '"' && c != '\'' && c != '`' {
		return "", fmt.Errorf("expected a string at offset %d", s.pos)
	}
	end, err := stringEnd(s.src, s.pos)
	if err != nil {
		return "", err
	}
	v := s.src[s.pos+1 : end-1]
	s.pos = end
	return v, nil
}

// skipRange skips a range or subquery "[5m]", "[1h:1m]", "[$__rate_interval]"
// or Grafana's old "[[interval]]".
func (s *scanner) skipRange() error {
	open, depth := s.pos, 0
	for ; s.pos < len(s.src); s.pos++ {
		switch s.src[s.pos] {
		case '[':
			depth++
		case ']':
			depth--
			if depth == 0 {
				s.pos++
				return nil
			}
		}
	}
	return fmt.Errorf("unterminated range at offset %d", open)
}

// variable skips a Grafana variable: $name or ${name[:format]}.
func (s *scanner) variable() error {
	at := s.pos
	s.pos++
	if s.peek() == '{' {
		end := strings.IndexByte(s.src[s.pos:], '}')
		if end < 0 {
			return fmt.Errorf("unterminated ${ at offset %d", at)
		}
		s.pos += end + 1
		return nil
	}
	if !isIdentStart(s.peek()) {
		return fmt.Errorf("unexpected '$' at offset %d", at)
	}
	s.word()
	return nil
}

// number skips a number or duration: 0.95, 1e-3, 0x1f, 5m, 1h30m.
func (s *scanner) number() {
	hex := strings.HasPrefix(strings.ToLower(s.src[s.pos:]), "0x")
	for s.pos < len(s.src) {
		c := s.src[s.pos]
		switch {
		case isIdentChar(c) || c == '.':
			s.pos++
		case (c == '+' || c == '-') && !hex && (s.src[s.pos-1] == 'e' || s.src[s.pos-1] == 'E'):
			s.pos++
		default:
			return
		}
	}
}

func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
func isIdentChar(c byte) bool  { return isIdentStart(c) || isDigit(c) }

package metricnames

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestExtract(t *testing.T) {
	tests := []struct {
		name string
		expr string
		want []string
	}{
		{"bare selector", `gpuslice_gpu_info`, []string{"gpuslice_gpu_info"}},
		{"matchers are label names", `gpuslice_gpu_info{node="a", uuid!~"GPU-.*"}`, []string{"gpuslice_gpu_info"}},
		{"matcher value with closing brace", `a{x="}", y='{'} + b`, []string{"a", "b"}},
		{"escaped quote in value", `a{x="say \"hi\" }"} or b`, []string{"a", "b"}},
		{"__name__ matcher", `{__name__="a", node="n"}`, []string{"a"}},
		{"quoted metric name", `{"a.b", node="n"}`, []string{"a.b"}},
		{"quoted label name", `a{"node"="n"}`, []string{"a"}},
		{"aggregation with by before", `sum by (node, uuid) (a)`, []string{"a"}},
		{"aggregation with without after", `sum(rate(a[5m])) without (pod, container)`, []string{"a"}},
		{"upper-case keywords", `SUM BY (node) (a) AND ON (node) b`, []string{"a", "b"}},
		{"vector matching", `a / on (node, uuid) group_left (name) b`, []string{"a", "b"}},
		{"group_left without labels", `a * on (uuid) group_left b`, []string{"a", "b"}},
		{"ignoring and group_right", `a - ignoring (pod) group_right () b`, []string{"a", "b"}},
		{"set operators and offset", `(a > 0 unless a offset 5m) or b`, []string{"a", "b"}},
		{"negative offset", `a offset -1h30m`, []string{"a"}},
		{"at modifiers", `a @ start() - a @ 1609746000.5`, []string{"a"}},
		{"subquery", `max_over_time(rate(a[5m])[1h:1m])`, []string{"a"}},
		{"numbers", `a > 0.95 * 1e-3 + .5 - 0x1F + Inf - NaN`, []string{"a"}},
		{"bool comparison", `a > bool 1`, []string{"a"}},
		{"string arguments", `label_replace(a, "dst", "$1", "src", "(.*)")`, []string{"a"}},
		{"count_values and topk", `topk(3, count_values("v", a))`, []string{"a"}},
		{"quantile", `quantile(0.9, a)`, []string{"a"}},
		{"histogram", `histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m])))`, []string{"a_bucket"}},
		{"grafana variables", `sum by (pod) (rate(a{node=~"$node", uuid=~"${gpu:regex}"}[$__rate_interval]))`, []string{"a"}},
		{"grafana old interval", `increase(a[[interval]])`, []string{"a"}},
		{"grafana variable as argument", `topk($n, a)`, []string{"a"}},
		{"grafana braced variable as argument", `topk(${n}, a)`, []string{"a"}},
		{"comment", "a # b is not read\n+ c", []string{"a", "c"}},
		{"repeated names once", `a / a + b - a`, []string{"a", "b"}},
		{"recording rule name", `node:a:sum + b`, []string{"node:a:sum", "b"}},
		{"scalar only", `vector(1) * time()`, nil},
		{"atan2 operator", `a atan2 b`, []string{"a", "b"}},
		{"multi-line", "sum by (node) (\n  a\n)\n> on (node)\n  b", []string{"a", "b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Extract(tc.expr)
			if err != nil {
				t.Fatalf("Extract(%q): %v", tc.expr, err)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Extract(%q) (-want +got):\n%s", tc.expr, diff)
			}
		})
	}
}

func TestExtractRejects(t *testing.T) {
	tests := []struct {
		name    string
		expr    string
		wantErr error
		msg     string
	}{
		{"misspelt function", `rat(a[5m])`, ErrUnknownFunction, `"rat"`},
		{"metric written as call", `a (b)`, ErrUnknownFunction, `"a"`},
		{"unclosed paren", `sum(a`, ErrSyntax, "unbalanced"},
		{"extra paren", `a)`, ErrSyntax, "unbalanced"},
		{"unclosed string", `a{x="b}`, ErrSyntax, "unterminated string"},
		{"unclosed matchers", `a{x="b"`, ErrSyntax, "unterminated label matchers"},
		{"unclosed range", `rate(a[5m)`, ErrSyntax, "unterminated range"},
		{"regex on __name__", `{__name__=~"gpuslice_.*"}`, ErrSyntax, "__name__=~"},
		{"by without labels", `sum by a`, ErrSyntax, `"by" without a label list`},
		{"matcher without operator", `a{x "b"}`, ErrSyntax, "operator"},
		{"matcher without value", `a{x=b}`, ErrSyntax, "expected a string"},
		{"stray character", `a ; b`, ErrSyntax, "unexpected ';'"},
		{"stray closing brace", `a }`, ErrSyntax, "unexpected '}'"},
		{"lone dollar", `a + $`, ErrSyntax, "unexpected '$'"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Extract(tc.expr)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Extract(%q) = %v, %v; want error %v", tc.expr, got, err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.expr)) {
				t.Errorf("error %q should mention %q and the expression", err, tc.msg)
			}
		})
	}
}

func TestExtractVariableQuery(t *testing.T) {
	tests := []struct {
		name    string
		query   string
		want    []string
		wantErr error
	}{
		{"label_values with metric", `label_values(gpuslice_gpu_info{node=~"$node"}, uuid)`, []string{"gpuslice_gpu_info"}, nil},
		{"label_values with comma in matcher", `label_values(a{x=~"1,2"}, uuid)`, []string{"a"}, nil},
		{"label_values of a label", `label_values(node)`, nil, nil},
		{"label_values with three arguments", `label_values(a, b, c)`, nil, ErrSyntax},
		{"label_names", `label_names()`, nil, nil},
		{"query_result", ` query_result(topk(5, sum by (pod) (a))) `, []string{"a"}, nil},
		{"metrics regex", `metrics(gpuslice_.*)`, nil, ErrSyntax},
		{"plain expression", `sum(a)`, []string{"a"}, nil},
		{"label_values over a bad expression", `label_values(rat(a), node)`, nil, ErrUnknownFunction},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ExtractVariableQuery(tc.query)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("ExtractVariableQuery(%q) error = %v, want %v", tc.query, err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("ExtractVariableQuery(%q) (-want +got):\n%s", tc.query, diff)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name        string
		expr        string
		wantErr     error
		wantMetrics []string
	}{
		{"exporter and tuner metrics", `gpuslice_gpu_memory_used_bytes / on (node) group_left gpuslice_tuner_replicas`, nil, nil},
		{"scrape series", `up{job=~".*gpuslice-exporter.*"} == 0`, nil, nil},
		{"bogus metric", `sum(gpuslice_gpu_memory_free_bytes) / sum(gpuslice_gpu_memory_total_bytes)`, ErrUnknownMetric, []string{"gpuslice_gpu_memory_free_bytes"}},
		{"two bogus metrics", `bogus_a + gpuslice_gpu_info + bogus_b`, ErrUnknownMetric, []string{"bogus_a", "bogus_b"}},
		{"bogus name matcher", `{__name__="gpuslice_gpu_temp"}`, ErrUnknownMetric, []string{"gpuslice_gpu_temp"}},
		{"unscannable", `rate(gpuslice_gpu_info`, ErrSyntax, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.expr)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Check(%q) = %v, want %v", tc.expr, err, tc.wantErr)
			}
			for _, m := range tc.wantMetrics {
				if !strings.Contains(err.Error(), `"`+m+`"`) {
					t.Errorf("error %q does not name %q", err, m)
				}
			}
		})
	}
	if err := CheckVariableQuery(`label_values(gpuslice_gpu_infos, node)`); !errors.Is(err, ErrUnknownMetric) {
		t.Errorf("CheckVariableQuery with a bogus metric = %v, want ErrUnknownMetric", err)
	}
}

func TestLists(t *testing.T) {
	valid := regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	seen := map[string]string{}
	for list, names := range map[string][]string{"Exporter": Exporter, "ExporterMPS": ExporterMPS, "Tuner": Tuner, "Plugin": Plugin, "PluginMPS": PluginMPS, "Scrape": Scrape} {
		for _, n := range names {
			if !valid.MatchString(n) {
				t.Errorf("%s: %q is not a valid metric name", list, n)
			}
			if list != "Scrape" && !strings.HasPrefix(n, "gpuslice_") {
				t.Errorf("%s: %q lacks the gpuslice_ prefix", list, n)
			}
			if other, dup := seen[n]; dup {
				t.Errorf("%q is in both %s and %s", n, other, list)
			}
			seen[n] = list
			if !Known(n) {
				t.Errorf("Known(%q) = false for a name in %s", n, list)
			}
		}
	}
	for _, n := range []string{"", "gpuslice_gpu", "gpuslice_gpu_info_total", "GPUSLICE_GPU_INFO", "DCGM_FI_DEV_FB_USED"} {
		if Known(n) {
			t.Errorf("Known(%q) = true", n)
		}
	}
}

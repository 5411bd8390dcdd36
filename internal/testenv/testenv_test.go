package testenv

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestStartServesAPI(t *testing.T) {
	env := Start(t)
	env.CreateNamespace(t, "gpuslice-test")
	ns, err := env.Client.CoreV1().Namespaces().Get(t.Context(), "gpuslice-test", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get namespace back: %v", err)
	}
	if ns.Name != "gpuslice-test" {
		t.Fatalf("got namespace %q", ns.Name)
	}
}

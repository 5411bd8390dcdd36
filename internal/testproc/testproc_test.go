package testproc

import (
	"net"
	"os"
	"testing"
	"time"
)

func TestFreeAddrIsListenable(t *testing.T) {
	l, err := net.Listen("tcp", FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if FreePort(t) <= 0 {
		t.Fatal("no port")
	}
}

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, time.Second, time.Millisecond, func() string {
		n++
		if n < 3 {
			return "not yet"
		}
		return ""
	})
	if n != 3 {
		t.Fatalf("cond called %d times", n)
	}
}

func TestBuild(t *testing.T) {
	p := Build(t, "cmd/exporter")
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("%s: %v", p, err)
	}
	if again := Build(t, "cmd/exporter"); again != p {
		t.Fatalf("built twice: %s, %s", p, again)
	}
}

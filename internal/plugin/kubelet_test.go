package plugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeKubelet is the kubelet's side of the device-plugin API over real unix
// sockets: a Registration server on kubelet.sock that, like the kubelet,
// dials each registering plugin and keeps a ListAndWatch stream open.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	t      testing.TB
	dir    string
	socket string

	mu            sync.Mutex
	srv           *grpc.Server
	registrations []*pluginapi.RegisterRequest
	endpoints     map[string]*endpoint // by resource, the latest registration
	changed       chan struct{}
}

// endpoint is the kubelet's connection to one registered plugin.
type endpoint struct {
	req    *pluginapi.RegisterRequest
	conn   *grpc.ClientConn
	client pluginapi.DevicePluginClient
	cancel context.CancelFunc

	mu    sync.Mutex
	lists [][]*pluginapi.Device // every list received on the stream
	err   error                 // why the stream ended
}

// shortDir returns a fresh directory with a short path: unix socket paths
// are limited to 108 bytes and t.TempDir's can be longer.
func shortDir(t testing.TB) string {
	dir, err := os.MkdirTemp("", "gsp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func startKubelet(t testing.TB, dir string) *fakeKubelet {
	k := &fakeKubelet{t: t, dir: dir, socket: filepath.Join(dir, "kubelet.sock"), endpoints: map[string]*endpoint{}, changed: make(chan struct{})}
	k.listen()
	t.Cleanup(k.stop)
	return k
}

func (k *fakeKubelet) listen() {
	lis, err := net.Listen("unix", k.socket)
	if err != nil {
		k.t.Fatalf("fake kubelet: %v", err)
	}
	k.serve(lis)
}

func (k *fakeKubelet) serve(lis net.Listener) {
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	k.mu.Lock()
	k.srv = srv
	k.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
}

func (k *fakeKubelet) stop() {
	k.mu.Lock()
	srv, eps := k.srv, k.endpoints
	k.endpoints = map[string]*endpoint{}
	k.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	for _, e := range eps {
		e.cancel()
		e.conn.Close()
	}
}

// restart does what a restarting kubelet does: it goes away, removes every
// socket in the device-plugin directory, and serves a new kubelet.sock.
func (k *fakeKubelet) restart() {
	k.goAway()
	k.listen()
}

// goAway stops the kubelet and removes every socket in the device-plugin
// directory, as a kubelet that starts again does.
func (k *fakeKubelet) goAway() {
	k.stop()
	entries, err := os.ReadDir(k.dir)
	if err != nil {
		k.t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sock") {
			os.Remove(filepath.Join(k.dir, e.Name()))
		}
	}
}

// restartAcceptingLate restarts like restart, but creates kubelet.sock
// before it accepts connections on it, as a starting kubelet does: the
// socket is bound, and listens only once the plugin, woken by the file,
// has served its own socket again (pluginSocket) and a moment more.
func (k *fakeKubelet) restartAcceptingLate(pluginSocket string) {
	k.t.Helper()
	k.goAway()
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		k.t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: k.socket}); err != nil {
		syscall.Close(fd)
		k.t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(pluginSocket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			syscall.Close(fd)
			k.t.Fatalf("fake kubelet: the plugin did not serve %s again", pluginSocket)
		}
	}
	time.Sleep(200 * time.Millisecond) // the plugin dials kubelet.sock meanwhile
	if err := syscall.Listen(fd, 16); err != nil {
		syscall.Close(fd)
		k.t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), k.socket)
	lis, err := net.FileListener(f)
	f.Close()
	if err != nil {
		k.t.Fatal(err)
	}
	k.serve(lis)
}

// Register implements pluginapi.RegistrationServer the way the kubelet does:
// it checks the version and dials the plugin's endpoint.
func (k *fakeKubelet) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if req.Version != pluginapi.Version {
		return nil, fmt.Errorf("unsupported version %q", req.Version)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &endpoint{req: req, conn: conn, client: pluginapi.NewDevicePluginClient(conn), cancel: cancel}
	stream, err := e.client.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		cancel()
		conn.Close()
		return nil, err
	}
	go func() {
		for {
			resp, err := stream.Recv()
			e.mu.Lock()
			if err != nil {
				e.err = err
				e.mu.Unlock()
				k.notify()
				return
			}
			e.lists = append(e.lists, resp.Devices)
			e.mu.Unlock()
			k.notify()
		}
	}()
	k.mu.Lock()
	if old := k.endpoints[req.ResourceName]; old != nil {
		old.cancel()
		old.conn.Close()
	}
	k.registrations = append(k.registrations, req)
	k.endpoints[req.ResourceName] = e
	k.mu.Unlock()
	k.notify()
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) notify() {
	k.mu.Lock()
	defer k.mu.Unlock()
	close(k.changed)
	k.changed = make(chan struct{})
}

// waitFor polls cond whenever the fake kubelet sees something, until it holds
// or the deadline passes.
func (k *fakeKubelet) waitFor(what string, cond func() bool) {
	k.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		k.mu.Lock()
		ch := k.changed
		k.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			k.t.Fatalf("fake kubelet: timed out waiting for %s\nstate:\n%s", what, k.describe())
		}
	}
}

func (k *fakeKubelet) describe() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%d registrations\n", len(k.registrations))
	for name, e := range k.endpoints {
		e.mu.Lock()
		fmt.Fprintf(&b, "%s: %d lists, latest %s, stream err %v\n", name, len(e.lists), render(last(e.lists)), e.err)
		e.mu.Unlock()
	}
	return b.String()
}

func last(lists [][]*pluginapi.Device) []*pluginapi.Device {
	if len(lists) == 0 {
		return nil
	}
	return lists[len(lists)-1]
}

// endpoint waits for a registration of resource and returns its endpoint.
func (k *fakeKubelet) endpoint(resource string) *endpoint {
	k.t.Helper()
	var e *endpoint
	k.waitFor("registration of "+resource, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		e = k.endpoints[resource]
		return e != nil
	})
	return e
}

func (k *fakeKubelet) registrationCount(resource string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, r := range k.registrations {
		if r.ResourceName == resource {
			n++
		}
	}
	return n
}

// waitList waits until resource's latest list renders as want (see render)
// and returns how many lists its stream had received by then.
func (k *fakeKubelet) waitList(resource, want string) int {
	k.t.Helper()
	n := 0
	k.waitFor(fmt.Sprintf("%s list %q", resource, want), func() bool {
		k.mu.Lock()
		e := k.endpoints[resource]
		k.mu.Unlock()
		if e == nil {
			return false
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		n = len(e.lists)
		return n > 0 && render(e.lists[n-1]) == want
	})
	return n
}

// render writes a device list as space-separated IDs, sorted, an
// unhealthy one followed by "!".
func render(devs []*pluginapi.Device) string {
	var out []string
	for _, d := range devs {
		s := d.ID
		if d.Health != pluginapi.Healthy {
			s += "!"
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// latest renders resource's latest list ("" before any).
func (k *fakeKubelet) latest(resource string) string {
	k.mu.Lock()
	e := k.endpoints[resource]
	k.mu.Unlock()
	if e == nil {
		return ""
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return render(last(e.lists))
}

func (e *endpoint) streamErr() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// Command fakemps plays the NVIDIA driver programs that an MPS control
// daemon runs (the chart's mps-control-daemon, NVIDIA's), on the simulated
// GPU of test/simgpu. It is one static program that does what the name it
// was started under says (the base name of argv[0]); the real-node test
// mounts it at the driver's paths through the simulated GPU's CDI spec, as
// the NVIDIA container toolkit mounts the driver's programs into a container
// with NVIDIA_DRIVER_CAPABILITIES compute,utility.
//
//	nvidia-cuda-mps-control -d
//	    starts the control daemon and returns once it answers: it listens on
//	    $CUDA_MPS_PIPE_DIRECTORY/control (default /tmp/nvidia-mps), logs to
//	    $CUDA_MPS_LOG_DIRECTORY/control.log (default /var/log/nvidia-mps),
//	    and starts nvidia-cuda-mps-server. A second -d on the same pipe
//	    directory fails, as NVIDIA's does.
//	nvidia-cuda-mps-control
//	    sends each line of stdin to the daemon of $CUDA_MPS_PIPE_DIRECTORY and
//	    prints its answer: get_default_active_thread_percentage,
//	    set_default_active_thread_percentage N, get_server_list, quit (the
//	    daemon stops its server and exits). Exit status 1 when no daemon
//	    answers or a command is refused.
//	nvidia-cuda-mps-server
//	    opens every visible GPU (NVIDIA_VISIBLE_DEVICES; all by default) on
//	    the simulated driver, says it is the GPU's MPS server there (the sim
//	    file lists it with mpsServer: true), holds 66 MiB on each (what a real
//	    server held on an H200) and runs until SIGTERM.
//	nvidia-smi -c MODE | --compute-mode=MODE
//	    succeeds for DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS (0, 2, 3) and
//	    prints what nvidia-smi prints; the compute mode itself is not
//	    simulated.
//
// What is simulated, not real: the server starts with the daemon, not at
// the first client's connection; clients do not run their work through the
// server (the simulated driver enforces each client's pinned limit from its
// environment), they only ask the daemon for its server (test/simgpu/fakecuda
// does when CUDA_MPS_PIPE_DIRECTORY is set, and fails without a daemon as a
// CUDA client on an EXCLUSIVE_PROCESS GPU fails).
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuslice/gpuslice/internal/gpu/sim"
	"github.com/gpuslice/gpuslice/internal/mps"
	"github.com/gpuslice/gpuslice/test/simgpu"
)

const (
	controlName = "nvidia-cuda-mps-control"
	smiName     = "nvidia-smi"
	// serverMemory is what the simulated server holds on each GPU.
	serverMemory = 66 << 20
	// envDaemon marks the daemon's own process, started by -d.
	envDaemon = "FAKEMPS_DAEMON"

	envLogDirectory   = "CUDA_MPS_LOG_DIRECTORY"
	defaultPipeDir    = "/tmp/nvidia-mps"
	defaultLogDir     = "/var/log/nvidia-mps"
	defaultPercentage = "100.0"
)

func main() {
	name := filepath.Base(os.Args[0])
	switch name {
	case controlName:
		os.Exit(control(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	case mps.ServerComm:
		os.Exit(server(os.Stdout, os.Stderr))
	case smiName:
		os.Exit(smi(os.Args[1:], os.Stdout, os.Stderr))
	}
	fmt.Fprintf(os.Stderr, "fakemps: started as %q; run it as %s, %s or %s\n", name, controlName, mps.ServerComm, smiName)
	os.Exit(2)
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func control(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	pipe := getenv(mps.EnvPipeDirectory, defaultPipeDir)
	logs := getenv(envLogDirectory, defaultLogDir)
	switch {
	case len(args) == 1 && args[0] == "-d" && os.Getenv(envDaemon) == "1":
		return daemon(pipe, logs)
	case len(args) == 1 && args[0] == "-d":
		return daemonize(pipe, stderr)
	case len(args) > 0:
		fmt.Fprintf(stderr, "%s: unsupported arguments %q (want -d, or commands on stdin)\n", controlName, args)
		return 2
	}
	rc := 0
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		cmd := strings.TrimSpace(sc.Text())
		if cmd == "" {
			continue
		}
		out, err := simgpu.MPSCommand(pipe, cmd)
		if err != nil {
			var op *net.OpError
			if errors.As(err, &op) && op.Op == "dial" {
				fmt.Fprintf(stderr, "Cannot find MPS control daemon process (%s: %v)\n", pipe, err)
				return 1
			}
			fmt.Fprintln(stderr, err)
			rc = 1
			continue
		}
		if out != "" {
			fmt.Fprintln(stdout, out)
		}
	}
	return rc
}

// daemonize starts the daemon in a session of its own, detached from the
// caller as NVIDIA's -d is, and returns once it answers on its socket.
func daemonize(pipe string, stderr io.Writer) int {
	if _, err := simgpu.MPSCommand(pipe, "get_server_list"); err == nil {
		fmt.Fprintf(stderr, "An instance of this daemon is already running (%s)\n", pipe)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", controlName, err)
		return 1
	}
	cmd := &exec.Cmd{Path: self, Args: []string{os.Args[0], "-d"}, Env: append(os.Environ(), envDaemon+"=1"),
		SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "%s: starting the daemon: %v\n", controlName, err)
		return 1
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if _, err := simgpu.MPSCommand(pipe, "get_server_list"); err == nil {
			return 0
		}
		select {
		case err := <-exited:
			fmt.Fprintf(stderr, "%s: the daemon exited at start (%v); see %s\n", controlName, err, filepath.Join(getenv(envLogDirectory, defaultLogDir), "control.log"))
			return 1
		case <-time.After(50 * time.Millisecond):
		}
	}
	fmt.Fprintf(stderr, "%s: the daemon does not answer on %s\n", controlName, pipe)
	return 1
}

type daemonState struct {
	mu         sync.Mutex
	log        *os.File
	percentage string
	server     *exec.Cmd
	serverDone chan struct{}
}

func (d *daemonState) logf(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintf(d.log, "[%s] "+format+"\n", append([]any{time.Now().Format("2006-01-02 15:04:05.000")}, args...)...)
}

// daemon is the control daemon's process.
func daemon(pipe, logs string) int {
	if err := os.MkdirAll(logs, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	logf, err := os.OpenFile(filepath.Join(logs, "control.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer logf.Close()
	d := &daemonState{log: logf, percentage: defaultPercentage}
	sock := filepath.Join(pipe, simgpu.MPSControlSocket)
	if err := os.MkdirAll(pipe, 0o755); err != nil {
		d.logf("Startup failed: %v", err)
		return 1
	}
	_ = os.Remove(sock)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		d.logf("Startup failed: %v", err)
		return 1
	}
	// Clients run as any user, as they may with NVIDIA's daemon.
	_ = os.Chmod(sock, 0o666)
	d.logf("Startup pid %d, pipe directory %s", os.Getpid(), pipe)
	if err := d.startServer(logs); err != nil {
		d.logf("Starting the server failed: %v", err)
		ln.Close()
		os.Remove(sock)
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	quit := make(chan struct{})
	var once sync.Once
	go func() {
		select {
		case s := <-stop:
			d.logf("Signal %v", s)
		case <-quit:
		}
		ln.Close()
	}()
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			break
		}
		go d.serve(conn, func() { once.Do(func() { close(quit) }) })
	}
	d.stopServer()
	os.Remove(sock)
	d.logf("Exit")
	return 0
}

func (d *daemonState) serve(conn *net.UnixConn, quit func()) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return
	}
	cmd := strings.Fields(line)
	if len(cmd) == 0 {
		fmt.Fprintln(conn, "error: empty command")
		return
	}
	d.logf("Cmd: %s", strings.Join(cmd, " "))
	reply := ""
	switch {
	case cmd[0] == "get_default_active_thread_percentage" && len(cmd) == 1:
		d.mu.Lock()
		reply = d.percentage
		d.mu.Unlock()
	case cmd[0] == "set_default_active_thread_percentage" && len(cmd) == 2:
		p, err := strconv.ParseFloat(cmd[1], 64)
		if err != nil || p <= 0 || p > 100 {
			reply = "error: bad percentage " + strconv.Quote(cmd[1])
			break
		}
		d.mu.Lock()
		d.percentage = strconv.FormatFloat(p, 'f', 1, 64)
		reply = d.percentage
		d.mu.Unlock()
	case cmd[0] == "get_server_list" && len(cmd) == 1:
		d.mu.Lock()
		if d.server != nil {
			reply = strconv.Itoa(d.server.Process.Pid)
		}
		d.mu.Unlock()
	case cmd[0] == "quit" && len(cmd) == 1:
		defer quit()
	default:
		reply = "error: unsupported command " + strconv.Quote(strings.Join(cmd, " "))
	}
	fmt.Fprintln(conn, reply)
}

// startServer starts nvidia-cuda-mps-server: the program of that name on
// PATH (the driver's, mounted beside this one), else this program under
// that name. It returns once the server holds its GPUs.
func (d *daemonState) startServer(logs string) error {
	path, err := exec.LookPath(mps.ServerComm)
	if err != nil {
		if path, err = os.Executable(); err != nil {
			return err
		}
	}
	out, err := os.OpenFile(filepath.Join(logs, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := &exec.Cmd{Path: path, Args: []string{mps.ServerComm}, Env: os.Environ(), Stdout: w, Stderr: out,
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}}
	if err := cmd.Start(); err != nil {
		w.Close()
		r.Close()
		return err
	}
	w.Close()
	// The server writes one line per GPU it holds, then "ready".
	sc := bufio.NewScanner(r)
	ready := false
	for sc.Scan() {
		fmt.Fprintln(out, sc.Text())
		if sc.Text() == "ready" {
			ready = true
			break
		}
	}
	if !ready {
		r.Close()
		_ = cmd.Wait()
		return fmt.Errorf("the server (pid %d) exited before it was ready: %v; see %s", cmd.Process.Pid, cmd.ProcessState, out.Name())
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, r)
		r.Close()
		err := cmd.Wait()
		d.logf("Server %d exited: %v", cmd.Process.Pid, err)
		close(done)
	}()
	d.mu.Lock()
	d.server, d.serverDone = cmd, done
	d.mu.Unlock()
	d.logf("Server %d started", cmd.Process.Pid)
	return nil
}

func (d *daemonState) stopServer() {
	d.mu.Lock()
	s, done := d.server, d.serverDone
	d.mu.Unlock()
	if s == nil {
		return
	}
	_ = s.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = s.Process.Kill()
		<-done
	}
}

// server is nvidia-cuda-mps-server's process.
func server(stdout, stderr io.Writer) int {
	dir := getenv(simgpu.EnvDir, simgpu.DefaultDir)
	visible := os.Getenv(simgpu.EnvVisibleDev)
	all := visible == "" || visible == "all"
	var held []*simgpu.Context
	for i := 0; ; i++ {
		sel := strconv.Itoa(i)
		if !all {
			sels := strings.Split(visible, ",")
			if i == len(sels) {
				break
			}
			sel = strings.TrimSpace(sels[i])
		}
		ctx, err := simgpu.Open(dir, sel)
		if err != nil {
			if all && i > 0 && strings.HasPrefix(err.Error(), "no GPU") {
				break // past the last GPU
			}
			fmt.Fprintf(stderr, "%s: opening GPU %s: %v\n", mps.ServerComm, sel, err)
			return 1
		}
		if err := ctx.MPSServer(); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", mps.ServerComm, err)
			return 1
		}
		if err := ctx.Alloc(serverMemory); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", mps.ServerComm, err)
			return 1
		}
		fmt.Fprintf(stdout, "server pid %d on %s, %d MiB\n", os.Getpid(), ctx.UUID, serverMemory>>20)
		held = append(held, ctx)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	fmt.Fprintln(stdout, "ready")
	<-stop
	for _, c := range held {
		c.Close()
	}
	return 0
}

var computeModes = map[string]string{
	"0": "DEFAULT", "DEFAULT": "DEFAULT",
	"2": "PROHIBITED", "PROHIBITED": "PROHIBITED",
	"3": "EXCLUSIVE_PROCESS", "EXCLUSIVE_PROCESS": "EXCLUSIVE_PROCESS",
}

// smi is nvidia-smi, for the compute-mode switch alone.
func smi(args []string, stdout, stderr io.Writer) int {
	var mode string
	switch {
	case len(args) == 2 && args[0] == "-c":
		mode = args[1]
	case len(args) == 1 && strings.HasPrefix(args[0], "--compute-mode="):
		mode = strings.TrimPrefix(args[0], "--compute-mode=")
	default:
		fmt.Fprintf(stderr, "%s (simulated): only -c MODE is supported, not %q\n", smiName, args)
		return 2
	}
	m, ok := computeModes[strings.ToUpper(mode)]
	if !ok {
		fmt.Fprintf(stderr, "Invalid compute mode %q\n", mode)
		return 2
	}
	var gpus []string
	if b, err := os.ReadFile(filepath.Join(getenv(simgpu.EnvDir, simgpu.DefaultDir), simgpu.SimFileName)); err == nil {
		if f, err := sim.Parse(b); err == nil {
			for _, g := range f.GPUs {
				gpus = append(gpus, g.UUID)
			}
		}
	}
	if len(gpus) == 0 {
		fmt.Fprintln(stderr, "No devices were found")
		return 6
	}
	for _, g := range gpus {
		fmt.Fprintf(stdout, "Set compute mode to %s for GPU %s.\n", m, g)
	}
	fmt.Fprintln(stdout, "All done.")
	return 0
}

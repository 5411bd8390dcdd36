package simgpu

import (
	"bufio"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"
)

// MPSControlSocket is the name of the simulated MPS control daemon's socket
// in its pipe directory (CUDA_MPS_PIPE_DIRECTORY): test/simgpu/fakemps
// listens there, its client mode and test/simgpu/fakecuda connect to it.
//
// Protocol: the client writes one command line (as typed on
// nvidia-cuda-mps-control's stdin: get_default_active_thread_percentage,
// set_default_active_thread_percentage N, get_server_list, quit) and reads
// one reply line: the command's output, empty for none, or "error: WHY".
const MPSControlSocket = "control"

// MPSCommand sends one command to the control daemon whose pipe directory
// is pipeDir and returns its output; an error when no daemon answers there
// or the daemon refuses the command.
func MPSCommand(pipeDir, cmd string) (string, error) {
	sock := filepath.Join(pipeDir, MPSControlSocket)
	conn, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintln(conn, cmd); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("reading the reply to %q from %s: %w", cmd, sock, err)
	}
	line = strings.TrimSuffix(line, "\n")
	if why, ok := strings.CutPrefix(line, "error: "); ok {
		return "", fmt.Errorf("%s", why)
	}
	return line, nil
}

package simgpu

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrOutOfMemory is what an allocation that does not fit returns, as
// cudaMalloc returns cudaErrorMemoryAllocation.
var ErrOutOfMemory = errors.New("out of memory")

// Context is a process's open context on one simulated GPU. Closing it (or
// the process exiting) frees its memory.
type Context struct {
	conn  net.Conn
	r     *bufio.Reader
	UUID  string
	Total uint64
}

// OOMError is ErrOutOfMemory with the GPU's free bytes at the time.
type OOMError struct{ Free uint64 }

func (e *OOMError) Error() string { return fmt.Sprintf("out of memory (%d bytes free)", e.Free) }
func (e *OOMError) Unwrap() error { return ErrOutOfMemory }

// Open connects to the driver in dir and opens the GPU named by selector
// (an NVIDIA_VISIBLE_DEVICES entry).
func Open(dir, selector string) (*Context, error) {
	sock := filepath.Join(dir, SocketName)
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("no simulated GPU driver at %s: %w", sock, err)
	}
	c := &Context{conn: conn, r: bufio.NewReader(conn)}
	f, err := c.call("open " + selector)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if len(f) != 3 {
		conn.Close()
		return nil, fmt.Errorf("simgpu: bad open reply %q", strings.Join(f, " "))
	}
	c.UUID = f[0]
	if c.Total, err = strconv.ParseUint(f[1], 10, 64); err != nil {
		conn.Close()
		return nil, fmt.Errorf("simgpu: bad open reply: %w", err)
	}
	return c, nil
}

// Alloc allocates n more bytes; an *OOMError when they do not fit.
func (c *Context) Alloc(n uint64) error {
	_, err := c.call("alloc " + strconv.FormatUint(n, 10))
	return err
}

// Free releases n bytes (at most what the context holds).
func (c *Context) Free(n uint64) error {
	_, err := c.call("free " + strconv.FormatUint(n, 10))
	return err
}

// SetSM sets the context's SM utilization, 0..1.
func (c *Context) SetSM(r float64) error {
	_, err := c.call("sm " + strconv.FormatFloat(r, 'f', -1, 64))
	return err
}

// MPSServer makes the calling process the GPU's MPS server.
func (c *Context) MPSServer() error {
	_, err := c.call("mps-server")
	return err
}

// Free bytes on the GPU and bytes this context holds.
func (c *Context) Info() (free, used uint64, err error) {
	f, err := c.call("info")
	if err != nil {
		return 0, 0, err
	}
	if len(f) != 4 {
		return 0, 0, fmt.Errorf("simgpu: bad info reply %q", strings.Join(f, " "))
	}
	free, err1 := strconv.ParseUint(f[2], 10, 64)
	used, err2 := strconv.ParseUint(f[3], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("simgpu: bad info reply: %w", err)
	}
	return free, used, nil
}

// Close frees the context.
func (c *Context) Close() error { return c.conn.Close() }

func (c *Context) call(req string) ([]string, error) {
	if _, err := fmt.Fprintln(c.conn, req); err != nil {
		return nil, fmt.Errorf("simgpu: %w", err)
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("simgpu: reading reply to %q: %w", req, err)
	}
	status, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch status {
	case "ok":
		return strings.Fields(rest), nil
	case "oom":
		free, _ := strconv.ParseUint(rest, 10, 64)
		return nil, &OOMError{Free: free}
	case "err":
		return nil, errors.New(rest)
	}
	return nil, fmt.Errorf("simgpu: bad reply %q", line)
}

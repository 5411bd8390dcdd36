// Command nvmlcost measures the CPU time of each NVML call the exporter
// makes per scrape, one kind at a time on GPU 0, so that a profile's
// NVML share can be told apart call by call and from its size queries
// (go-nvml asks NVML for a list's size before reading it). -clock prints
// the newest GPU and process utilization sample timestamps side by side:
// the exporter takes them for one clock. It is built into make
// test-gpu-bundle's .gpu/ and run on a GPU machine (docs/real-gpu.md).
//
// The calls that take a buffer are made directly, with buffers of a
// fixed size, through the libnvidia-ml that go-nvml's Init opened.
package main

/*
#cgo linux LDFLAGS: -Wl,--unresolved-symbols=ignore-in-object-files
int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, void *infos);
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *device, unsigned int *count, void *infos);
int nvmlDeviceGetProcessUtilization(void *device, void *samples, unsigned int *count, unsigned long long lastSeen);
int nvmlDeviceGetSamples(void *device, int type, unsigned long long lastSeen, int *valType, unsigned int *count, void *samples);
*/
import "C"

import (
	"flag"
	"fmt"
	"reflect"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func main() {
	n := flag.Int("n", 300, "calls per kind")
	clock := flag.Bool("clock", false, "print the newest GPU and process sample timestamps, 5 times a second apart")
	flag.Parse()
	runtime.LockOSThread()
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		panic(ret.Error())
	}
	d, ret := nvml.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		panic(ret.Error())
	}
	h := reflect.ValueOf(d).Field(0).UnsafePointer()
	if *clock {
		for range 5 {
			_, gs, r1 := d.GetSamples(nvml.GPU_UTILIZATION_SAMPLES, 0)
			ps, r2 := d.GetProcessUtilization(0)
			var g, p uint64
			var gv uint32
			for _, s := range gs {
				if s.TimeStamp > g {
					g, gv = s.TimeStamp, *(*uint32)(unsafe.Pointer(&s.SampleValue[0]))
				}
			}
			var pv uint32
			for _, s := range ps {
				if s.TimeStamp > p {
					p, pv = s.TimeStamp, s.SmUtil
				}
			}
			fmt.Printf("gpu newest %d (%d%%, %v, %d samples)  process newest %d (%d%%, %v, %d samples)  diff %d us  now %d\n",
				g, gv, r1, len(gs), p, pv, r2, len(ps), int64(p)-int64(g), time.Now().UnixMicro())
			time.Sleep(time.Second)
		}
		return
	}
	procs := make([]nvml.ProcessInfo, 256)
	util := make([]nvml.ProcessUtilizationSample, 1024)
	samples := make([]nvml.Sample, 1024)
	var lastUtil, lastSample uint64
	measure := func(name string, f func() string) {
		var last string
		c0, w0 := cpu(), time.Now()
		for range *n {
			last = f()
			time.Sleep(time.Millisecond) // let samples accrue, as between scrapes
		}
		c, w := cpu()-c0, time.Since(w0)-time.Duration(*n)*time.Millisecond
		fmt.Printf("%-44s cpu %7.3f ms/call  wall %7.3f ms/call  (%s)\n", name,
			float64(c.Microseconds())/1000/float64(*n), float64(w.Microseconds())/1000/float64(*n), last)
	}
	measure("compute list, 1-entry buffer (size query)", func() string {
		count := C.uint(1)
		r := nvml.Return(C.nvmlDeviceGetComputeRunningProcesses_v3(h, &count, unsafe.Pointer(&procs[0])))
		return fmt.Sprintf("%v count %d", r, count)
	})
	measure("compute list, 256-entry buffer", func() string {
		count := C.uint(len(procs))
		r := nvml.Return(C.nvmlDeviceGetComputeRunningProcesses_v3(h, &count, unsafe.Pointer(&procs[0])))
		return fmt.Sprintf("%v count %d", r, count)
	})
	measure("compute list, go-nvml", func() string {
		l, r := d.GetComputeRunningProcesses()
		return fmt.Sprintf("%v count %d", r, len(l))
	})
	measure("graphics list, 256-entry buffer", func() string {
		count := C.uint(len(procs))
		r := nvml.Return(C.nvmlDeviceGetGraphicsRunningProcesses_v3(h, &count, unsafe.Pointer(&procs[0])))
		return fmt.Sprintf("%v count %d", r, count)
	})
	measure("process utilization, NULL (size query)", func() string {
		count := C.uint(0)
		r := nvml.Return(C.nvmlDeviceGetProcessUtilization(h, nil, &count, C.ulonglong(lastUtil)))
		return fmt.Sprintf("%v count %d", r, count)
	})
	measure("process utilization, 1024 buffer, since last", func() string {
		count := C.uint(len(util))
		r := nvml.Return(C.nvmlDeviceGetProcessUtilization(h, unsafe.Pointer(&util[0]), &count, C.ulonglong(lastUtil)))
		for _, s := range util[:min(int(count), len(util))] {
			lastUtil = max(lastUtil, s.TimeStamp)
		}
		return fmt.Sprintf("%v count %d", r, count)
	})
	measure("process utilization, go-nvml, since last", func() string {
		l, r := d.GetProcessUtilization(lastUtil)
		for _, s := range l {
			lastUtil = max(lastUtil, s.TimeStamp)
		}
		return fmt.Sprintf("%v count %d", r, len(l))
	})
	measure("GPU samples, NULL (size query)", func() string {
		count, vt := C.uint(0), C.int(0)
		r := nvml.Return(C.nvmlDeviceGetSamples(h, C.int(nvml.GPU_UTILIZATION_SAMPLES), C.ulonglong(lastSample), &vt, &count, nil))
		return fmt.Sprintf("%v count %d", r, count)
	})
	measure("GPU samples, 1024 buffer, since last", func() string {
		count, vt := C.uint(len(samples)), C.int(0)
		r := nvml.Return(C.nvmlDeviceGetSamples(h, C.int(nvml.GPU_UTILIZATION_SAMPLES), C.ulonglong(lastSample), &vt, &count, unsafe.Pointer(&samples[0])))
		for _, s := range samples[:min(int(count), len(samples))] {
			lastSample = max(lastSample, s.TimeStamp)
		}
		return fmt.Sprintf("%v count %d", r, count)
	})
	measure("GPU samples, go-nvml, since last", func() string {
		_, l, r := d.GetSamples(nvml.GPU_UTILIZATION_SAMPLES, lastSample)
		for _, s := range l {
			lastSample = max(lastSample, s.TimeStamp)
		}
		return fmt.Sprintf("%v count %d", r, len(l))
	})
	measure("utilization rates", func() string {
		u, r := d.GetUtilizationRates()
		return fmt.Sprintf("%v %d", r, u.Gpu)
	})
	measure("memory info", func() string {
		m, r := d.GetMemoryInfo()
		return fmt.Sprintf("%v %d MiB", r, m.Used>>20)
	})
}

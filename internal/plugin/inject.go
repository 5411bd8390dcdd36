package plugin

import (
	"cmp"
	"crypto/rand"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuslice/gpuslice/internal/dpconfig"
)

// The device list strategies of NVIDIA's config (flags.plugin.deviceListStrategy).
const (
	StrategyEnvVar         = "envvar"
	StrategyVolumeMounts   = "volume-mounts"
	StrategyCDIAnnotations = "cdi-annotations"
	StrategyCDICRI         = "cdi-cri"
)

// Names NVIDIA's plugin uses, so that a CDI spec or a container runtime
// configured for NVIDIA's plugin works with ours unchanged.
const (
	// CDIKind is the vendor/class of the CDI device a GPU is: a GPU is the
	// CDI device "nvidia.com/gpu=<UUID or index>", as nvidia-ctk cdi
	// generate names it.
	CDIKind = "nvidia.com/gpu"
	// DefaultCDIAnnotationPrefix is the CDI specification's annotation
	// prefix, which containerd and CRI-O read.
	DefaultCDIAnnotationPrefix = "cdi.k8s.io/"
	// cdiAnnotationPlugin names this plugin in the annotation key
	// (<prefix><plugin>_<request ID>).
	cdiAnnotationPlugin = "gpuslice-plugin"
	// volumeMountsRoot is where the volume-mounts strategy lists the GPUs:
	// one /dev/null mount per GPU, named by its ID, which the NVIDIA
	// container runtime reads when NVIDIA_VISIBLE_DEVICES points there.
	volumeMountsRoot = "/var/run/nvidia-container-devices"
)

// injection is how an allocation tells the container runtime which GPUs to
// give the container: the device list strategies in effect and the GPU
// naming (deviceIDStrategy).
type injection struct {
	EnvVar, VolumeMounts, CDIAnnotations, CDICRI bool
	// ByIndex names GPUs by their index instead of their UUID.
	ByIndex bool
	// AnnotationPrefix is the annotation key prefix of cdi-annotations.
	AnnotationPrefix string
}

// injectionOf reads the strategies of a config. An absent list means
// envvar, NVIDIA's default. The warning is about a setting that would make
// the runtime see no GPU.
func injectionOf(cfg dpconfig.Config) (injection, string) {
	strategies := cfg.DeviceListStrategy
	if len(strategies) == 0 {
		strategies = []string{StrategyEnvVar}
	}
	in := injection{
		EnvVar:           slices.Contains(strategies, StrategyEnvVar),
		VolumeMounts:     slices.Contains(strategies, StrategyVolumeMounts),
		CDIAnnotations:   slices.Contains(strategies, StrategyCDIAnnotations),
		CDICRI:           slices.Contains(strategies, StrategyCDICRI),
		ByIndex:          cfg.DeviceIDStrategy == "index",
		AnnotationPrefix: cmp.Or(cfg.CDIAnnotationPrefix, DefaultCDIAnnotationPrefix),
	}
	var warning string
	if in.CDIAnnotations && !strings.HasSuffix(in.AnnotationPrefix, "/") {
		// NVIDIA's plugin takes any prefix; without the slash the key has
		// no prefix part and no runtime reads it as a CDI request.
		warning = fmt.Sprintf("flags.plugin.cdiAnnotationPrefix %q does not end in \"/\": container runtimes will not read the CDI annotations", in.AnnotationPrefix)
	}
	return in, warning
}

// anyCDI and allCDI mirror NVIDIA's rule: with CDI only, the response
// carries no NVIDIA_VISIBLE_DEVICES, so a runtime that injects GPUs from the
// variable does not add them a second time.
func (in injection) anyCDI() bool { return in.CDIAnnotations || in.CDICRI }
func (in injection) allCDI() bool { return in.anyCDI() && !in.EnvVar && !in.VolumeMounts }

// CDIDeviceName is the fully qualified CDI name of a GPU.
func CDIDeviceName(id string) string { return CDIKind + "=" + id }

// response builds one container's allocation response for its GPUs
// (physical, in request order, each once) and memory budget. requestID
// makes the annotation key unique among the container's annotations, which
// the kubelet merges from every resource it holds.
func (in injection) response(gpus []gpuInfo, budget uint64, requestID string) *pluginapi.ContainerAllocateResponse {
	names := make([]string, len(gpus))
	for i, g := range gpus {
		names[i] = g.UUID
		if in.ByIndex {
			names[i] = strconv.Itoa(g.Index)
		}
	}
	r := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{
		EnvMemoryBudget: strconv.FormatUint(budget, 10),
	}}
	if in.anyCDI() {
		cdi := make([]string, len(names))
		for i, n := range names {
			cdi[i] = CDIDeviceName(n)
		}
		if in.CDIAnnotations {
			r.Annotations = map[string]string{
				in.AnnotationPrefix + cdiAnnotationPlugin + "_" + requestID: strings.Join(cdi, ","),
			}
		}
		if in.CDICRI {
			for _, n := range cdi {
				r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: n})
			}
		}
	}
	if in.allCDI() {
		return r
	}
	if in.EnvVar {
		r.Envs[EnvVisibleDevices] = strings.Join(names, ",")
	}
	if in.VolumeMounts {
		// Set after envvar, as NVIDIA does: with both, the variable points
		// at the mounts.
		r.Envs[EnvVisibleDevices] = volumeMountsRoot
		for _, n := range names {
			r.Mounts = append(r.Mounts, &pluginapi.Mount{HostPath: "/dev/null", ContainerPath: path.Join(volumeMountsRoot, n)})
		}
	}
	return r
}

// newRequestID returns a fresh ID for an annotation key: 26 characters of
// base32, within the 63 the CDI specification allows for <plugin>_<ID>.
func newRequestID() string { return strings.ToLower(rand.Text()) }

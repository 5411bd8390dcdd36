{{/*
Chart name, trimmed to the 63 characters a label value allows.
*/}}
{{- define "gpuslice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Base name of every object: the release name when it already says gpuslice,
else <release>-gpuslice. Components append -exporter, -tuner, -plugin (at
most 9 characters), so the base is cut at 54 to keep object names within 63.
*/}}
{{- define "gpuslice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpuslice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object. Call with (dict "ctx" $ "component" "exporter").
*/}}
{{- define "gpuslice.labels" -}}
helm.sh/chart: {{ include "gpuslice.chart" .ctx }}
{{ include "gpuslice.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: gpuslice
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels: stable across upgrades (a Deployment's or DaemonSet's
selector cannot change).
*/}}
{{- define "gpuslice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuslice.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{/*
Image reference; a digest wins over the tag.
*/}}
{{- define "gpuslice.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- /* toString: a tag such as 1 or 1.0 comes as a number from --set or YAML */}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}
{{- end }}

{{/*
ServiceAccount name of a component: (dict "ctx" $ "component" "tuner").
*/}}
{{- define "gpuslice.serviceAccountName" -}}
{{- printf "%s-%s" (include "gpuslice.fullname" .ctx) .component }}
{{- end }}

{{/*
The namespace and name of the device-plugin ConfigMap the tuner writes and
gpuslice-plugin reads. In plugin mode it lives in the release namespace and
the chart creates it; otherwise it belongs to NVIDIA's device plugin.
*/}}
{{- define "gpuslice.dpNamespace" -}}
{{- if .Values.tuner.devicePlugin.namespace }}
{{- .Values.tuner.devicePlugin.namespace }}
{{- else if eq .Values.tuner.mode "plugin" }}
{{- .Release.Namespace }}
{{- else }}
{{- "kube-system" }}
{{- end }}
{{- end }}

{{- define "gpuslice.dpConfigMap" -}}
{{- if .Values.tuner.devicePlugin.configMap }}
{{- .Values.tuner.devicePlugin.configMap }}
{{- else if eq .Values.tuner.mode "plugin" }}
{{- printf "%s-plugin-config" (include "gpuslice.fullname" .) }}
{{- else }}
{{- "nvidia-device-plugin-config" }}
{{- end }}
{{- end }}

{{/*
gpuslice-plugin's ConfigMap: the tuner's in plugin mode, else its own name in
the release namespace (the plugin can run without the tuner, or before it).
*/}}
{{- define "gpuslice.pluginConfigMap" -}}
{{- if eq .Values.tuner.mode "plugin" }}
{{- include "gpuslice.dpConfigMap" . }}
{{- else }}
{{- printf "%s-plugin-config" (include "gpuslice.fullname" .) }}
{{- end }}
{{- end }}

{{- define "gpuslice.pluginNamespace" -}}
{{- if eq .Values.tuner.mode "plugin" }}
{{- include "gpuslice.dpNamespace" . }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{- define "gpuslice.leaseName" -}}
{{- default (printf "%s-tuner" (include "gpuslice.fullname" .)) .Values.tuner.leaderElection.leaseName }}
{{- end }}

{{/*
The ConfigMap the tuner keeps its workload memory in (workloadMemory.configMap),
in the release namespace.
*/}}
{{- define "gpuslice.memoryConfigMap" -}}
{{- printf "%s-tuner-memory" (include "gpuslice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Relabelings of the exporter's and plugin's monitors: the pod's node becomes
the `node` label the alerts and dashboards group by; then
gpuslice.podLabelsDrop.
*/}}
{{- define "gpuslice.nodeRelabelings" -}}
- action: replace
  sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
{{ include "gpuslice.podLabelsDrop" . }}
{{- end }}

{{/*
Every monitor drops the target's namespace/pod/container labels: the
exporter's and the tuner's own labels of those names name the GPU workload
(gpuslice_container_*, gpuslice_tuner_recommended_memory_request_bytes),
and a clash would rename them to exported_*. The tuner keeps no node
relabel: its series carry the node they are about.
*/}}
{{- define "gpuslice.podLabelsDrop" -}}
- action: labeldrop
  regex: namespace|pod|container
{{- end }}

{{/*
Validation of value combinations that would render a broken install.
*/}}
{{- define "gpuslice.validate" -}}
{{- if and .Values.monitoring.serviceMonitor.enabled .Values.monitoring.podMonitor.enabled }}
{{- fail "monitoring.serviceMonitor.enabled and monitoring.podMonitor.enabled are both true: every target would be scraped twice; enable one" }}
{{- end }}
{{- if not (has .Values.tuner.mode (list "plugin" "config-manager" "restart")) }}
{{- fail (printf "tuner.mode %q: want plugin, config-manager or restart" .Values.tuner.mode) }}
{{- end }}
{{- if not (has .Values.exporter.podsSource (list "apiserver" "kubelet" "none")) }}
{{- fail (printf "exporter.podsSource %q: want apiserver, kubelet or none" .Values.exporter.podsSource) }}
{{- end }}
{{- range (ternary (list .Values.plugin.deviceListStrategy) .Values.plugin.deviceListStrategy (kindIs "string" .Values.plugin.deviceListStrategy)) }}
{{- if and . (not (has . (list "envvar" "volume-mounts" "cdi-annotations" "cdi-cri"))) }}
{{- fail (printf "plugin.deviceListStrategy %q: want envvar, volume-mounts, cdi-annotations or cdi-cri (or a list of them)" .) }}
{{- end }}
{{- end }}
{{- if not (has .Values.plugin.deviceIDStrategy (list "" "uuid" "index")) }}
{{- fail (printf "plugin.deviceIDStrategy %q: want uuid or index" .Values.plugin.deviceIDStrategy) }}
{{- end }}
{{- if and .Values.tuner.enabled (eq .Values.tuner.mode "plugin") (not .Values.plugin.enabled) }}
{{- fail "tuner.mode=plugin needs plugin.enabled=true: nothing else reads the config the tuner writes in that mode" }}
{{- end }}
{{- /* gpuslice-plugin's --config.default is plugin.defaultConfigKey: the
key unlabelled nodes read must be the one the tuner derives its configs
from. */}}
{{- if and .Values.tuner.enabled (eq .Values.tuner.mode "plugin") }}
{{- $apply := get (include "gpuslice.tunerConfig" . | fromYaml) "apply" }}
{{- if not (kindIs "map" $apply) }}
{{- fail (printf "tuner.config.apply must be a map (apply.mode, apply.key, ...), not %v" $apply) }}
{{- end }}
{{- $key := get $apply "key" }}
{{- if ne (toString $key) (toString .Values.plugin.defaultConfigKey) }}
{{- fail (printf "the tuner's apply.key %q (tuner.devicePlugin.configKey or tuner.config.apply.key) differs from plugin.defaultConfigKey %q: in plugin mode gpuslice-plugin reads the latter on unlabelled nodes and the tuner derives its configs from the former; make them one" (toString $key) (toString .Values.plugin.defaultConfigKey)) }}
{{- end }}
{{- end }}
{{- /* The alerts and dashboards find the components by scrape jobs
containing gpuslice-exporter (-tuner, -plugin); the chart's monitors name
the job after the Service (or <namespace>/<monitor>), i.e. <fullname>-... */}}
{{- if and (or .Values.monitoring.serviceMonitor.enabled .Values.monitoring.podMonitor.enabled) (not (hasSuffix "gpuslice" (include "gpuslice.fullname" .))) }}
{{- fail (printf "the objects' base name %q (the release name, fullnameOverride, nameOverride) does not end in \"gpuslice\": the monitors' scrape jobs would be %s-exporter and so on, and the alert rules and dashboards, which look for jobs containing gpuslice-exporter, would see nothing; set fullnameOverride to a name of at most 54 characters ending in gpuslice" (include "gpuslice.fullname" .) (include "gpuslice.fullname" .)) }}
{{- end }}
{{- if kindIs "float64" .Values.image.tag }}
{{- fail (printf "image.tag %v is a number in YAML, whose digits are not kept as written (1.10 reads as 1.1): quote it" .Values.image.tag) }}
{{- end }}
{{- include "gpuslice.validateMPS" . }}
{{- include "gpuslice.validateScrapers" . }}
{{- end }}

{{/*
The MPS control daemon puts its nodes' GPUs in EXCLUSIVE_PROCESS mode
(mps.exclusiveProcess), where only the MPS server holds a context: a
process that is not an MPS client (a time-sliced pod) gets none. So it
needs gpuslice-plugin, which makes the MPS clients, and it must run only on
nodes whose config shares through MPS: every plugin.config one, or the
nodes mps.nodeSelector names.
*/}}
{{- define "gpuslice.validateMPS" -}}
{{- if and .Values.mps.enabled .Values.mps.exclusiveProcess }}
{{- if not .Values.plugin.enabled }}
{{- fail "mps.enabled needs plugin.enabled=true and a plugin.config that shares through MPS (sharing.mps): the daemon puts the GPUs in EXCLUSIVE_PROCESS mode, where only the MPS clients gpuslice-plugin makes get a context (docs/mps.md)" }}
{{- end }}
{{- $plain := list }}
{{- range $key, $cfg := .Values.plugin.config }}
{{- $sharing := (fromYaml (toString $cfg)).sharing }}
{{- if not (and (kindIs "map" $sharing) $sharing.mps) }}
{{- $plain = append $plain $key }}
{{- end }}
{{- end }}
{{- if and $plain (not .Values.mps.nodeSelector) }}
{{- fail (printf "mps.enabled: plugin.config %s does not share through MPS (sharing.mps), and without mps.nodeSelector the MPS daemon runs on every GPU node and puts its GPUs in EXCLUSIVE_PROCESS mode, where only MPS clients get a context: make every config an MPS one, or set mps.nodeSelector to the nodes whose config is one" (join ", " (sortAlpha $plain))) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Every scraper of the exporters must speak what exporter.webConfig serves: the
tuner (when it scrapes them directly) and the exporter's monitor. Without
this the install renders, and every scrape fails with a TLS handshake error
or a 401. Also: a monitor's endpoint settings must not repeat the keys the
chart writes itself (duplicate YAML keys).
*/}}
{{- define "gpuslice.validateScrapers" -}}
{{- range $kind := list "serviceMonitor" "podMonitor" }}
{{- $mon := index $.Values.monitoring $kind }}
{{- range $component, $ep := ($mon.endpoint | default dict) }}
{{- range $key := list "port" "path" "interval" "scrapeTimeout" "relabelings" }}
{{- if hasKey ($ep | default dict) $key }}
{{- fail (printf "monitoring.%s.endpoint.%s.%s: the chart sets %s itself (monitoring.%s.interval/scrapeTimeout for those)" $kind $component $key $key $kind) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $web := .Values.exporter.webConfig | default dict }}
{{- if and .Values.exporter.enabled $web }}
{{- $tls := $web.tls_server_config }}
{{- $auth := $web.basic_auth_users }}
{{- if and .Values.tuner.enabled (eq (include "gpuslice.tunerSource" .) "exporters") }}
{{- $ex := dig "signals" "exporters" dict (.Values.tuner.config | default dict) }}
{{- $hc := $ex.httpClient | default dict }}
{{- if and $tls (ne ($ex.scheme | default "http") "https") }}
{{- fail "exporter.webConfig has tls_server_config but the tuner scrapes the exporters over http: set tuner.config.signals.exporters.scheme=https and tuner.config.signals.exporters.httpClient.tls_config (ca_file, server_name or insecure_skip_verify)" }}
{{- end }}
{{- if and $auth (not (or $hc.basic_auth $hc.authorization)) }}
{{- fail "exporter.webConfig has basic_auth_users but the tuner sends no credentials: set tuner.config.signals.exporters.httpClient.basic_auth (username, password_file)" }}
{{- end }}
{{- end }}
{{- range $kind := list "serviceMonitor" "podMonitor" }}
{{- $mon := index $.Values.monitoring $kind }}
{{- if $mon.enabled }}
{{- $ep := dig "exporter" dict ($mon.endpoint | default dict) }}
{{- if and $tls (ne (lower ($ep.scheme | default "http")) "https") }}
{{- fail (printf "exporter.webConfig has tls_server_config but the exporter's %s scrapes over http: set monitoring.%s.endpoint.exporter.scheme=https and its tlsConfig" $kind $kind) }}
{{- end }}
{{- if and $auth (not (or $ep.basicAuth $ep.authorization)) }}
{{- fail (printf "exporter.webConfig has basic_auth_users but the exporter's %s sends no credentials: set monitoring.%s.endpoint.exporter.basicAuth (Secret keys of username and password)" $kind $kind) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The --web.listen-address argument for a component's port (dict "port" P
"extraArgs" A), left out when the component's extraArgs give their own:
the flag adds an address each time it is given, so both would be served
and the same port twice fails to bind.
*/}}
{{- define "gpuslice.listenArg" -}}
{{- $own := false }}
{{- range .extraArgs }}
{{- if or (hasPrefix "--web.listen-address" (toString .)) (hasPrefix "-web.listen-address" (toString .)) }}
{{- $own = true }}
{{- end }}
{{- end }}
{{- if not $own -}}
- --web.listen-address=:{{ .port }}
{{- end }}
{{- end }}

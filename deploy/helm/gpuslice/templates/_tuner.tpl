{{/*
tuner.yaml (schema: internal/tuner/config, example: deploy/examples/tuner.yaml).
The chart fills in what it knows - the apply mode and the objects its RBAC
names, the Lease, where the exporter pods are - and tuner.config is merged
over that, key by key, for everything else (policy, apply.nodeSelector,
signals.source: prometheus, ...). The tuner rejects unknown keys.
*/}}
{{- define "gpuslice.tunerConfig" -}}
{{- $dpNamespace := include "gpuslice.dpNamespace" . }}
{{- $apply := dict
  "mode" .Values.tuner.mode
  "configMap" (dict "namespace" $dpNamespace "name" (include "gpuslice.dpConfigMap" .))
  "key" (include "gpuslice.dpConfigKey" .)
}}
{{- /* config-manager mode restarts NVIDIA's DaemonSet too, after rewriting a
key that nodes already use: config-manager reacts only to label changes. */}}
{{- if or (eq .Values.tuner.mode "restart") (eq .Values.tuner.mode "config-manager") }}
{{- $_ := set $apply "daemonSet" (dict "namespace" $dpNamespace "name" .Values.tuner.devicePlugin.daemonSet) }}
{{- end }}
{{- $base := dict
  "leaderElection" (dict
    "enabled" true
    "namespace" .Release.Namespace
    "name" (include "gpuslice.leaseName" .))
  "signals" (dict
    "source" "exporters"
    "exporters" (dict
      "namespace" .Release.Namespace
      "labelSelector" (include "gpuslice.selectorLabels" (dict "ctx" $ "component" "exporter") | fromYaml | include "gpuslice.selectorString")
      "portName" "metrics"
      "port" .Values.exporter.port))
  "apply" $apply
  "workloadMemory" (dict
    "configMap" (dict "namespace" .Release.Namespace "name" (include "gpuslice.memoryConfigMap" .)))
}}
{{- toYaml (mergeOverwrite $base (deepCopy .Values.tuner.config)) }}
{{- end }}

{{/*
A label map as a label selector string: a=b,c=d (sorted keys).
*/}}
{{- define "gpuslice.selectorString" -}}
{{- $pairs := list }}
{{- range $k, $v := . }}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/*
The signal source the tuner will use, after tuner.config.
*/}}
{{- define "gpuslice.tunerSource" -}}
{{- $signals := .Values.tuner.config.signals | default dict }}
{{- $signals.source | default "exporters" }}
{{- end }}

{{/*
apply.key: in restart mode the key NVIDIA's DaemonSet reads; in
config-manager and plugin mode the config of unlabelled nodes, which the
tuner derives its named configs from (gpuslice-plugin reads the same key,
--config.default).
*/}}
{{- define "gpuslice.dpConfigKey" -}}
{{- if .Values.tuner.devicePlugin.configKey }}
{{- .Values.tuner.devicePlugin.configKey }}
{{- else if eq .Values.tuner.mode "restart" }}
{{- "config.yaml" }}
{{- else if eq .Values.tuner.mode "plugin" }}
{{- .Values.plugin.defaultConfigKey }}
{{- else }}
{{- "default" }}
{{- end }}
{{- end }}

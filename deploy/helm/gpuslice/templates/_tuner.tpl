{{/*
tuner.yaml: what the chart knows (mode, the objects its RBAC names, the lease,
the metrics address, where the exporters are) under the user's
tuner.config, which wins key by key.
*/}}
{{- define "gpuslice.tunerConfig" -}}
{{- $base := dict
  "mode" .Values.tuner.mode
  "listenAddress" (printf ":%v" .Values.tuner.port)
  "devicePlugin" (dict
    "namespace" (include "gpuslice.dpNamespace" .)
    "configMap" (include "gpuslice.dpConfigMap" .)
    "configKey" .Values.tuner.devicePlugin.configKey
    "daemonSet" .Values.tuner.devicePlugin.daemonSet)
  "leaderElection" (dict
    "enabled" true
    "namespace" .Release.Namespace
    "leaseName" (include "gpuslice.leaseName" .))
  "exporters" (dict
    "namespace" .Release.Namespace
    "service" (printf "%s-exporter" (include "gpuslice.fullname" .))
    "port" .Values.exporter.port)
}}
{{- toYaml (mergeOverwrite $base (deepCopy .Values.tuner.config)) }}
{{- end }}

{{/* Names and labels shared by every object of the chart. */}}
{{- define "otel-gpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "otel-gpu.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "otel-gpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "otel-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "otel-gpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "otel-gpu.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "otel-gpu.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "otel-gpu.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "otel-gpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret the chart creates for values given in clear (OTLP headers, Pyroscope password). */}}
{{- define "otel-gpu.secretName" -}}
{{- printf "%s-secret" (include "otel-gpu.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "otel-gpu.priorityClassName" -}}
{{- if .Values.priorityClass.create -}}
{{- include "otel-gpu.fullname" . -}}
{{- else -}}
{{- .Values.priorityClassName -}}
{{- end -}}
{{- end -}}

{{/* k1=v1,k2=v2 with each key and value percent-encoded, as OTEL_EXPORTER_OTLP_HEADERS and OTEL_RESOURCE_ATTRIBUTES
read them (urlquery writes a space as "+", which those variables do not decode: it becomes %20; a "+" is %2B). */}}
{{- define "otel-gpu.pairs" -}}
{{- $items := list -}}
{{- range $key, $value := . -}}
{{- $items = append $items (printf "%s=%s" (urlquery $key | replace "+" "%20") (urlquery (toString $value) | replace "+" "%20")) -}}
{{- end -}}
{{- join "," $items -}}
{{- end -}}

{{/*
Relabelings of the ServiceMonitor and PodMonitor: the scrape endpoint carries the resource only in target_info, so
the labels the dashboards select by (as OTLP ingestion gives them from the resource) come from the target instead:
the node as host_name and k8s_node_name, the cluster as k8s_cluster_name when clusterName is set.
*/}}
{{- define "otel-gpu.monitorRelabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: k8s_node_name
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: host_name
{{- with .Values.clusterName }}
- targetLabel: k8s_cluster_name
  replacement: {{ . | quote }}
{{- end }}
{{- end }}

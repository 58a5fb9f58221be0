{{/* Name of the chart, overridable. */}}
{{- define "biaxial.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name. */}}
{{- define "biaxial.fullname" -}}
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

{{/* Labels on every object. */}}
{{- define "biaxial.labels" -}}
app.kubernetes.io/name: {{ include "biaxial.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component; call with (dict "root" $ "component" "controller"). */}}
{{- define "biaxial.selectorLabels" -}}
app.kubernetes.io/name: {{ include "biaxial.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "biaxial.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "biaxial.pluginServiceAccount" -}}
{{- printf "%s-kubelet-plugin" (include "biaxial.fullname" .) -}}
{{- end -}}

{{- define "biaxial.controllerServiceAccount" -}}
{{- printf "%s-controller" (include "biaxial.fullname" .) -}}
{{- end -}}

{{/* The admission mechanism, checked: policy | webhook. */}}
{{- define "biaxial.admission.mechanism" -}}
{{- $m := .Values.admission.mechanism -}}
{{- if not (has $m (list "policy" "webhook")) -}}
{{- fail (printf "admission.mechanism: %q is not one of policy, webhook" $m) -}}
{{- end -}}
{{- $m -}}
{{- end -}}

{{/* The admission webhook's Service and the Secret with its serving certificate. */}}
{{- define "biaxial.admission.webhookService" -}}
{{- printf "%s-admission-webhook" (include "biaxial.fullname" .) -}}
{{- end -}}

{{- define "biaxial.admission.webhookSecret" -}}
{{- $tls := .Values.admission.webhook.tls -}}
{{- if eq $tls.source "secret" -}}
{{- required "admission.webhook.tls.secretName: the kubernetes.io/tls Secret of the admission webhook (tls.source secret)" $tls.secretName -}}
{{- else -}}
{{- printf "%s-admission-webhook-tls" (include "biaxial.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The webhook is served: admission on with mechanism webhook. */}}
{{- define "biaxial.admission.webhookOn" -}}
{{- if and .Values.admission.enabled (eq (include "biaxial.admission.mechanism" .) "webhook") -}}
true
{{- end -}}
{{- end -}}

{{/* The namespaces admission acts in: the administrator's selector minus kube-system and the
release's namespace (the policy's binding and the webhook). */}}
{{- define "biaxial.admission.namespaceSelector" -}}
{{- with .Values.admission.namespaceSelector.matchLabels }}
matchLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
matchExpressions:
  {{- with .Values.admission.namespaceSelector.matchExpressions }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: [kube-system, {{ .Release.Namespace }}]
{{- end -}}

{{/* Annotations that ask for or shape GPUs (KAI's, HAMi's, Volcano's): a CEL list,
driver.scheduling.admission.GPU_ANNOTATIONS. */}}
{{- define "biaxial.admission.gpuAnnotations" -}}
["gpu-fraction", "gpu-memory", "nvidia.com/use-gputype", "nvidia.com/nouse-gputype", "nvidia.com/use-gpuuuid", "nvidia.com/nouse-gpuuuid", "nvidia.com/numa-bind", "nvidia.com/vgpu-mode", "volcano.sh/vgpu-use-gpuuuid", "volcano.sh/vgpu-nouse-gpuuuid", "volcano.sh/vgpu-mode"]
{{- end -}}

{{/* A CEL condition on a resource name k that asks for a GPU:
driver.scheduling.admission.GPU_RESOURCES, GPU_RESOURCE_PREFIXES and biaxial's classes. */}}
{{- define "biaxial.admission.gpuResource" -}}
k in ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores", "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-memory-percentage", "volcano.sh/vgpu-cores"] || k.startsWith("nvidia.com/mig-") || (k.startsWith("deviceclass.resource.kubernetes.io/") && k.endsWith(".biaxial.dev"))
{{- end -}}

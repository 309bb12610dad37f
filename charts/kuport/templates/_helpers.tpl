{{/* Chart name, overridable with nameOverride. */}}
{{- define "kuport.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Prefix of every object name: fullnameOverride, else the release name if it contains the chart
name, else "<release>-<chart>". Kept to 40 characters so that "-controller" and "-node-exec"
suffixes stay within the 63-character label limit.
*/}}
{{- define "kuport.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kuport.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "kuport.labels" -}}
helm.sh/chart: {{ include "kuport.chart" . }}
app.kubernetes.io/name: {{ include "kuport.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kuport
{{- end }}

{{/* Selector labels of one component; call with (dict "ctx" $ "component" "controller"). */}}
{{- define "kuport.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kuport.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of one component's objects. */}}
{{- define "kuport.componentLabels" -}}
{{ include "kuport.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kuport.controller.fullname" -}}
{{- printf "%s-controller" (include "kuport.fullname" .) }}
{{- end }}

{{- define "kuport.nodeExec.fullname" -}}
{{- printf "%s-node-exec" (include "kuport.fullname" .) }}
{{- end }}

{{/* image: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "kuport.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{- define "kuport.debug.fullname" -}}
{{- printf "%s-debug" (include "kuport.fullname" .) }}
{{- end }}

{{/* The controller address executors dial (TLS): nodeExec.controllerAddress, else the chart's Service. */}}
{{- define "kuport.controllerAddress" -}}
{{- if .Values.nodeExec.controllerAddress }}
{{- .Values.nodeExec.controllerAddress }}
{{- else }}
{{- printf "https://%s.%s.svc:%d" (include "kuport.controller.fullname" .) .Release.Namespace (int .Values.controller.grpcPort) }}
{{- end }}
{{- end }}

{{/*
The audience of the executors' projected tokens: the controller reviews them for it, so a token
minted for another audience (the API server's own, say) never passes as an executor's.
*/}}
{{- define "kuport.executorAudience" -}}
kuport.wlz.li/node-exec
{{- end }}

{{/*
The ConfigMap holding the CA (key ca.crt) executors verify the controller against: the
controller's own kuport-ca, or with controller.tls.secretName the operator's
controller.tls.caConfigMap (required then: the executors never mount the serving Secret).
*/}}
{{- define "kuport.caConfigMap" -}}
{{- if .Values.controller.tls.secretName -}}
{{- required "controller.tls.caConfigMap: with controller.tls.secretName, name a ConfigMap in the release namespace holding only the CA as ca.crt (the executors never mount the serving Secret, which holds the key)" .Values.controller.tls.caConfigMap -}}
{{- else -}}
kuport-ca
{{- end -}}
{{- end }}

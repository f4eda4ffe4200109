{{/*
Chart name, truncated to the 63 characters of a DNS label.
*/}}
{{- define "podha.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects. A release named "podha" yields "podha", not "podha-podha".
*/}}
{{- define "podha.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "podha.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "podha.labels" -}}
helm.sh/chart: {{ include "podha.chart" . }}
{{ include "podha.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: podha
{{- end }}

{{/*
Labels selecting the operator's pods (immutable in a Deployment: keep them stable).
*/}}
{{- define "podha.selectorLabels" -}}
app.kubernetes.io/name: {{ include "podha.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Service account of the operator.
*/}}
{{- define "podha.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "podha.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Container image reference.
*/}}
{{- define "podha.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}

{{/*
Labels selecting the agent's pods: a name of their own, so the operator's Service, PDB and
Deployment never select them.
*/}}
{{- define "podha.agentSelectorLabels" -}}
app.kubernetes.io/name: {{ include "podha.name" . }}-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Name of the agent's objects (DaemonSet, ServiceAccount, ClusterRole).
*/}}
{{- define "podha.agentName" -}}
{{- printf "%s-agent" (include "podha.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The admission policies' variables naming who writes: a token bound to one of its pods
(podBound), the agent's account (isAgent), podha's with a pod-bound token (isPodha), and the
node an agent's token names, '' when none (agentNode).
*/}}
{{- define "podha.writerVariables" -}}
- name: podBound
  expression: >-
    has(request.userInfo.extra) && 'authentication.kubernetes.io/pod-uid' in request.userInfo.extra
    && size(request.userInfo.extra['authentication.kubernetes.io/pod-uid']) == 1
- name: isAgent
  expression: "request.userInfo.username == 'system:serviceaccount:{{ .Release.Namespace }}:{{ include "podha.agentName" . }}'"
- name: isPodha
  expression: "request.userInfo.username == 'system:serviceaccount:{{ .Release.Namespace }}:{{ include "podha.serviceAccountName" . }}' && variables.podBound"
- name: agentNode
  expression: >-
    variables.podBound && has(request.userInfo.extra)
    && 'authentication.kubernetes.io/node-name' in request.userInfo.extra
    && size(request.userInfo.extra['authentication.kubernetes.io/node-name']) == 1
    ? request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''
{{- end }}

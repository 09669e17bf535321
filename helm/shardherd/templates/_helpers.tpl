{{/* The chart name, or nameOverride. */}}
{{- define "shardherd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every resource name: fullnameOverride, or release name plus chart name (once). */}}
{{- define "shardherd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels on every resource; each resource adds its app.kubernetes.io/component. */}}
{{- define "shardherd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "shardherd.instanceLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shardherd
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels naming this release of the chart. */}}
{{- define "shardherd.instanceLabels" -}}
app.kubernetes.io/name: {{ include "shardherd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels that select the coordinator pods. */}}
{{- define "shardherd.selectorLabels" -}}
{{ include "shardherd.instanceLabels" . }}
app.kubernetes.io/component: coordinator
{{- end }}

{{/* The ServiceAccount the coordinator runs as. */}}
{{- define "shardherd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "shardherd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The coordinator image reference: a digest pins it, else the tag (default appVersion). */}}
{{- define "shardherd.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Secret holding the API token. */}}
{{- define "shardherd.tokenSecretName" -}}
{{- default (printf "%s-api-token" (include "shardherd.fullname" .)) .Values.apiToken.existingSecret }}
{{- end }}

{{/* The Secret holding the read token (agents). */}}
{{- define "shardherd.readTokenSecretName" -}}
{{- default (printf "%s-api-read-token" (include "shardherd.fullname" .)) .Values.readToken.existingSecret }}
{{- end }}

{{/* The in-cluster URL of the coordinator API. */}}
{{- define "shardherd.coordinatorUrl" -}}
{{- printf "http://%s.%s.svc:%d" (include "shardherd.fullname" .) .Release.Namespace (int .Values.service.port) }}
{{- end }}

{{/*
A settings map as the body of a TOML `[shardherd]` table, keys sorted, null values left out. Helm holds every number
as a float, so whole numbers are written as TOML integers; strings are written as JSON strings, which TOML reads
unchanged.
*/}}
{{- define "shardherd.toml" -}}
[shardherd]
{{- range $key, $value := . }}
{{- if and (kindIs "slice" $value) (gt (len $value) 0) (kindIs "map" (first $value)) }}
{{- else if not (kindIs "invalid" $value) }}
{{ $key }} = {{ include "shardherd.tomlValue" $value }}
{{- end }}
{{- end }}
{{- /* Lists of tables (e.g. `streams`) come last, as [[shardherd.<key>]] sections, so no plain key follows them. */}}
{{- range $key, $value := . }}
{{- if and (kindIs "slice" $value) (gt (len $value) 0) (kindIs "map" (first $value)) }}
{{- range $item := $value }}

[[shardherd.{{ $key }}]]
{{- range $field, $fieldValue := $item }}
{{- if not (kindIs "invalid" $fieldValue) }}
{{ $field }} = {{ include "shardherd.tomlValue" $fieldValue }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* One TOML value: whole floats as integers (Helm holds every number as a float), anything else as JSON. */}}
{{- define "shardherd.tomlValue" -}}
{{- if kindIs "float64" . }}{{ if eq . (float64 (int64 .)) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else }}{{ toJson . }}{{ end }}
{{- end }}

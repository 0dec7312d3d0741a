{{/* Chart name, truncated to the 63 characters a DNS label allows. */}}
{{- define "budgetproxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart, or the release name if it contains the chart's. */}}
{{- define "budgetproxy.fullname" -}}
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

{{- define "budgetproxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "budgetproxy.instanceLabels" -}}
app.kubernetes.io/name: {{ include "budgetproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The proxy pods; the component keeps the bundled Redis pods out of its selectors. */}}
{{- define "budgetproxy.selectorLabels" -}}
{{ include "budgetproxy.instanceLabels" . }}
app.kubernetes.io/component: proxy
{{- end }}

{{- define "budgetproxy.redisSelectorLabels" -}}
{{ include "budgetproxy.instanceLabels" . }}
app.kubernetes.io/component: redis
{{- end }}

{{/* Labels on every object (selectors add the component). */}}
{{- define "budgetproxy.labels" -}}
helm.sh/chart: {{ include "budgetproxy.chart" . }}
{{ include "budgetproxy.instanceLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "budgetproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "budgetproxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret whose keys become env vars: the user's, or the one the chart creates. */}}
{{- define "budgetproxy.secretName" -}}
{{- default (printf "%s-env" (include "budgetproxy.fullname" .)) .Values.secret.existingSecret }}
{{- end }}

{{- define "budgetproxy.redisName" -}}
{{- printf "%s-redis" (include "budgetproxy.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* REDIS_URL set as a plain env var: the bundled Redis, else redis.url (may be empty). */}}
{{- define "budgetproxy.redisUrl" -}}
{{- if .Values.redis.bundled.enabled }}
{{- printf "redis://%s:6379/0" (include "budgetproxy.redisName" .) }}
{{- else }}
{{- .Values.redis.url }}
{{- end }}
{{- end }}

{{/*
The proxy config as rendered into the ConfigMap: values.config with server.host and
server.port set by the chart (the container port the probes and the Service use).
*/}}
{{- define "budgetproxy.config" -}}
{{- $config := deepCopy .Values.config }}
{{- $server := merge (dict "host" "0.0.0.0" "port" (int .Values.containerPort)) (default (dict) $config.server) }}
{{- $_ := set $config "server" $server }}
{{- toYaml $config }}
{{- end }}

{{/* Refuse values that would deploy a proxy that cannot work; each message names the key. */}}
{{- define "budgetproxy.validate" -}}
{{- $config := .Values.config }}
{{- $server := default (dict) $config.server }}
{{- $store := default (dict) $config.store }}
{{- $kind := default "memory" $store.kind }}
{{- $workers := int (default 1 $server.workers) }}
{{- if and (eq $kind "memory") (or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled (gt $workers 1)) }}
{{- fail "config.store.kind: memory keeps budgets per process; with replicaCount > 1, autoscaling or config.server.workers > 1 use store.kind: redis" }}
{{- end }}
{{- if eq $kind "redis" }}
{{- $storeUrl := toString (default "" $store.url) }}
{{- if and (contains "${REDIS_URL}" $storeUrl) (not .Values.redis.bundled.enabled) (not .Values.redis.url) (not .Values.secret.existingSecret) (not (get (default (dict) .Values.secret.env) "REDIS_URL")) }}
{{- fail "redis.url: store.kind is redis; set redis.url, put REDIS_URL in the Secret (secret.env or secret.existingSecret), or set redis.bundled.enabled=true" }}
{{- end }}
{{- end }}
{{- if and (contains "${UPSTREAM_BASE_URL}" (toYaml $config.upstreams)) (not .Values.upstream.baseUrl) }}
{{- fail "upstream.baseUrl: required (the model server's OpenAI-compatible base URL, ending in /v1)" }}
{{- end }}
{{- $shutdown := float64 (default 30 $server.shutdown_timeout_s) }}
{{- $preStop := float64 (default 0 .Values.lifecycle.preStopSleepSeconds) }}
{{- if le (float64 .Values.terminationGracePeriodSeconds) (addf $shutdown $preStop) }}
{{- fail (printf "terminationGracePeriodSeconds: must exceed config.server.shutdown_timeout_s + lifecycle.preStopSleepSeconds (%v)" (addf $shutdown $preStop)) }}
{{- end }}
{{- end }}

{{/* Chart name, truncated to the 63 characters Kubernetes allows in a label. */}}
{{- define "strata.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "strata.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "strata.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "strata.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "strata.selectorLabels" -}}
app.kubernetes.io/name: {{ include "strata.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "strata.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "strata.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: cache-node
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "strata.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "strata.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "strata.secretName" -}}
{{- default (printf "%s-cluster-secret" (include "strata.fullname" .)) .Values.clusterSecret.existingSecret }}
{{- end }}

{{- define "strata.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The name the nodes' shared certificate carries (tls.serverName). */}}
{{- define "strata.tlsServerName" -}}
{{- default (printf "%s.%s.svc" (include "strata.fullname" .) .Release.Namespace) .Values.tls.serverName }}
{{- end }}

{{/* config.tls when the chart mounts the TLS Secret (tls.enabled). */}}
{{- define "strata.tlsConfig" -}}
{{- $dir := "/etc/strata/tls" }}
{{- $tls := dict "cert_file" (printf "%s/tls.crt" $dir) "key_file" (printf "%s/tls.key" $dir) "peer_ca_file" (printf "%s/ca.crt" $dir) "peer_server_name" (include "strata.tlsServerName" .) }}
{{- if .Values.tls.verifyClients }}
{{- $_ := set $tls "client_ca_file" (printf "%s/ca.crt" $dir) }}
{{- $_ := set $tls "require_client_cert" .Values.tls.requireClientCert }}
{{- else if .Values.tls.requireClientCert }}
{{- fail "tls.requireClientCert needs tls.verifyClients" }}
{{- end }}
{{- toYaml $tls }}
{{- end }}

{{/* stratad's config file: the user's config with the chart-owned fields forced. */}}
{{- define "strata.config" -}}
{{- $owned := dict "listen" (printf "0.0.0.0:%d" (int .Values.ports.grpc)) "http_listen" (printf "0.0.0.0:%d" (int .Values.ports.http)) "data_dir" "/var/lib/strata/data" "cluster_secret_file" "/etc/strata/secret/cluster-secret" }}
{{- if .Values.tls.enabled }}
{{- if not .Values.tls.existingSecret }}
{{- fail "tls.enabled needs tls.existingSecret (a Secret with tls.crt, tls.key and ca.crt)" }}
{{- end }}
{{- $_ := set $owned "tls" (include "strata.tlsConfig" . | fromYaml) }}
{{- end }}
{{- $cfg := mustMergeOverwrite (deepCopy .Values.config) $owned }}
{{- toYaml $cfg }}
{{- end }}

{{/*
mpsd.name is the chart's name: the app.kubernetes.io/name of every object
and the DaemonSet's selector.
*/}}
{{- define "mpsd.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
mpsd.fullname names the release's objects: the release's name when it
contains the chart's (helm install mpsd ...: mpsd), else <release>-mpsd.
*/}}
{{- define "mpsd.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
mpsd.selectorLabels select the DaemonSet's pods.
*/}}
{{- define "mpsd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mpsd.name" . }}
{{- end }}

{{/*
mpsd.labels go on every object.
*/}}
{{- define "mpsd.labels" -}}
{{ include "mpsd.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
mpsd.image is the image's reference: image.tag, or the chart's appVersion.
*/}}
{{- define "mpsd.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
mpsd.checkMode refuses every mode but devicePlugin: DRA (issue #36) is not
built.
*/}}
{{- define "mpsd.checkMode" -}}
{{- if ne .Values.mode "devicePlugin" }}
{{- fail (printf "mode %q: mpsd has no such mode; allowed values: devicePlugin (DRA is not built yet)" .Values.mode) }}
{{- end }}
{{- end }}

{{/*
mpsd.metricsPort is the port of config.metrics.listen (host:port).
*/}}
{{- define "mpsd.metricsPort" -}}
{{- $listen := required "config.metrics.listen is needed: the readiness probe and the scrapes use it" (dig "metrics" "listen" "" .Values.config) }}
{{- $port := regexFind "[0-9]+$" $listen }}
{{- if not $port }}
{{- fail (printf "config.metrics.listen %q: want host:port" $listen) }}
{{- end }}
{{- $port }}
{{- end }}

{{/*
mpsd.clusterName names the release's cluster-scoped objects (its
ClusterRole and ClusterRoleBinding): <fullname>-<what>.<namespace>, so
that releases of one name in two namespaces do not claim the same object.
A namespace holds no ".", so no other release's name can end the same.
*/}}
{{- define "mpsd.clusterName" -}}
{{- printf "%s-%s.%s" (include "mpsd.fullname" .top) .what .top.Release.Namespace }}
{{- end }}

{{/*
mpsd.dirs are config's run_dir, state_dir and log_dir (mpsd's defaults
where absent), each mounted from the host at its path; the socket must be
in run_dir.
*/}}
{{- define "mpsd.dirs" -}}
{{- $c := .Values.config }}
{{- $run := get $c "run_dir" | default "/run/mpsd" }}
{{- $socket := get $c "socket" | default "/run/mpsd/mpsd.sock" }}
{{- if ne (dir $socket) $run }}
{{- fail (printf "config.socket %q: the chart mounts run_dir %q from the host, and the socket must be in it" $socket $run) }}
{{- end }}
run: {{ $run }}
state: {{ get $c "state_dir" | default "/var/lib/mpsd" }}
logs: {{ get $c "log_dir" | default "/var/log/mpsd" }}
{{- end }}

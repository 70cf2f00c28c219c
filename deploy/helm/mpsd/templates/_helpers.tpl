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
mpsd.checkPath refuses a value (a list: its name, its path) that is not
an absolute, clean path without control characters, as mpsd's own config
check does: the chart mounts these host paths at the same paths, and
writes them into the DaemonSet and the flags.
*/}}
{{- define "mpsd.checkPath" -}}
{{- $name := index . 0 }}
{{- $p := index . 1 }}
{{- if not (kindIs "string" $p) }}
{{- fail (printf "%s %v: want an absolute path" $name $p) }}
{{- else if regexMatch `[[:cntrl:]]` $p }}
{{- fail (printf "%s %q: a path without control characters (newlines) is needed" $name $p) }}
{{- else if not (isAbs $p) }}
{{- fail (printf "%s %q is not an absolute path" $name $p) }}
{{- else if ne (clean $p) $p }}
{{- fail (printf "%s %q is not a clean path; write %q" $name $p (clean $p)) }}
{{- end }}
{{- end }}

{{/*
mpsd.dirs are config's run_dir, state_dir and log_dir (mpsd's defaults
where absent), as YAML: each mounted from the host at its path. Each must
be an absolute, clean path, none the same as or inside another (mpsd
refuses that config at start), and the socket must be in run_dir.
*/}}
{{- define "mpsd.dirs" -}}
{{- $c := .Values.config }}
{{- $dirs := dict "run" (get $c "run_dir" | default "/run/mpsd") "state" (get $c "state_dir" | default "/var/lib/mpsd") "logs" (get $c "log_dir" | default "/var/log/mpsd") }}
{{- $socket := get $c "socket" | default "/run/mpsd/mpsd.sock" }}
{{- $keys := list (list "config.run_dir" $dirs.run) (list "config.state_dir" $dirs.state) (list "config.log_dir" $dirs.logs) }}
{{- range $keys }}
{{- include "mpsd.checkPath" . }}
{{- end }}
{{- include "mpsd.checkPath" (list "config.socket" $socket) }}
{{- range $i, $a := $keys }}
{{- range $b := slice $keys (add1 $i) }}
{{- $pa := index $a 1 }}
{{- $pb := index $b 1 }}
{{- if or (eq $pa $pb) (hasPrefix (printf "%s/" (trimSuffix "/" $pa)) $pb) (hasPrefix (printf "%s/" (trimSuffix "/" $pb)) $pa) }}
{{- fail (printf "%s %q overlaps %s %q; give each of run_dir, state_dir and log_dir a directory of its own, none inside another" (index $b 0) $pb (index $a 0) $pa) }}
{{- end }}
{{- end }}
{{- end }}
{{- if ne (dir $socket) $dirs.run }}
{{- fail (printf "config.socket %q: the chart mounts run_dir %q from the host, and the socket must be in it" $socket $dirs.run) }}
{{- end }}
{{- toYaml $dirs }}
{{- end }}

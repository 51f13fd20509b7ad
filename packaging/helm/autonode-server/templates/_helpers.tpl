{{/* Helpers shared by the templates. */}}

{{- define "autonode.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: the release's when it already says autonode-server. */}}
{{- define "autonode.fullname" -}}
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

{{- define "autonode.selectorLabels" -}}
app.kubernetes.io/name: {{ include "autonode.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{- define "autonode.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "autonode.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: autonode
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "autonode.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "autonode.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "true" when rendering the server (cluster: management); fails on a
cluster it does not know, so a typo renders nothing silently. */}}
{{- define "autonode.management" -}}
{{- if eq .Values.cluster "management" }}true
{{- else if ne .Values.cluster "guest" }}
{{- fail (printf "cluster must be management or guest, not %q" .Values.cluster) }}
{{- end }}
{{- end }}

{{- define "autonode.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- /* The chart renders the flags of its own release: a server of an
earlier minor release refuses the newer ones and crash-loops, so a tag
naming another minor release than appVersion is refused here (patch
releases add no flags). Roll back with the chart of that release (helm
rollback, or helm upgrade --version). A tag that is no version, or a
digest, is the operator's to match. */}}
{{- $minor := "^v?[0-9]+\\.[0-9]+" }}
{{- if and .Values.image.tag (regexMatch (printf "%s\\.[0-9]+" $minor) .Values.image.tag) }}
{{- $want := regexFind $minor .Chart.AppVersion }}
{{- if ne (trimPrefix "v" (regexFind $minor .Values.image.tag)) $want }}
{{- fail (printf "image.tag %s is not a %s release, and this chart (appVersion %s) renders the flags of its own: a server of another minor release refuses them or lacks them. Use the chart of that release (helm rollback, or helm upgrade --version), or leave image.tag empty (docs/upgrading.md)" .Values.image.tag $want .Chart.AppVersion) }}
{{- end }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The port of a listen address (host:port, [v6]:port). */}}
{{- define "autonode.port" -}}
{{- $parts := splitList ":" . }}
{{- last $parts | int }}
{{- end }}

{{/* Where the chart mounts its Secrets; the serve flags that are null
default to these. */}}
{{- define "autonode.wired" -}}
tls-cert: /etc/autonode/tls/tls.crt
tls-key: /etc/autonode/tls/tls.key
kubeconfig: /etc/autonode/guest/kubeconfig
{{- if .Values.rolloutStateKey.secretName }}
seal-key-file: /etc/autonode/rollout-state-key/key
{{- else }}
seal-key-file: /etc/autonode/seal/seal.key
previous-seal-key-file: /etc/autonode/seal/previous.key
{{- end }}
{{- if .Values.attestation.policy }}
attestation-policy: /etc/autonode/attestation/policy.yaml
{{- end }}
{{- end }}

{{/* One value of `serve` as the flag takes it: lists joined with commas,
whole numbers without an exponent (YAML numbers arrive as floats). */}}
{{- define "autonode.flagValue" -}}
{{- $v := . }}
{{- if kindIs "slice" $v }}
{{- $items := list }}
{{- range $v }}{{ $items = append $items (include "autonode.flagValue" .) }}{{ end }}
{{- join "," $items }}
{{- else if and (kindIs "float64" $v) (eq $v (floor $v)) }}
{{- $v | int64 }}
{{- else }}
{{- $v }}
{{- end }}
{{- end }}

{{/* The container's args: `serve` and one --flag=value per set key. The
flags the chart wires to its mounts get their mount paths when null. */}}
{{- define "autonode.args" -}}
{{- $wired := include "autonode.wired" . | fromYaml -}}
- serve
{{- range $flag, $value := .Values.serve }}
{{- if and (kindIs "invalid" $value) (hasKey $wired $flag) }}
{{- $value = get $wired $flag }}
{{- end }}
{{- if not (or (kindIs "invalid" $value) (and (kindIs "slice" $value) (eq (len $value) 0) (not (has $flag (list "allowed-accounts" "allowed-regions"))))) }}
- {{ printf "--%s=%s" $flag (include "autonode.flagValue" $value) | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of the guest cluster's objects (no selector labels: nothing
selects them). */}}
{{- define "autonode.guestLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "autonode.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: autonode
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* A (Cluster)RoleBinding of the guest ServiceAccount to the role of the
same name: dict with kind, name, namespace (RoleBinding only), subjects,
labels. */}}
{{- define "autonode.guestBinding" }}
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ .kind }}
metadata:
  name: {{ .name }}
  {{- with .namespace }}
  namespace: {{ . }}
  {{- end }}
  labels:
    {{- .labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: {{ trimSuffix "Binding" .kind }}
  name: {{ .name }}
subjects:
  {{- toYaml .subjects | nindent 2 }}
{{- end }}

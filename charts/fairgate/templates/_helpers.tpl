{{/* fairgate's namespace: its code trusts the ServiceAccounts of fairgate-system. */}}
{{- define "fairgate.namespace" -}}fairgate-system{{- end }}

{{/* The fairgate image. */}}
{{- define "fairgate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The URL fairgate's pods reach Redis at (standalone or through the sentinels). */}}
{{- define "fairgate.redisURL" -}}
{{- if eq .Values.redis.mode "sentinel" -}}
redis+sentinel://fairgate-sentinel-0.fairgate-sentinel:26379,fairgate-sentinel-1.fairgate-sentinel:26379,fairgate-sentinel-2.fairgate-sentinel:26379/fairgate/0
{{- else -}}
redis://fairgate-redis:6379/0
{{- end }}
{{- end }}

{{/* Namespaces the webhooks never see: the configured ones and fairgate-system. */}}
{{- define "fairgate.excludedNamespaces" -}}
{{- append .Values.webhook.excludedNamespaces (include "fairgate.namespace" .) | uniq | toJson }}
{{- end }}

{{/* The restricted container securityContext every fairgate container runs with. */}}
{{- define "fairgate.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  capabilities:
    drop: [ALL]
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{/* Checks no JSON schema can express. */}}
{{- define "fairgate.checks" -}}
{{- $p := .Values.priorityClasses -}}
{{- if not (and (gt (int $p.inference) (int $p.training)) (gt (int $p.training) (int $p.borrowed))) -}}
{{- fail (printf "priorityClasses: the order inference > training > borrowed must hold (got %v, %v, %v)" $p.inference $p.training $p.borrowed) -}}
{{- end -}}
{{- if and .Values.namespace.create (eq .Release.Namespace (include "fairgate.namespace" .)) -}}
{{- fail "namespace.create=true needs a release namespace other than fairgate-system (Helm stores the release in its namespace before creating anything): install with -n default, or create fairgate-system first and leave namespace.create false" -}}
{{- end -}}
{{- if and (eq .Values.console.tls.mode "cert-manager") (not .Values.console.tls.certManager.issuerRef.name) -}}
{{- fail "console.tls.mode=cert-manager needs console.tls.certManager.issuerRef.name (an Issuer or ClusterIssuer of cert-manager)" -}}
{{- end -}}
{{- if and .Values.quotas (not .Values.platform.tenants) -}}
{{- fail "quotas are set but platform.tenants is empty: name the tenants the quotas belong to (while platform.tenants is empty the chart renders the example tenants and their quotas)" -}}
{{- end -}}
{{- $t := include "fairgate.tenants" . | fromJson -}}
{{- range $tenant, $_ := $t.quotas -}}
{{- if not (hasKey $t.tenants $tenant) -}}
{{- fail (printf "quotas.%s: no tenant %s in platform.tenants (a quota belongs to a tenant the platform config names)" $tenant $tenant) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The tenants and quotas to render: the values', or the examples while no tenant is set. */}}
{{- define "fairgate.tenants" -}}
{{- if .Values.platform.tenants -}}
{{- dict "tenants" .Values.platform.tenants "quotas" (.Values.quotas | default dict) | toJson -}}
{{- else -}}
{{- .Files.Get "files/example-tenants.yaml" | fromYaml | toJson -}}
{{- end -}}
{{- end }}

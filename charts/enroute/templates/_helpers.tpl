{{/* Names, labels and the shared pieces of every role. */}}

{{- define "enroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "enroute.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "enroute.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "enroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "enroute.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Call with (dict "root" $ "component" "ledger"). */}}
{{- define "enroute.labels" -}}
helm.sh/chart: {{ include "enroute.chart" .root }}
{{ include "enroute.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: enroute
{{- end -}}

{{- define "enroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "enroute.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "enroute.image" -}}
{{- printf "%s-%s:%s" .root.Values.image.repository .component (default .root.Chart.AppVersion .root.Values.image.tag) -}}
{{- end -}}

{{- define "enroute.ledgerService" -}}{{ include "enroute.fullname" . }}-ledger{{- end -}}
{{- define "enroute.computeService" -}}{{ include "enroute.fullname" . }}-compute{{- end -}}
{{- define "enroute.gitprotoService" -}}{{ include "enroute.fullname" . }}-gitproto{{- end -}}
{{- define "enroute.minioService" -}}{{ include "enroute.fullname" . }}-minio{{- end -}}

{{- define "enroute.s3SecretName" -}}
{{- if .Values.store.credentials.existingSecret -}}
{{- .Values.store.credentials.existingSecret -}}
{{- else -}}
{{- include "enroute.fullname" . }}-s3
{{- end -}}
{{- end -}}

{{- define "enroute.tokensSecretName" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecret -}}
{{- else -}}
{{- include "enroute.fullname" . }}-tokens
{{- end -}}
{{- end -}}

{{- define "enroute.hasTokens" -}}
{{- if or .Values.auth.existingSecret .Values.auth.tokens -}}true{{- end -}}
{{- end -}}

{{/* host:port of every ledger voter's gRPC endpoint (StatefulSet pod DNS names). */}}
{{- define "enroute.ledgerMembers" -}}
{{- $svc := include "enroute.ledgerService" . -}}
{{- $members := list -}}
{{- range $i := until (int .Values.ledger.replicas) -}}
{{- $members = append $members (printf "%s-%d.%s.%s.svc.%s:7000" $svc $i $svc $.Release.Namespace $.Values.clusterDomain) -}}
{{- end -}}
{{- toJson $members -}}
{{- end -}}

{{- define "enroute.computeMembers" -}}
{{- $svc := include "enroute.computeService" . -}}
{{- $members := list -}}
{{- range $i := until (int .Values.compute.replicas) -}}
{{- $members = append $members (printf "%s-%d.%s.%s.svc.%s:7100" $svc $i $svc $.Release.Namespace $.Values.clusterDomain) -}}
{{- end -}}
{{- toJson $members -}}
{{- end -}}

{{/* Bytes of a size written as in the config file (10GiB, 500MB, 4096). */}}
{{- define "enroute.bytes" -}}
{{- $s := toString . -}}
{{- $n := int64 (regexFind "^[0-9]+" $s) -}}
{{- $u := lower (trimPrefix (regexFind "^[0-9]+" $s) $s) -}}
{{- $units := dict "" 1 "b" 1 "kib" 1024 "mib" 1048576 "gib" 1073741824 "tib" 1099511627776 "kb" 1000 "mb" 1000000 "gb" 1000000000 "tb" 1000000000000 -}}
{{- mul $n (int64 (get $units $u)) -}}
{{- end -}}

{{/* The store section every role but gitproto reads. */}}
{{- define "enroute.storeConfig" -}}
{{- $opts := deepCopy .Values.store.options -}}
{{- if .Values.minio.enabled -}}
{{- $_ := set $opts "endpoint_url" (printf "http://%s:9000" (include "enroute.minioService" .)) -}}
{{- $_ := set $opts "path_style" true -}}
{{- else if .Values.store.endpoint -}}
{{- $_ := set $opts "endpoint_url" .Values.store.endpoint -}}
{{- end -}}
{{- if .Values.store.region -}}
{{- $_ := set $opts "region" .Values.store.region -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.store.pathStyle) -}}
{{- $_ := set $opts "path_style" .Values.store.pathStyle -}}
{{- end -}}
{{- $url := printf "s3://%s" .Values.store.bucket -}}
{{- if .Values.store.prefix -}}{{- $url = printf "%s/%s" $url (trimAll "/" .Values.store.prefix) -}}{{- end -}}
{{- dict "url" $url "options" $opts | toJson -}}
{{- end -}}

{{- define "enroute.podSecurityContext" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end -}}

{{- define "enroute.containerSecurityContext" -}}
{{ toYaml .Values.securityContext }}
{{- end -}}

{{/* Env of the roles that talk to the store: S3 credentials from the Secret. */}}
{{- define "enroute.s3Env" -}}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ include "enroute.s3SecretName" . }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "enroute.s3SecretName" . }}
      key: AWS_SECRET_ACCESS_KEY
{{- end -}}

{{- define "enroute.antiAffinity" -}}
{{- $sel := include "enroute.selectorLabels" . | fromYaml -}}
podAntiAffinity:
{{- if eq .mode "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- toYaml $sel | nindent 10 }}
{{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- toYaml $sel | nindent 12 }}
{{- end }}
{{- end -}}

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
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Metadata of a role's workload or Service: the chart's labels, then the user's
     (call with (dict "root" $ "component" "ledger" "labels" .. "annotations" ..)). */}}
{{- define "enroute.metadata" -}}
labels:
  {{- include "enroute.labels" . | nindent 2 }}
  {{- with .labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Scheduling of a role's pods (call with (dict "root" $ "component" "ledger" "role" .Values.ledger "antiAffinity" "soft")):
     the user's affinity, with the chart's pod anti-affinity unless it sets its own; topology
     spread constraints select the role's pods unless they name a labelSelector. */}}
{{- define "enroute.scheduling" -}}
{{- $affinity := deepCopy (.role.affinity | default dict) -}}
{{- if not (hasKey $affinity "podAntiAffinity") -}}
{{- $_ := set $affinity "podAntiAffinity" (get (include "enroute.antiAffinity" (dict "root" .root "component" .component "mode" .antiAffinity) | fromYaml) "podAntiAffinity") -}}
{{- end -}}
affinity:
  {{- toYaml $affinity | nindent 2 }}
{{- with .role.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .role.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .role.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- if .role.topologySpreadConstraints }}
{{- $sel := include "enroute.selectorLabels" . | fromYaml }}
{{- $constraints := list }}
{{- range .role.topologySpreadConstraints }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}{{ $_ := set $c "labelSelector" (dict "matchLabels" $sel) }}{{ end }}
{{- $constraints = append $constraints $c }}
{{- end }}
topologySpreadConstraints:
  {{- toYaml $constraints | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "enroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "enroute.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* <repository>-<role>:<tag>, pinned as <repository>-<role>:<tag>@<digest> when
     image.digests.<role> is set (the tag then only names it for people). */}}
{{- define "enroute.image" -}}
{{- $image := printf "%s-%s:%s" .root.Values.image.repository .component (default .root.Chart.AppVersion .root.Values.image.tag) -}}
{{- with get (.root.Values.image.digests | default dict) .component -}}
{{- $image = printf "%s@%s" $image . -}}
{{- end -}}
{{- $image -}}
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

{{/* The Secret holding the internal token (auth.internalToken; secrets.yaml). */}}
{{- define "enroute.internalTokenSecretName" -}}
{{- .Values.auth.internalToken.existingSecret | default (printf "%s-internal-token" (include "enroute.fullname" .)) -}}
{{- end -}}

{{/* Mount and volume of the internal token, at /etc/enroute-internal/token in every role. */}}
{{- define "enroute.internalTokenMount" -}}
- name: internal-token
  mountPath: /etc/enroute-internal
  readOnly: true
{{- end -}}
{{- define "enroute.internalTokenVolume" -}}
- name: internal-token
  secret:
    secretName: {{ include "enroute.internalTokenSecretName" . }}
    items:
      - key: {{ .Values.auth.internalToken.key }}
        path: token
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

{{/* gitproto.ingress.hosts[] (host, paths[{path, pathType}]) as JSON; when empty, the
     single `host` of earlier values, served at /. */}}
{{- define "enroute.ingressHosts" -}}
{{- $ing := .Values.gitproto.ingress -}}
{{- $hosts := $ing.hosts -}}
{{- if not $hosts }}{{ $hosts = list (dict "host" $ing.host "paths" (list (dict "path" "/" "pathType" "Prefix"))) }}{{ end -}}
{{- toJson $hosts -}}
{{- end -}}

{{/* gitproto.ingress.tls[] ({secretName, hosts}) as JSON; the earlier object form
     {enabled, secretName} means one entry (default secret <fullname>-tls) for every host. */}}
{{- define "enroute.ingressTLS" -}}
{{- $tls := .Values.gitproto.ingress.tls -}}
{{- if kindIs "map" $tls -}}
{{- $legacy := $tls -}}
{{- $tls = list -}}
{{- if $legacy.enabled -}}
{{- $names := list -}}
{{- range (include "enroute.ingressHosts" . | fromJsonArray) }}{{ $names = append $names .host }}{{ end -}}
{{- $tls = list (dict "secretName" (default (printf "%s-tls" (include "enroute.fullname" .)) $legacy.secretName) "hosts" $names) -}}
{{- end -}}
{{- end -}}
{{- toJson ($tls | default list) -}}
{{- end -}}

{{/* A role's pod count for the install notes (call with .Values.compute or .Values.gitproto). */}}
{{- define "enroute.replicaCount" -}}
{{- if .autoscaling.enabled }}{{ .autoscaling.minReplicas }} to {{ .autoscaling.maxReplicas }} (autoscaled){{ else }}{{ .replicas }}{{ end -}}
{{- end -}}

{{/* Drain periods (docs/reliability.md, "Graceful drain"): what the pod's
     terminationGracePeriodSeconds leaves after its preStop hook and 5 s to exit, unless
     the role's drainGrace is given. The kubelet counts the grace from the hook's start. */}}
{{- define "enroute.computeDrainGrace" -}}
{{- $c := .Values.compute -}}
{{- if not (eq (toString $c.drainGrace) "") }}{{ $c.drainGrace }}{{ else -}}
{{- $grace := sub (int $c.terminationGracePeriodSeconds) 5 -}}
{{- if lt $grace 1 }}{{ fail "compute.terminationGracePeriodSeconds must exceed 5 (5 s to exit after compute.drain_grace)" }}{{ end -}}
{{- printf "%ds" $grace -}}
{{- end -}}
{{- end -}}

{{- define "enroute.ledgerDrainGrace" -}}
{{- $l := .Values.ledger -}}
{{- if not (eq (toString $l.drainGrace) "") }}{{ $l.drainGrace }}{{ else -}}
{{- $hook := 0 }}{{ if $l.transferLeadershipTimeout }}{{ $hook = add $l.transferLeadershipTimeout 5 }}{{ end -}}
{{- $grace := sub (sub (int $l.terminationGracePeriodSeconds) $hook) 5 -}}
{{- if lt $grace 1 }}{{ fail (printf "ledger.terminationGracePeriodSeconds must exceed the preStop hook's %d s + 5 s to exit" (int $hook)) }}{{ end -}}
{{- printf "%ds" $grace -}}
{{- end -}}
{{- end -}}

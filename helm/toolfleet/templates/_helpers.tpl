{{/* The chart's name, cut to a DNS label. */}}
{{- define "toolfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the prefix of every resource. */}}
{{- define "toolfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels every resource carries. */}}
{{- define "toolfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "toolfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: toolfleet
{{- end }}

{{/* Selector labels of one component (call with dict "root" $ "component" "planner"). */}}
{{- define "toolfleet.selector" -}}
app.kubernetes.io/name: {{ include "toolfleet.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "toolfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "toolfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The ServiceAccount of the pre-install/pre-upgrade hooks (the topics Job): a hook of its
     own when the chart creates ServiceAccounts (see serviceaccount.yaml). */}}
{{- define "toolfleet.hookServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- printf "%s-topics" (include "toolfleet.fullname" .) }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "toolfleet.image" -}}
{{- $image := .image | default dict -}}
{{- $repository := $image.repository | default .root.Values.image.repository -}}
{{- $tag := $image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s" $repository $tag }}
{{- end }}

{{/* Environment shared by every container. */}}
{{- define "toolfleet.env" -}}
- name: KAFKA_BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
- name: TOOLFLEET_KAFKA_SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
- name: TOOLFLEET_KAFKA_SASL_MECHANISM
  value: {{ .Values.kafka.saslMechanism | quote }}
{{- with .Values.kafka.tls }}
{{- if .secret }}
- name: TOOLFLEET_KAFKA_SSL_CAFILE
  value: "/etc/toolfleet/kafka-tls/{{ .caKey }}"
{{- if .certKey }}
- name: TOOLFLEET_KAFKA_SSL_CERTFILE
  value: "/etc/toolfleet/kafka-tls/{{ .certKey }}"
- name: TOOLFLEET_KAFKA_SSL_KEYFILE
  value: "/etc/toolfleet/kafka-tls/{{ .keyKey }}"
{{- end }}
{{- end }}
- name: TOOLFLEET_KAFKA_SSL_CHECK_HOSTNAME
  value: {{ .checkHostname | quote }}
{{- end }}
{{- if not .Values.redis.urlSecret }}
- name: REDIS_URL
  value: {{ .Values.redis.url | quote }}
{{- end }}
{{- with .Values.redis.tls }}
{{- if .secret }}
- name: TOOLFLEET_REDIS_TLS_CA_CERTS
  value: "/etc/toolfleet/redis-tls/{{ .caKey }}"
{{- if .certKey }}
- name: TOOLFLEET_REDIS_TLS_CERTFILE
  value: "/etc/toolfleet/redis-tls/{{ .certKey }}"
- name: TOOLFLEET_REDIS_TLS_KEYFILE
  value: "/etc/toolfleet/redis-tls/{{ .keyKey }}"
{{- end }}
{{- end }}
{{- end }}
- name: TOOLFLEET_REDIS_WAIT_REPLICAS
  value: {{ .Values.redis.waitReplicas | quote }}
- name: TOOLFLEET_TOPIC_PREFIX
  value: {{ .Values.topics.prefix | quote }}
- name: TOOLFLEET_PARTITIONS
  value: {{ .Values.topics.partitions | quote }}
- name: TOOLFLEET_REPLICATION_FACTOR
  value: {{ .Values.topics.replicationFactor | quote }}
- name: TOOLFLEET_TOPICS_AUTO_CREATE
  value: {{ .Values.topics.autoCreate | quote }}
- name: TOOLFLEET_LEDGER_RETENTION_S
  value: {{ .Values.ledgerRetentionSeconds | quote }}
- name: TOOLFLEET_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: TOOLFLEET_METRICS_TOOL_LABEL
  value: {{ .Values.metrics.toolLabel | quote }}
- name: TOOLFLEET_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: TOOLFLEET_TRACES
  value: {{ .Values.tracing.exporter | quote }}
{{- if eq .Values.tracing.exporter "otlp" }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ required "tracing.otlpEndpoint is required with tracing.exporter=otlp" .Values.tracing.otlpEndpoint | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .Values.tracing.sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .Values.tracing.samplerArg | quote }}
{{- end }}
# The root filesystem is read-only: state (dead-letter overflow files) goes to /tmp.
- name: HOME
  value: /tmp
- name: XDG_STATE_HOME
  value: /tmp/state
- name: XDG_CACHE_HOME
  value: /tmp/cache
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "toolfleet.envFrom" -}}
{{- if .Values.kafka.credentialsSecret }}
- secretRef:
    name: {{ .Values.kafka.credentialsSecret }}
{{- end }}
{{- if .Values.redis.urlSecret }}
- secretRef:
    name: {{ .Values.redis.urlSecret }}
{{- end }}
{{- with .Values.envFrom }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "toolfleet.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.kafka.tls.secret }}
- name: kafka-tls
  mountPath: /etc/toolfleet/kafka-tls
  readOnly: true
{{- end }}
{{- if .Values.redis.tls.secret }}
- name: redis-tls
  mountPath: /etc/toolfleet/redis-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "toolfleet.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.kafka.tls.secret }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.secret }}
{{- end }}
{{- if .Values.redis.tls.secret }}
- name: redis-tls
  secret:
    secretName: {{ .Values.redis.tls.secret }}
{{- end }}
{{- end }}

{{/* The pod spec of one component: call with dict "root" $ "component" name "args" list
     "resources" map "image" map, "serviceAccount" name to run as another than the
     release's, and "oneShot" true for a command that serves no /livez (a Job that may run
     for minutes: no probes to restart it). */}}
{{- define "toolfleet.podSpec" -}}
{{- $root := .root -}}
serviceAccountName: {{ .serviceAccount | default (include "toolfleet.serviceAccountName" $root) }}
automountServiceAccountToken: {{ $root.Values.serviceAccount.automountToken }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ $root.Values.terminationGracePeriodSeconds }}
{{- if $root.Values.topologySpread }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "toolfleet.selector" (dict "root" $root "component" .component) | nindent 8 }}
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "toolfleet.selector" (dict "root" $root "component" .component) | nindent 8 }}
{{- end }}
{{- with $root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: {{ .container | default .component }}
    image: {{ include "toolfleet.image" (dict "root" $root "image" .image) | quote }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    args:
      {{- toYaml .args | nindent 6 }}
    env:
      {{- include "toolfleet.env" $root | nindent 6 }}
    {{- $envFrom := include "toolfleet.envFrom" $root | trim }}
    {{- if $envFrom }}
    envFrom:
      {{- $envFrom | nindent 6 }}
    {{- end }}
    {{- if not .oneShot }}
    ports:
      - name: metrics
        containerPort: {{ $root.Values.metrics.port }}
    startupProbe:
      httpGet: {path: /livez, port: metrics}
      periodSeconds: 2
      failureThreshold: 60
    livenessProbe:
      httpGet: {path: /livez, port: metrics}
      periodSeconds: 10
      timeoutSeconds: 3
      failureThreshold: 3
    readinessProbe:
      httpGet: {path: /readyz, port: metrics}
      periodSeconds: 5
      timeoutSeconds: 3
      failureThreshold: 2
    {{- end }}
    resources:
      {{- toYaml (.resources | default dict) | nindent 6 }}
    securityContext:
      {{- toYaml $root.Values.securityContext | nindent 6 }}
    volumeMounts:
      {{- include "toolfleet.volumeMounts" $root | nindent 6 }}
volumes:
  {{- include "toolfleet.volumes" $root | nindent 2 }}
{{- end }}

{{/* A pool's Kubernetes name part (the schema allows only lowercase DNS labels). */}}
{{- define "toolfleet.poolName" -}}
{{- printf "worker-%s" . }}
{{- end }}

{{/* The label matchers of the alerts: this release's scrape targets (the chart's
     ServiceMonitor names its job after the metrics Service), unless prometheusRule.selector
     says how they are scraped. */}}
{{- define "toolfleet.alertSelector" -}}
{{- $default := printf "job=%q, namespace=%q" (printf "%s-metrics" (include "toolfleet.fullname" .)) .Release.Namespace -}}
{{- .Values.prometheusRule.selector | default $default -}}
{{- end }}

{{/* A secret's env var from {existingSecret, key} (call with list NAME REF). */}}
{{- define "toolfleet.secretEnv" -}}
{{- $name := index . 0 }}{{- $ref := index . 1 -}}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.existingSecret }}
      key: {{ required (printf "the key of %s's Secret" $name) $ref.key }}
{{- end }}

{{/* The console's access settings (console.auth) as TOOLFLEET_CONSOLE_* environment. */}}
{{- define "toolfleet.consoleAuthEnv" -}}
{{- $c := .Values.console -}}
{{- $auth := $c.auth -}}
{{- with $c.publicUrl }}
- name: TOOLFLEET_CONSOLE_PUBLIC_URL
  value: {{ . | quote }}
{{- end }}
{{- with $auth.oidc }}
{{- if .issuer }}
- name: TOOLFLEET_CONSOLE_OIDC_ISSUER
  value: {{ .issuer | quote }}
- name: TOOLFLEET_CONSOLE_OIDC_CLIENT_ID
  value: {{ .clientId | quote }}
- name: TOOLFLEET_CONSOLE_OIDC_SCOPES
  value: {{ .scopes | quote }}
- name: TOOLFLEET_CONSOLE_OIDC_ROLES_CLAIM
  value: {{ .rolesClaim | quote }}
- name: TOOLFLEET_CONSOLE_OIDC_TENANTS_CLAIM
  value: {{ .tenantsClaim | quote }}
{{- if .clientSecret.existingSecret }}
{{ include "toolfleet.secretEnv" (list "TOOLFLEET_CONSOLE_OIDC_CLIENT_SECRET" .clientSecret) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $auth.sessionSecret.existingSecret }}
{{ include "toolfleet.secretEnv" (list "TOOLFLEET_CONSOLE_SESSION_SECRET" $auth.sessionSecret) }}
{{- end }}
{{- if $auth.tokens.existingSecret }}
{{ include "toolfleet.secretEnv" (list "TOOLFLEET_CONSOLE_TOKENS" $auth.tokens) }}
{{- end }}
{{- with $auth.proxy }}
{{- if .secret.existingSecret }}
{{ include "toolfleet.secretEnv" (list "TOOLFLEET_CONSOLE_PROXY_SECRET" .secret) }}
- name: TOOLFLEET_CONSOLE_PROXY_SECRET_HEADER
  value: {{ .secretHeader | quote }}
- name: TOOLFLEET_CONSOLE_PROXY_USER_HEADER
  value: {{ .userHeader | quote }}
- name: TOOLFLEET_CONSOLE_PROXY_ROLES_HEADER
  value: {{ .rolesHeader | quote }}
- name: TOOLFLEET_CONSOLE_PROXY_TENANTS_HEADER
  value: {{ .tenantsHeader | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The console's access, checked again at render time (the values schema says the same;
     this holds with --skip-schema-validation too). */}}
{{- define "toolfleet.consoleAuthCheck" -}}
{{- $auth := .Values.console.auth -}}
{{- $oidc := $auth.oidc.issuer -}}
{{- if not (or $oidc $auth.tokens.existingSecret $auth.proxy.secret.existingSecret) }}
{{- fail "console.auth: the console is enabled with no way to sign in, and it admits no anonymous access: set console.auth.oidc.issuer (OpenID Connect), console.auth.tokens.existingSecret (static API tokens) or console.auth.proxy.secret.existingSecret (a trusted proxy)" }}
{{- end }}
{{- if and $oidc (not $auth.oidc.clientId) }}
{{- fail "console.auth.oidc.clientId: OpenID Connect login needs the console's client id at the issuer" }}
{{- end }}
{{- if and $oidc (not $auth.sessionSecret.existingSecret) }}
{{- fail "console.auth.sessionSecret.existingSecret: OpenID Connect login needs a Secret with a long random string that signs the session cookie" }}
{{- end }}
{{- end }}

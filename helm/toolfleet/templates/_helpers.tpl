{{- define "toolfleet.env" -}}
- name: KAFKA_BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
- name: REDIS_URL
  value: {{ .Values.redis.url | quote }}
- name: TOOLFLEET_TOPIC_PREFIX
  value: {{ .Values.topicPrefix | quote }}
- name: TOOLFLEET_METRICS_PORT
  value: {{ .Values.metricsPort | quote }}
- name: TOOLFLEET_LEDGER_RETENTION_S
  value: {{ .Values.ledgerRetentionSeconds | quote }}
{{- end -}}

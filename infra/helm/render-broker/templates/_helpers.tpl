{{/* Labels shared by every object of the release. */}}
{{- define "render-broker.labels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: render-broker
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The Secret holding the tokens, the HMAC key, the TURN secret and the database URL. */}}
{{- define "render-broker.secretName" -}}
{{- if .Values.secrets.existingSecret -}}
{{ .Values.secrets.existingSecret }}
{{- else -}}
{{ .Release.Name }}-secrets
{{- end -}}
{{- end }}

{{/* Where clients and nodes reach coturn. */}}
{{- define "render-broker.turnHost" -}}
{{- if .Values.turn.publicHost -}}
{{ .Values.turn.publicHost }}
{{- else -}}
{{ .Release.Name }}-turn.{{ .Release.Namespace }}.svc
{{- end -}}
{{- end }}

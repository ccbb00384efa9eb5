{{/*
Shared helpers. A service is named by its values key (optimizer, evaluator, traceStore,
rewardJudge, society, trainer); "flywheel.catalog" says what each one needs.
*/}}

{{- define "flywheel.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "flywheel.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "flywheel.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "flywheel.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The services: resource name, Python module, env prefix, NATS role, what they connect to,
whether they have migrations, and the gRPC clients they hold (link -> values key). */}}
{{- define "flywheel.catalog" -}}
optimizer:
  name: optimizer
  module: optimizer
  prefix: FLYWHEEL_OPTIMIZER_
  role: optimizer
  nats: true
  db: true
  s3: true
  llm: ""
  migrate: true
  runPolicy: true
  links: {}
evaluator:
  name: evaluator
  module: evaluator
  prefix: FLYWHEEL_EVALUATOR_
  role: evaluator
  nats: true
  db: false
  s3: false
  llm: ""
  migrate: false
  runPolicy: true
  links: {judge: rewardJudge}
traceStore:
  name: trace-store
  module: trace_store
  prefix: FLYWHEEL_TRACE_STORE_
  role: trace_store
  nats: true
  db: true
  s3: true
  llm: ""
  migrate: true
  runPolicy: false
  links: {}
rewardJudge:
  name: reward-judge
  module: reward_judge
  prefix: FLYWHEEL_REWARD_JUDGE_
  role: reward_judge
  nats: false
  db: true
  s3: true
  llm: own
  migrate: true
  runPolicy: false
  links: {}
society:
  name: society
  module: society
  prefix: FLYWHEEL_SOCIETY_
  role: society
  nats: true
  db: true
  s3: true
  llm: shared
  migrate: true
  runPolicy: false
  links: {optimizer: optimizer, judge: rewardJudge, trainer: trainer}
trainer:
  name: trainer
  module: trainer
  prefix: FLYWHEEL_TRAINER_
  role: trainer
  nats: true
  db: true
  s3: true
  llm: ""
  migrate: true
  runPolicy: true
  links: {judge: rewardJudge, optimizer: optimizer}
{{- end -}}

{{- define "flywheel.svc" -}}
{{- $cat := include "flywheel.catalog" . | fromYaml -}}
{{- toYaml $cat -}}
{{- end -}}

{{- define "flywheel.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: flywheel
{{ include "flywheel.selectorLabels" . }}
{{- end -}}

{{- define "flywheel.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flywheel.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "flywheel.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "flywheel.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* image: {root, image} -> registry/repository:tag or @digest */}}
{{- define "flywheel.image" -}}
{{- $img := .image -}}
{{- $repo := $img.repository -}}
{{- if .root.Values.image.registry -}}{{- $repo = printf "%s/%s" .root.Values.image.registry $img.repository -}}{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default (default .root.Chart.AppVersion .root.Values.image.tag) $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* The chart's own Secret (inline credentials only). */}}
{{- define "flywheel.secretName" -}}
{{- printf "%s-credentials" (include "flywheel.fullname" .) -}}
{{- end -}}

{{/* secretKeyRef of one credential: {root, what, role?} -> "name: …\nkey: …", or "" when not
configured. what: nats (needs role), database, s3-access, s3-secret, grpc-token, llm-key. */}}
{{- define "flywheel.secretKeyRef" -}}
{{- $v := .root.Values -}}
{{- $own := include "flywheel.secretName" .root -}}
{{- if eq .what "nats" -}}
  {{- if $v.nats.auth.existingSecret -}}
name: {{ $v.nats.auth.existingSecret }}
key: {{ printf "%s-password" .role }}
  {{- else if hasKey $v.nats.auth.passwords .role -}}
name: {{ $own }}
key: {{ printf "nats-%s-password" .role }}
  {{- end -}}
{{- else if eq .what "database" -}}
  {{- if $v.database.existingSecret -}}
name: {{ $v.database.existingSecret }}
key: {{ $v.database.existingSecretKey }}
  {{- else if $v.database.url -}}
name: {{ $own }}
key: database-url
  {{- end -}}
{{- else if or (eq .what "s3-access") (eq .what "s3-secret") -}}
  {{- $key := ternary "access-key" "secret-key" (eq .what "s3-access") -}}
  {{- if $v.s3.existingSecret -}}
name: {{ $v.s3.existingSecret }}
key: {{ $key }}
  {{- else if and $v.s3.accessKey $v.s3.secretKey -}}
name: {{ $own }}
key: {{ printf "s3-%s" $key }}
  {{- end -}}
{{- else if eq .what "grpc-token" -}}
  {{- if $v.grpc.auth.existingSecret -}}
name: {{ $v.grpc.auth.existingSecret }}
key: token
  {{- else if $v.grpc.auth.token -}}
name: {{ $own }}
key: grpc-auth-token
  {{- end -}}
{{- else if eq .what "llm-key" -}}
  {{- if $v.llm.existingSecret -}}
name: {{ $v.llm.existingSecret }}
key: api-key
  {{- else if $v.llm.apiKey -}}
name: {{ $own }}
key: llm-api-key
  {{- end -}}
{{- else -}}
{{- fail (printf "flywheel.secretKeyRef: unknown credential %q" .what) -}}
{{- end -}}
{{- end -}}

{{/* One env entry from a Secret; "required" fails rendering with the values to set. */}}
{{- define "flywheel.secretEnvEntry" -}}
{{- $ref := include "flywheel.secretKeyRef" . -}}
{{- if $ref }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      {{- $ref | nindent 6 }}
{{- else if .required -}}
{{- fail (printf "%s needs a credential: set %s" .env .hint) -}}
{{- end -}}
{{- end -}}

{{- define "flywheel.tlsDir" -}}/etc/flywheel/grpc-tls{{- end -}}

{{/* The plain (non-secret) settings of one service as a map of env vars:
{root, key}. Rendered into the service's ConfigMap and inline into its hook Jobs. */}}
{{- define "flywheel.configEnv" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $s := index (include "flywheel.svc" $root | fromYaml) .key -}}
{{- $vals := index $v .key -}}
{{- $p := $s.prefix -}}
{{- $full := include "flywheel.fullname" $root -}}
{{- $tls := $v.grpc.tls.enabled -}}
{{- $token := include "flywheel.secretKeyRef" (dict "root" $root "what" "grpc-token") -}}
# A writable home (the root filesystem is read-only): caches go under /tmp.
HOME: "/tmp"
{{ $p }}GRPC_HOST: "0.0.0.0"
{{ $p }}GRPC_PORT: {{ $vals.grpcPort | quote }}
{{ $p }}METRICS_HOST: "0.0.0.0"
{{ $p }}METRICS_PORT: {{ $v.metrics.port | quote }}
{{ $p }}LOG_LEVEL: {{ $v.logLevel | quote }}
{{ $p }}LOG_FORMAT: "json"
{{ $p }}SHUTDOWN_GRACE_S: {{ $v.shutdownGraceSeconds | quote }}
{{- if $tls }}
{{ $p }}TLS_CERT_FILE: {{ printf "%s/tls.crt" (include "flywheel.tlsDir" .) | quote }}
{{ $p }}TLS_KEY_FILE: {{ printf "%s/tls.key" (include "flywheel.tlsDir" .) | quote }}
{{- if $v.grpc.tls.mtls }}
{{ $p }}TLS_CLIENT_CA_FILE: {{ printf "%s/ca.crt" (include "flywheel.tlsDir" .) | quote }}
{{- end }}
{{- end }}
{{- if and (not $tls) (not $token) }}
{{- if not $v.grpc.allowInsecure }}
{{- fail "grpc: set grpc.auth.token (or grpc.auth.existingSecret), or grpc.tls.enabled, or grpc.allowInsecure=true to serve gRPC open" }}
{{- end }}
{{ $p }}ALLOW_INSECURE: "true"
{{- end }}
{{- if $s.nats }}
FLYWHEEL_NATS_URL: {{ $v.nats.url | quote }}
FLYWHEEL_NATS_NAMESPACE: {{ $v.nats.namespace | quote }}
FLYWHEEL_NATS_USER: {{ $s.role | quote }}
{{- if $v.nats.tls.caSecret }}
FLYWHEEL_NATS_TLS_CA_FILE: {{ printf "/etc/flywheel/nats-ca/%s" $v.nats.tls.caKey | quote }}
{{- end }}
{{- end }}
{{- if $s.db }}
FLYWHEEL_DB_SCHEMA: {{ $v.database.schema | quote }}
{{- if $v.database.tls.caSecret }}
# asyncpg verifies the server against this CA (with ssl=verify-full in the URL).
PGSSLROOTCERT: {{ printf "/etc/flywheel/db-ca/%s" $v.database.tls.caKey | quote }}
{{- end }}
{{- end }}
{{- if $s.s3 }}
FLYWHEEL_S3_ENDPOINT: {{ $v.s3.endpoint | quote }}
FLYWHEEL_S3_SECURE: {{ $v.s3.secure | quote }}
FLYWHEEL_S3_CERT_CHECK: {{ $v.s3.certCheck | quote }}
FLYWHEEL_S3_REGION: {{ $v.s3.region | quote }}
FLYWHEEL_S3_BUCKET_PREFIX: {{ $v.s3.bucketPrefix | quote }}
{{- if $v.s3.tls.caSecret }}
FLYWHEEL_S3_CA_FILE: {{ printf "/etc/flywheel/s3-ca/%s" $v.s3.tls.caKey | quote }}
{{- end }}
{{- end }}
{{- if eq $s.llm "shared" }}
FLYWHEEL_LLM_MODEL: {{ $v.llm.model | quote }}
{{- if $v.llm.apiBase }}
FLYWHEEL_LLM_API_BASE: {{ $v.llm.apiBase | quote }}
{{- end }}
{{- else if eq $s.llm "own" }}
{{ $p }}LLM_MODEL: {{ $v.llm.model | quote }}
{{- if $v.llm.apiBase }}
{{ $p }}LLM_API_BASE: {{ $v.llm.apiBase | quote }}
{{- end }}
{{- end }}
{{- range $link, $target := $s.links }}
{{- if (index $v $target).enabled }}
{{- $t := index (include "flywheel.svc" $root | fromYaml) $target }}
{{- $L := printf "%s%s_" $p (upper $link) }}
{{ $L }}ADDRESS: {{ printf "%s-%s:%v" $full $t.name (index $v $target).grpcPort | quote }}
{{- if $tls }}
{{ $L }}TLS: "true"
{{ $L }}TLS_CA_FILE: {{ printf "%s/ca.crt" (include "flywheel.tlsDir" $) | quote }}
{{ $L }}TLS_SERVER_NAME: {{ printf "%s-%s" $full $t.name | quote }}
{{- if $v.grpc.tls.mtls }}
{{ $L }}TLS_CERT_FILE: {{ printf "%s/tls.crt" (include "flywheel.tlsDir" $) | quote }}
{{ $L }}TLS_KEY_FILE: {{ printf "%s/tls.key" (include "flywheel.tlsDir" $) | quote }}
{{- end }}
{{- else if $token }}
{{ $L }}ALLOW_INSECURE: "true"
{{- end }}
{{- end }}
{{- end }}
{{- if and $v.modelserver.enabled (has .key (list "society" "trainer")) (not (hasKey $vals.config "modelserver_url")) }}
{{ $p }}MODELSERVER_URL: {{ printf "http://%s-modelserver:%v" $full $v.modelserver.port | quote }}
{{- end }}
{{- if eq .key "trainer" }}
{{ $p }}WORK_DIR: "/var/lib/flywheel/trainer"
{{ $p }}MODEL_ROOTS: '["/var/lib/flywheel/models"]'
{{ $p }}RUN_JOBS: "false"
{{- end }}
{{- if $s.runPolicy }}
{{- range $k, $val := $v.runPolicy }}
{{ printf "FLYWHEEL_RUN_POLICY_%s" (upper $k) }}: {{ $val | toString | quote }}
{{- end }}
{{- end }}
{{- range $k, $val := $vals.config }}
{{ printf "%s%s" $p (upper $k) }}: {{ if kindIs "slice" $val }}{{ $val | toJson | quote }}{{ else if kindIs "map" $val }}{{ $val | toJson | quote }}{{ else }}{{ $val | toString | quote }}{{ end }}
{{- end }}
{{- end -}}

{{/* Env entries from Secrets for one service: {root, key}. */}}
{{- define "flywheel.secretEnv" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $s := index (include "flywheel.svc" $root | fromYaml) .key -}}
{{- $p := $s.prefix -}}
{{- if $s.nats }}
{{- include "flywheel.secretEnvEntry" (dict "root" $root "what" "nats" "role" $s.role "env" "FLYWHEEL_NATS_PASSWORD" "required" true "hint" (printf "nats.auth.passwords.%s or nats.auth.existingSecret (key %s-password)" $s.role $s.role)) }}
{{- end }}
{{- if $s.db }}
{{- include "flywheel.secretEnvEntry" (dict "root" $root "what" "database" "env" "FLYWHEEL_DB_URL" "required" true "hint" "database.url or database.existingSecret") }}
{{- end }}
{{- if $s.s3 }}
{{- include "flywheel.secretEnvEntry" (dict "root" $root "what" "s3-access" "env" "FLYWHEEL_S3_ACCESS_KEY" "required" true "hint" "s3.accessKey and s3.secretKey, or s3.existingSecret") }}
{{- include "flywheel.secretEnvEntry" (dict "root" $root "what" "s3-secret" "env" "FLYWHEEL_S3_SECRET_KEY" "required" true "hint" "s3.accessKey and s3.secretKey, or s3.existingSecret") }}
{{- end }}
{{- include "flywheel.secretEnvEntry" (dict "root" $root "what" "grpc-token" "env" (printf "%sAUTH_TOKEN" $p)) }}
{{- range $link, $target := $s.links }}
{{- if (index $v $target).enabled }}
{{- include "flywheel.secretEnvEntry" (dict "root" $root "what" "grpc-token" "env" (printf "%s%s_AUTH_TOKEN" $p (upper $link))) }}
{{- end }}
{{- end }}
{{- if eq $s.llm "shared" }}
{{- include "flywheel.secretEnvEntry" (dict "root" $root "what" "llm-key" "env" "FLYWHEEL_LLM_API_KEY") }}
{{- else if eq $s.llm "own" }}
{{- include "flywheel.secretEnvEntry" (dict "root" $root "what" "llm-key" "env" (printf "%sLLM_API_KEY" $p)) }}
{{- end }}
{{- if and $v.modelserver.enabled (has .key (list "society" "trainer")) }}
{{- include "flywheel.secretEnvEntry" (dict "root" $root "what" "llm-key" "env" (printf "%sMODELSERVER_API_KEY" $p)) }}
{{- end }}
{{- end -}}

{{/* Volumes every service pod mounts: a writable /tmp and the TLS material in use. */}}
{{- define "flywheel.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- if .Values.grpc.tls.enabled }}
- name: grpc-tls
  secret:
    secretName: {{ required "grpc.tls.existingSecret: name the kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt)" .Values.grpc.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- if .Values.nats.tls.caSecret }}
- name: nats-ca
  secret:
    secretName: {{ .Values.nats.tls.caSecret }}
    defaultMode: 0440
{{- end }}
{{- if .Values.database.tls.caSecret }}
- name: db-ca
  secret:
    secretName: {{ .Values.database.tls.caSecret }}
    defaultMode: 0440
{{- end }}
{{- if .Values.s3.tls.caSecret }}
- name: s3-ca
  secret:
    secretName: {{ .Values.s3.tls.caSecret }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "flywheel.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.grpc.tls.enabled }}
- name: grpc-tls
  mountPath: {{ include "flywheel.tlsDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.nats.tls.caSecret }}
- name: nats-ca
  mountPath: /etc/flywheel/nats-ca
  readOnly: true
{{- end }}
{{- if .Values.database.tls.caSecret }}
- name: db-ca
  mountPath: /etc/flywheel/db-ca
  readOnly: true
{{- end }}
{{- if .Values.s3.tls.caSecret }}
- name: s3-ca
  mountPath: /etc/flywheel/s3-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* A gRPC health check: kubelet's native gRPC probe, or, with TLS (which kubelet's probe
cannot speak), the same standard health Check run in the container over TLS. {root, port, name} */}}
{{- define "flywheel.grpcCheck" -}}
{{- if .root.Values.grpc.tls.enabled -}}
{{- $d := include "flywheel.tlsDir" .root -}}
{{- $client := ternary (printf "r('%s/tls.key'),r('%s/tls.crt')" $d $d) "None,None" .root.Values.grpc.tls.mtls -}}
exec:
  command:
    - python
    - -c
    - {{ printf "import grpc,sys;from grpc_health.v1 import health_pb2 as h,health_pb2_grpc as g;r=lambda f:open(f,'rb').read();c=grpc.ssl_channel_credentials(r('%s/ca.crt'),%s);ch=grpc.secure_channel('127.0.0.1:%v',c,options=[('grpc.ssl_target_name_override','%s')]);sys.exit(g.HealthStub(ch).Check(h.HealthCheckRequest(service=''),timeout=4).status!=1)" $d $client .port .name | quote }}
{{- else -}}
grpc:
  port: {{ .port }}
  service: ""
{{- end -}}
{{- end -}}

{{/* Startup, readiness and liveness probes on gRPC health: {root, port, name, startup}.
Health reports SERVING only while NATS, PostgreSQL and S3 answer, so liveness tolerates
a longer outage (2 min) before a restart. */}}
{{- define "flywheel.probes" -}}
startupProbe:
  {{- include "flywheel.grpcCheck" . | nindent 2 }}
  periodSeconds: {{ .startup.periodSeconds }}
  failureThreshold: {{ .startup.failureThreshold }}
  timeoutSeconds: 5
readinessProbe:
  {{- include "flywheel.grpcCheck" . | nindent 2 }}
  periodSeconds: 5
  failureThreshold: 2
  timeoutSeconds: 5
livenessProbe:
  {{- include "flywheel.grpcCheck" . | nindent 2 }}
  periodSeconds: 20
  failureThreshold: 6
  timeoutSeconds: 5
{{- end -}}

{{- define "flywheel.topologySpread" -}}
{{- if .root.Values.topologySpread.enabled }}
topologySpreadConstraints:
{{- range .root.Values.topologySpread.topologyKeys }}
  - maxSkew: {{ $.root.Values.topologySpread.maxSkew }}
    topologyKey: {{ . }}
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "flywheel.selectorLabels" $ | nindent 8 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod-level fields shared by every pod: {root, vals} */}}
{{- define "flywheel.podCommon" -}}
serviceAccountName: {{ include "flywheel.serviceAccountName" .root }}
automountServiceAccountToken: {{ .root.Values.serviceAccount.automountToken }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .vals.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .vals.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .vals.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
A gRPC service: Deployment, Service, ConfigMap, HPA, PDB. {root, key}.
*/}}
{{- define "flywheel.grpcService" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $s := index (include "flywheel.svc" $root | fromYaml) .key -}}
{{- $vals := index $v .key -}}
{{- $full := include "flywheel.fullname" $root -}}
{{- $name := printf "%s-%s" $full $s.name -}}
{{- $ctx := dict "root" $root "component" $s.name -}}
{{- $kedaScaled := and $v.keda.enabled (eq .key "evaluator") -}}
{{- $hpa := dig "autoscaling" "enabled" false $vals -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ $name }}
  labels:
    {{- include "flywheel.labels" $ctx | nindent 4 }}
data:
  {{- include "flywheel.configEnv" (dict "root" $root "key" .key) | nindent 2 }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  labels:
    {{- include "flywheel.labels" $ctx | nindent 4 }}
spec:
  {{- if not (or $hpa $kedaScaled) }}
  replicas: {{ $vals.replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  selector:
    matchLabels:
      {{- include "flywheel.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "flywheel.selectorLabels" $ctx | nindent 8 }}
      annotations:
        checksum/config: {{ include "flywheel.configEnv" (dict "root" $root "key" .key) | sha256sum }}
        {{- with $vals.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      {{- include "flywheel.podCommon" (dict "root" $root "vals" $vals) | nindent 6 }}
      {{- include "flywheel.topologySpread" $ctx | nindent 6 }}
      terminationGracePeriodSeconds: {{ add $v.shutdownGraceSeconds 20 }}
      containers:
        - name: {{ $s.name }}
          image: {{ include "flywheel.image" (dict "root" $root "image" $vals.image) }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          args: ["serve"]
          ports:
            - name: grpc
              containerPort: {{ $vals.grpcPort }}
              protocol: TCP
            - name: metrics
              containerPort: {{ $v.metrics.port }}
              protocol: TCP
          envFrom:
            - configMapRef:
                name: {{ $name }}
          env:
            {{- include "flywheel.secretEnv" (dict "root" $root "key" .key) | nindent 12 }}
          {{- include "flywheel.probes" (dict "root" $root "port" $vals.grpcPort "name" $name "startup" $vals.startupProbe) | nindent 10 }}
          resources:
            {{- toYaml $vals.resources | nindent 12 }}
          securityContext:
            {{- toYaml $v.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "flywheel.volumeMounts" $root | nindent 12 }}
            {{- if eq .key "trainer" }}
            - name: work
              mountPath: /var/lib/flywheel
            {{- end }}
      volumes:
        {{- include "flywheel.volumes" $root | nindent 8 }}
        {{- if eq .key "trainer" }}
        - name: work
          emptyDir:
            sizeLimit: 10Gi
        {{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  labels:
    {{- include "flywheel.labels" $ctx | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- include "flywheel.selectorLabels" $ctx | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $vals.grpcPort }}
      targetPort: grpc
      appProtocol: grpc
    - name: metrics
      port: {{ $v.metrics.port }}
      targetPort: metrics
{{- if and $hpa (not $kedaScaled) }}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ $name }}
  labels:
    {{- include "flywheel.labels" $ctx | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ $name }}
  minReplicas: {{ $vals.autoscaling.minReplicas }}
  maxReplicas: {{ $vals.autoscaling.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ $vals.autoscaling.targetCPUUtilizationPercentage }}
{{- end }}
{{- include "flywheel.pdb" (dict "root" $root "component" $s.name "pdb" $vals.pdb) }}
{{- end -}}

{{- define "flywheel.pdb" -}}
{{- if .pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ printf "%s-%s" (include "flywheel.fullname" .root) .component }}
  labels:
    {{- include "flywheel.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "flywheel.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* KEDA ScaledObject on a JetStream consumer's lag: {root, component, stream, consumer, k} */}}
{{- define "flywheel.scaledObject" -}}
{{- $v := .root.Values -}}
{{- $ns := $v.nats.namespace -}}
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {{ printf "%s-%s" (include "flywheel.fullname" .root) .component }}
  labels:
    {{- include "flywheel.labels" . | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ printf "%s-%s" (include "flywheel.fullname" .root) .component }}
  minReplicaCount: {{ .k.minReplicas }}
  maxReplicaCount: {{ .k.maxReplicas }}
  cooldownPeriod: {{ .k.cooldownPeriod }}
  pollingInterval: {{ .k.pollingInterval }}
  triggers:
    - type: nats-jetstream
      metadata:
        natsServerMonitoringEndpoint: {{ $v.nats.monitoringEndpoint | quote }}
        account: {{ $v.nats.account | quote }}
        stream: {{ printf "%s_%s" ($ns | upper | replace "-" "_") .stream | quote }}
        consumer: {{ .consumer | quote }}
        lagThreshold: {{ .k.lagThreshold | quote }}
        activationLagThreshold: {{ .k.activationLagThreshold | quote }}
        useHttps: {{ $v.nats.monitoringHttps | quote }}
{{- end -}}

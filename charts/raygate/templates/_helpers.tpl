{{/* Chart name, truncated to the 63 characters a label value may have. */}}
{{- define "raygate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-raygate, or <release> when it already contains the name. */}}
{{- define "raygate.fullname" -}}
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

{{- define "raygate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "raygate.labels" -}}
helm.sh/chart: {{ include "raygate.chart" . }}
{{ include "raygate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: raygate
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels the Deployment, Service, PDB and ServiceMonitor select on; never change them. */}}
{{- define "raygate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "raygate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "raygate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "raygate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "raygate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}
{{- end }}

{{/* Values that cannot work together fail the render instead of deploying a broken operator. */}}
{{- define "raygate.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled=true: two active replicas would both write the gate" }}
{{- end }}
{{- if not (has .Values.logFormat (list "json" "text")) }}
{{- fail (printf "logFormat must be json or text, not %q" .Values.logFormat) }}
{{- end }}
{{- end }}

{{/* What `raygate release` needs per namespace: list the plans, drop raygate's finalizer
from each (a merge patch), read each gated RayService and give its gate back (apply). */}}
{{- define "raygate.releaseRules" -}}
- apiGroups: ["raygate.io"]
  resources: ["upgradeplans"]
  verbs: ["list", "patch"]
- apiGroups: ["ray.io"]
  resources: ["rayservices"]
  verbs: ["get", "patch"]
{{- if .Values.capacityRequests.enabled }}
# raygate's capacity requests go with its gates.
- apiGroups: [""]
  resources: ["podtemplates"]
  verbs: ["list", "delete"]
- apiGroups: ["autoscaling.x-k8s.io"]
  resources: ["capacitybuffers"]
  verbs: ["list", "delete"]
{{- end }}
{{- if .Values.kueue.reservations.enabled }}
# raygate's Kueue quota reservations go with its gates.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "delete"]
{{- end }}
{{- end }}

{{/* Kueue quota (kueue.reservations.enabled): read the queues; write only raygate's own
reservation Workloads (labelled app.kubernetes.io/managed-by=raygate, found again by
server-side apply, deleted when the transition ends) and their PodsReady condition.
Keep in step with config/kueue-reservations/rbac.yaml (a test compares them). */}}
{{- define "raygate.kueueRules" -}}
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["clusterqueues", "localqueues"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}

{{/* Capacity requests (capacityRequests.enabled): the PodTemplates and CapacityBuffers
raygate keeps for held upgrades, labelled app.kubernetes.io/managed-by=raygate; created and
found again by server-side apply, deleted when the gate opens. Keep in step with
config/components/capacity-requests (a test compares them). */}}
{{- define "raygate.capacityRequestRules" -}}
- apiGroups: [""]
  resources: ["podtemplates"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["autoscaling.x-k8s.io"]
  resources: ["capacitybuffers"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end }}

{{/* What raygate watches in its scope: the plans, the RayServices they gate and their
RayClusters. Cluster-wide without watchNamespaces (then LimitRanges are in the capacity
rule); per watched namespace with it, LimitRanges included (defaults of the pods a
RayCluster will create there). */}}
{{- define "raygate.scopedReadRules" -}}
- apiGroups: ["raygate.io"]
  resources: ["upgradeplans"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["ray.io"]
  resources: ["rayservices", "rayclusters"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{/* What raygate writes where it gates: the plans' finalizer (a JSON patch, kube's
finalizer helper) and status (a merge patch with a resourceVersion), the gate (server-side
apply of spec.upgradeStrategy.type), and its Events. No update: nothing is replaced. */}}
{{- define "raygate.writeRules" -}}
- apiGroups: ["raygate.io"]
  resources: ["upgradeplans"]
  verbs: ["patch"]
- apiGroups: ["raygate.io"]
  resources: ["upgradeplans/status"]
  verbs: ["patch"]
- apiGroups: ["ray.io"]
  resources: ["rayservices"]
  verbs: ["patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

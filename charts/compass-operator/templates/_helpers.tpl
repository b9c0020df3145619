{{/* The chart name, or nameOverride. */}}
{{- define "compass-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every resource name: fullnameOverride, or the release name (plus the chart's
name when the release name does not contain it), at most 63 characters. */}}
{{- define "compass-operator.fullname" -}}
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

{{/* chart-version, for the helm.sh/chart label. */}}
{{- define "compass-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels that select the operator's pod: stable across upgrades. */}}
{{- define "compass-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "compass-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The standard labels on every object of the chart. */}}
{{- define "compass-operator.labels" -}}
helm.sh/chart: {{ include "compass-operator.chart" . }}
{{ include "compass-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: compass-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "compass-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "compass-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator's image (and the Jobs'): repository@digest, or repository:tag (appVersion). */}}
{{- define "compass-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* What the operator does in the namespaces it watches, and nothing more: kopf's handlers on
the two compass.io resources, the search and profiling Jobs with their state ConfigMaps, the Jobs'
pods (read only), events, and the Jobs' ServiceAccount with its Role and RoleBinding. That Role
only grants configmaps get/patch/create and endpointslices list, which the operator holds itself,
so neither `escalate` nor `bind` is needed. The generated ParetoPolicy is server-side applied (patch, and create when it is
new), never replaced: no `update`. Used by the ClusterRole (cluster mode) and by each Role
(namespaced mode). */}}
{{- define "compass-operator.rules" -}}
- apiGroups: ["compass.io"]
  resources: ["compoundworkflows"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["compass.io"]
  resources: ["paretopolicies"]
  verbs: ["get", "list", "watch", "patch", "create", "delete"]
- apiGroups: ["compass.io"]
  resources: ["compoundworkflows/status", "paretopolicies/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "get", "list", "watch", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["create", "get", "list", "watch", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["create", "get"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create", "get"]
{{- if .Values.metricsAuthentication.readSecrets }}
{{- /* The Secret a ParetoPolicy's metrics.authentication names: get by name, never list. */}}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
{{- if .Values.actuators.inferenceModelRewrite }}
{{- /* llm-d's gateway as an actuator: the policy's weights, server-side applied. */}}
- apiGroups: ["llm-d.ai"]
  resources: ["inferencemodelrewrites"]
  verbs: ["get", "create", "patch"]
{{- end }}
{{- if .Values.actuators.httpRoute }}
{{- /* An HTTPRoute's backendRef weights across InferencePools, server-side applied. */}}
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["get", "create", "patch"]
{{- end }}
{{- end }}

{{/* Read-only, cluster-scoped: kopf watches CustomResourceDefinitions to notice resources that
appear later, and lists Namespaces to resolve its namespace patterns. */}}
{{- define "compass-operator.discoveryRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{/* kopf's peering (peering.enabled): list and watch the peering objects and merge-patch this
replica's keep-alive into their status, nothing else (the chart creates them). Cluster mode:
the cluster-scoped ClusterKopfPeering, in the ClusterRole; namespaced mode: the KopfPeering of
each watched namespace, in its Role. */}}
{{- define "compass-operator.clusterPeeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}

{{- define "compass-operator.namespacedPeeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}

{{/* The annotations of the uninstall hook's objects (uninstall-hook.yaml): run after the
release's objects are deleted, the ServiceAccount and its rules first (weight), all deleted once
the hook succeeded, or before it runs again. */}}
{{- define "compass-operator.uninstallHook" -}}
helm.sh/hook: post-delete
helm.sh/hook-weight: {{ .weight | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end }}

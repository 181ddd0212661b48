{{/* The namespace of every namespaced object: namespace.name, else the release's. */}}
{{- define "thaw.namespace" -}}
{{ .Values.namespace.name | default .Release.Namespace }}
{{- end -}}

{{- define "thaw.labels" -}}
app.kubernetes.io/part-of: thaw
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The image: its tag is the chart's appVersion, thaw's version, unless set. */}}
{{- define "thaw.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* "true" when thawd talks to the API server at all (a token is mounted then). */}}
{{- define "thaw.usesApi" -}}
{{- if or .Values.kubernetes.events .Values.kubernetes.readinessFromPodSpec -}}true{{- end -}}
{{- end -}}

{{- define "thaw.storeSecret" -}}
{{- if .Values.store.credentials.existingSecret -}}
{{ .Values.store.credentials.existingSecret }}
{{- else if .Values.store.credentials.accessKeyId -}}
thaw-s3-credentials
{{- end -}}
{{- end -}}

{{- define "thaw.tenantKeysSecret" -}}
{{- if .Values.encryption.tenantKeys.existingSecret -}}
{{ .Values.encryption.tenantKeys.existingSecret }}
{{- else if .Values.encryption.tenantKeys.keys -}}
thaw-tenant-keys
{{- end -}}
{{- end -}}

{{- define "thaw.manifestKeySecret" -}}
{{- if .Values.manifestKey.existingSecret -}}
{{ .Values.manifestKey.existingSecret }}
{{- else if .Values.manifestKey.key -}}
thaw-manifest-key
{{- end -}}
{{- end -}}

{{/* thaw's config as {section: {key: value}} (control/config.py's keys), extraConfig over it. */}}
{{- define "thaw.config" -}}
{{- $v := .Values -}}
{{- $bin := "/opt/thaw/bin" -}}
{{- $store := dict "endpoint" $v.store.endpoint "bucket" $v.store.bucket "region" $v.store.region
      "prefix" $v.store.prefix "stream" $v.store.stream "encrypt" $v.encryption.enabled
      "fetcher" (printf "%s/thaw-fetch" $bin) "gofer" (printf "%s/thaw-gofer" $bin) -}}
{{- if $v.encryption.enabled -}}
{{- $_ := set $store "tenant_keys_dir" "/etc/thaw-keys/tenants" -}}
{{- end -}}
{{- if include "thaw.manifestKeySecret" . -}}
{{- $_ := set $store "manifest_key_file" "/etc/thaw-keys/manifest/manifest.key" -}}
{{- end -}}
{{- $thawd := dict "metrics_addr" "" -}}
{{- if $v.metrics.enabled -}}
{{- $_ := set $thawd "metrics_addr" (printf "0.0.0.0:%d" (int $v.metrics.port)) -}}
{{- end -}}
{{- $c := dict
      "runsc" (dict "path" (printf "%s/runsc" $bin))
      "pack" (dict "chunker" (printf "%s/thaw-chunk" $bin))
      "node" (dict "gpu" $v.node.gpu "machine_type" $v.node.machineType)
      "containerd" (dict "runtime_handler" $v.runtimeClass.handler "restart_command" $v.containerd.restartCommand
                         "address" "/run/containerd/containerd.sock" "info" (printf "%s/thaw-ctrinfo" $bin)
                         "cri_namespace" "k8s.io")
      "tenancy" (dict "map" $v.tenancy.map)
      "store" $store
      "cache" (dict "dir" $v.cache.dir "budget_bytes" $v.cache.budget "min_free_bytes" $v.cache.minFree)
      "park" (dict "enabled" $v.parking.enabled "per_key" $v.parking.perKey
                   "memory_budget_bytes" $v.parking.memoryBudget "idle_s" $v.parking.idleSeconds)
      "thawd" $thawd
      "kubernetes" (dict "events" $v.kubernetes.events "read_pods" $v.kubernetes.readinessFromPodSpec
                         "timeout_s" $v.kubernetes.timeoutSeconds) -}}
{{- $c = mergeOverwrite $c (deepCopy $v.extraConfig) -}}
{{- $lines := list -}}
{{- range $sec := keys $c | sortAlpha -}}
{{- $lines = append $lines (printf "[%s]" $sec) -}}
{{- $table := index $c $sec -}}
{{- range $k := keys $table | sortAlpha -}}
{{- $lines = append $lines (printf "%s = %s" $k (include "thaw.toml" (index $table $k))) -}}
{{- end -}}
{{- end -}}
{{ join "\n" $lines }}
{{- end -}}

{{/* One value as TOML: strings and lists as JSON (valid TOML), maps as inline tables. */}}
{{- define "thaw.toml" -}}
{{- if kindIs "map" . -}}
{ {{- range $i, $k := keys . | sortAlpha }}{{ if $i }}, {{ end }}{{ $k | toJson }} = {{ include "thaw.toml" (index $ $k) }}{{ end -}} }
{{- else if kindIs "slice" . -}}
{{ toJson . }}
{{- else if kindIs "bool" . -}}
{{ . }}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) -}}
{{- if eq (float64 .) (float64 (int64 .)) }}{{ int64 . }}{{ else }}{{ . }}{{ end -}}
{{- else -}}
{{ toString . | toJson }}
{{- end -}}
{{- end -}}

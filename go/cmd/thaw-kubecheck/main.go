// Command thaw-kubecheck validates thaw's Kubernetes manifests offline.
//
// Every YAML document is decoded strictly (sigs.k8s.io/yaml UnmarshalStrict:
// unknown and duplicate fields are errors, as with `kubectl apply
// --validate=strict`) into its typed k8s.io/api object, so a misspelt field or
// a wrong type fails here instead of on a cluster. Then the checks the API
// server (k8s.io/apimachinery api/validation) and the scheduler would make on
// names, labels and selectors, and the cross-object references a set of
// manifests must satisfy: a pod's runtimeClassName, serviceAccountName,
// ConfigMap / Secret volumes and env references, namespaces.
//
// Usage:
//
//	thaw-kubecheck [-json] FILE_OR_DIR...
//
// Directories are walked for *.yaml / *.yml. Exit status 1 when anything is
// wrong; -json prints {"objects": [...], "errors": [...]}, each object with
// its file, kind, namespace, name and the decoded object (for policy tests).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// kinds thaw ships, by "apiVersion/kind": a new typed object and whether it is namespaced.
var kinds = map[string]struct {
	new        func() any
	namespaced bool
}{
	"v1/Namespace":                {func() any { return &corev1.Namespace{} }, false},
	"v1/ServiceAccount":           {func() any { return &corev1.ServiceAccount{} }, true},
	"v1/ConfigMap":                {func() any { return &corev1.ConfigMap{} }, true},
	"v1/Secret":                   {func() any { return &corev1.Secret{} }, true},
	"v1/Pod":                      {func() any { return &corev1.Pod{} }, true},
	"apps/v1/DaemonSet":           {func() any { return &appsv1.DaemonSet{} }, true},
	"node.k8s.io/v1/RuntimeClass": {func() any { return &nodev1.RuntimeClass{} }, false},
	"v1/Service":                  {func() any { return &corev1.Service{} }, true},
	// The chart's node-scoped RBAC (deploy/helm/thaw/templates/rbac.yaml, admissionpolicy.yaml).
	"rbac.authorization.k8s.io/v1/ClusterRole":        {func() any { return &rbacv1.ClusterRole{} }, false},
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding": {func() any { return &rbacv1.ClusterRoleBinding{} }, false},
	"rbac.authorization.k8s.io/v1/Role":               {func() any { return &rbacv1.Role{} }, true},
	"rbac.authorization.k8s.io/v1/RoleBinding":        {func() any { return &rbacv1.RoleBinding{} }, true},
	"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy": {
		func() any { return &admissionv1.ValidatingAdmissionPolicy{} }, false},
	"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding": {
		func() any { return &admissionv1.ValidatingAdmissionPolicyBinding{} }, false},
}

// Namespaces every cluster has.
var builtinNamespaces = map[string]bool{"default": true, "kube-system": true, "kube-public": true}

type object struct {
	File      string `json:"file"`
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Object    any    `json:"object"`
	meta      *metav1.ObjectMeta
	typed     any
}

type checker struct {
	objects []*object
	errs    []string
}

func (c *checker) errorf(where, format string, args ...any) {
	c.errs = append(c.errs, where+": "+fmt.Sprintf(format, args...))
}

func (c *checker) fieldErrs(where string, errs field.ErrorList) {
	for _, e := range errs {
		c.errorf(where, "%s", e.Error())
	}
}

func main() {
	asJSON := flag.Bool("json", false, "print the decoded objects and errors as JSON")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: thaw-kubecheck [-json] FILE_OR_DIR...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	c := &checker{}
	for _, arg := range flag.Args() {
		files, err := yamlFiles(arg)
		if err != nil {
			c.errorf(arg, "%v", err)
			continue
		}
		for _, f := range files {
			c.load(f)
		}
	}
	c.crossCheck()

	if *asJSON {
		out := struct {
			Objects []*object `json:"objects"`
			Errors  []string  `json:"errors"`
		}{c.objects, c.errs}
		if out.Errors == nil {
			out.Errors = []string{}
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	} else {
		for _, o := range c.objects {
			fmt.Printf("decoded %s %s (%s)\n", o.Kind, qualified(o.Namespace, o.Name), o.File)
		}
		for _, e := range c.errs {
			fmt.Fprintln(os.Stderr, "error: "+e)
		}
		fmt.Printf("thaw-kubecheck: %d objects, %d errors\n", len(c.objects), len(c.errs))
	}
	if len(c.errs) > 0 {
		os.Exit(1)
	}
}

func qualified(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

func yamlFiles(arg string) ([]string, error) {
	st, err := os.Stat(arg)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return []string{arg}, nil
	}
	var files []string
	err = filepath.WalkDir(arg, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			files = append(files, p)
		}
		return nil
	})
	sort.Strings(files)
	return files, err
}

// load decodes every document of one file strictly into its typed object.
func (c *checker) load(file string) {
	data, err := os.ReadFile(file)
	if err != nil {
		c.errorf(file, "%v", err)
		return
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for doc := 1; ; doc++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return
		}
		where := fmt.Sprintf("%s: document %d", file, doc)
		if err != nil {
			c.errorf(where, "%v", err)
			return
		}
		if len(bytes.TrimSpace(stripComments(raw))) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(raw, &tm); err != nil {
			c.errorf(where, "not a Kubernetes object: %v", err)
			continue
		}
		key := tm.APIVersion + "/" + tm.Kind
		k, ok := kinds[key]
		if !ok {
			c.errorf(where, "unsupported apiVersion/kind %q", key)
			continue
		}
		typed := k.new()
		if err := yaml.UnmarshalStrict(raw, typed); err != nil {
			c.errorf(where, "%s: %v", tm.Kind, err)
			continue
		}
		var generic any
		if err := yaml.Unmarshal(raw, &generic); err != nil {
			c.errorf(where, "%v", err)
			continue
		}
		meta := metaOf(typed)
		o := &object{File: file, Kind: tm.Kind, Namespace: meta.Namespace, Name: meta.Name,
			Object: generic, meta: meta, typed: typed}
		if k.namespaced && o.Namespace == "" {
			o.Namespace = "default"
		}
		where = fmt.Sprintf("%s: %s %s", file, tm.Kind, qualified(o.Namespace, o.Name))
		nameFn := apivalidation.NameIsDNSSubdomain
		if tm.Kind == "Namespace" {
			nameFn = apivalidation.NameIsDNSLabel
		}
		metaCopy := *meta
		metaCopy.Namespace = o.Namespace
		c.fieldErrs(where, apivalidation.ValidateObjectMeta(&metaCopy, k.namespaced, nameFn, field.NewPath("metadata")))
		c.objects = append(c.objects, o)
	}
}

func stripComments(b []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' && !bytes.Equal(t, []byte("---")) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

func metaOf(typed any) *metav1.ObjectMeta {
	switch o := typed.(type) {
	case *corev1.Namespace:
		return &o.ObjectMeta
	case *corev1.ServiceAccount:
		return &o.ObjectMeta
	case *corev1.ConfigMap:
		return &o.ObjectMeta
	case *corev1.Secret:
		return &o.ObjectMeta
	case *corev1.Pod:
		return &o.ObjectMeta
	case *appsv1.DaemonSet:
		return &o.ObjectMeta
	case *nodev1.RuntimeClass:
		return &o.ObjectMeta
	case *corev1.Service:
		return &o.ObjectMeta
	case *rbacv1.ClusterRole:
		return &o.ObjectMeta
	case *rbacv1.ClusterRoleBinding:
		return &o.ObjectMeta
	case *rbacv1.Role:
		return &o.ObjectMeta
	case *rbacv1.RoleBinding:
		return &o.ObjectMeta
	case *admissionv1.ValidatingAdmissionPolicy:
		return &o.ObjectMeta
	case *admissionv1.ValidatingAdmissionPolicyBinding:
		return &o.ObjectMeta
	}
	panic(fmt.Sprintf("no metadata for %T", typed))
}

func (c *checker) find(kind, ns, name string) *object {
	for _, o := range c.objects {
		if o.Kind == kind && o.Name == name && (ns == "" || o.Namespace == ns) {
			return o
		}
	}
	return nil
}

// crossCheck: what one object says about another, and per-kind rules.
func (c *checker) crossCheck() {
	seen := map[string]string{}
	for _, o := range c.objects {
		id := o.Kind + " " + qualified(o.Namespace, o.Name)
		if prev, dup := seen[id]; dup {
			c.errorf(o.File, "%s defined twice (also in %s)", id, prev)
		}
		seen[id] = o.File
		where := fmt.Sprintf("%s: %s", o.File, id)
		if o.Namespace != "" && !builtinNamespaces[o.Namespace] && c.find("Namespace", "", o.Namespace) == nil {
			c.errorf(where, "namespace %q is not defined in these manifests", o.Namespace)
		}
		switch t := o.typed.(type) {
		case *nodev1.RuntimeClass:
			for _, msg := range validation.IsDNS1123Label(t.Handler) {
				c.errorf(where, "handler %q: %s", t.Handler, msg)
			}
			if t.Scheduling != nil {
				c.fieldErrs(where, metavalidation.ValidateLabels(t.Scheduling.NodeSelector,
					field.NewPath("scheduling", "nodeSelector")))
				c.tolerations(where, t.Scheduling.Tolerations)
			}
		case *corev1.Pod:
			c.podSpec(where, o.Namespace, &t.Spec)
		case *appsv1.DaemonSet:
			c.daemonSet(where, o.Namespace, t)
		case *corev1.ConfigMap:
			for k := range t.Data {
				for _, msg := range validation.IsConfigMapKey(k) {
					c.errorf(where, "data key %q: %s", k, msg)
				}
			}
		case *corev1.Secret:
			for k := range t.StringData {
				for _, msg := range validation.IsConfigMapKey(k) {
					c.errorf(where, "stringData key %q: %s", k, msg)
				}
			}
		case *corev1.Service:
			c.service(where, o.Namespace, t)
		case *rbacv1.ClusterRole:
			c.rules(where, t.Rules)
		case *rbacv1.Role:
			c.rules(where, t.Rules)
		case *rbacv1.ClusterRoleBinding:
			c.binding(where, "", t.RoleRef, t.Subjects)
		case *rbacv1.RoleBinding:
			c.binding(where, o.Namespace, t.RoleRef, t.Subjects)
		case *admissionv1.ValidatingAdmissionPolicy:
			c.policy(where, t)
		case *admissionv1.ValidatingAdmissionPolicyBinding:
			c.policyBinding(where, t)
		}
	}
}

func (c *checker) daemonSet(where, ns string, ds *appsv1.DaemonSet) {
	if ds.Spec.Selector == nil {
		c.errorf(where, "spec.selector is required")
	} else {
		c.fieldErrs(where, metavalidation.ValidateLabelSelector(ds.Spec.Selector,
			metavalidation.LabelSelectorValidationOptions{}, field.NewPath("spec", "selector")))
		sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
		if err != nil {
			c.errorf(where, "spec.selector: %v", err)
		} else if sel.Empty() || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
			c.errorf(where, "spec.selector does not match spec.template.metadata.labels")
		}
	}
	c.fieldErrs(where, metavalidation.ValidateLabels(ds.Spec.Template.Labels, field.NewPath("spec", "template", "metadata", "labels")))
	c.fieldErrs(where, apivalidation.ValidateAnnotations(ds.Spec.Template.Annotations, field.NewPath("spec", "template", "metadata", "annotations")))
	if rp := ds.Spec.Template.Spec.RestartPolicy; rp != "" && rp != corev1.RestartPolicyAlways {
		c.errorf(where, "a DaemonSet's pods must have restartPolicy Always, not %q", rp)
	}
	c.podSpec(where+" template", ns, &ds.Spec.Template.Spec)
}

var hostPathTypes = map[corev1.HostPathType]bool{
	corev1.HostPathUnset: true, corev1.HostPathDirectoryOrCreate: true, corev1.HostPathDirectory: true,
	corev1.HostPathFileOrCreate: true, corev1.HostPathFile: true, corev1.HostPathSocket: true,
	corev1.HostPathCharDev: true, corev1.HostPathBlockDev: true,
}

func (c *checker) podSpec(where, ns string, spec *corev1.PodSpec) {
	if spec.RuntimeClassName != nil && c.find("RuntimeClass", "", *spec.RuntimeClassName) == nil {
		c.errorf(where, "runtimeClassName %q: no such RuntimeClass in these manifests", *spec.RuntimeClassName)
	}
	if sa := spec.ServiceAccountName; sa != "" && sa != "default" && c.find("ServiceAccount", ns, sa) == nil {
		c.errorf(where, "serviceAccountName %q: no such ServiceAccount in namespace %q", sa, ns)
	}
	c.fieldErrs(where, metavalidation.ValidateLabels(spec.NodeSelector, field.NewPath("spec", "nodeSelector")))
	c.tolerations(where, spec.Tolerations)

	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		if _, dup := volumes[v.Name]; dup {
			c.errorf(where, "volume %q defined twice", v.Name)
		}
		volumes[v.Name] = v
		for _, msg := range validation.IsDNS1123Label(v.Name) {
			c.errorf(where, "volume name %q: %s", v.Name, msg)
		}
		switch {
		case v.HostPath != nil:
			if !path.IsAbs(v.HostPath.Path) {
				c.errorf(where, "volume %q: hostPath.path %q is not absolute", v.Name, v.HostPath.Path)
			}
			if v.HostPath.Type != nil && !hostPathTypes[*v.HostPath.Type] {
				c.errorf(where, "volume %q: hostPath.type %q is not a HostPathType", v.Name, *v.HostPath.Type)
			}
		case v.ConfigMap != nil:
			c.keysExist(where, "ConfigMap", ns, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional)
		case v.Secret != nil:
			c.keysExist(where, "Secret", ns, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional)
		}
	}

	names := map[string]bool{}
	all := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	if len(spec.Containers) == 0 {
		c.errorf(where, "no containers")
	}
	for _, ctr := range all {
		cw := fmt.Sprintf("%s container %q", where, ctr.Name)
		if names[ctr.Name] {
			c.errorf(cw, "container name used twice")
		}
		names[ctr.Name] = true
		for _, msg := range validation.IsDNS1123Label(ctr.Name) {
			c.errorf(cw, "name: %s", msg)
		}
		if strings.TrimSpace(ctr.Image) == "" {
			c.errorf(cw, "image is required")
		}
		privileged := ctr.SecurityContext != nil && ctr.SecurityContext.Privileged != nil && *ctr.SecurityContext.Privileged
		mounts := map[string]bool{}
		for _, m := range ctr.VolumeMounts {
			if _, ok := volumes[m.Name]; !ok {
				c.errorf(cw, "volumeMount %q: no such volume", m.Name)
			}
			if !path.IsAbs(m.MountPath) {
				c.errorf(cw, "volumeMount %q: mountPath %q is not absolute", m.Name, m.MountPath)
			}
			if mounts[m.MountPath] {
				c.errorf(cw, "mountPath %q used twice", m.MountPath)
			}
			mounts[m.MountPath] = true
			if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional && !privileged {
				c.errorf(cw, "volumeMount %q: Bidirectional propagation needs a privileged container", m.Name)
			}
		}
		for _, e := range ctr.Env {
			for _, msg := range validation.IsEnvVarName(e.Name) {
				c.errorf(cw, "env %q: %s", e.Name, msg)
			}
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				c.keyExists(cw, "Secret", ns, r.Name, r.Key, r.Optional)
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				c.keyExists(cw, "ConfigMap", ns, r.Name, r.Key, r.Optional)
			}
		}
		for _, f := range ctr.EnvFrom {
			if f.SecretRef != nil {
				c.keyExists(cw, "Secret", ns, f.SecretRef.Name, "", f.SecretRef.Optional)
			}
			if f.ConfigMapRef != nil {
				c.keyExists(cw, "ConfigMap", ns, f.ConfigMapRef.Name, "", f.ConfigMapRef.Optional)
			}
		}
		for res, limit := range ctr.Resources.Limits {
			if req, ok := ctr.Resources.Requests[res]; ok && req.Cmp(limit) > 0 {
				c.errorf(cw, "resources: request %s=%s exceeds its limit %s", res, req.String(), limit.String())
			}
		}
		for name, p := range map[string]*corev1.Probe{"readinessProbe": ctr.ReadinessProbe,
			"livenessProbe": ctr.LivenessProbe, "startupProbe": ctr.StartupProbe} {
			if p == nil {
				continue
			}
			n := 0
			if p.Exec != nil {
				n++
			}
			if p.HTTPGet != nil {
				n++
			}
			if p.TCPSocket != nil {
				n++
			}
			if p.GRPC != nil {
				n++
			}
			if n != 1 {
				c.errorf(cw, "%s: exactly one of exec, httpGet, tcpSocket, grpc, got %d", name, n)
			}
		}
	}
}

func (c *checker) tolerations(where string, ts []corev1.Toleration) {
	for _, t := range ts {
		switch t.Operator {
		case "", corev1.TolerationOpEqual:
		case corev1.TolerationOpExists:
			if t.Value != "" {
				c.errorf(where, "toleration %q: operator Exists takes no value", t.Key)
			}
		default:
			c.errorf(where, "toleration %q: operator %q is not Equal or Exists", t.Key, t.Operator)
		}
		switch t.Effect {
		case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			c.errorf(where, "toleration %q: effect %q is unknown", t.Key, t.Effect)
		}
	}
}

func (c *checker) keysExist(where, kind, ns, name string, items []corev1.KeyToPath, optional *bool) {
	if len(items) == 0 {
		c.keyExists(where, kind, ns, name, "", optional)
	}
	for _, it := range items {
		c.keyExists(where, kind, ns, name, it.Key, optional)
	}
}

// keyExists: `kind` ns/name is in the set and (key != "") has that key.
func (c *checker) keyExists(where, kind, ns, name, key string, optional *bool) {
	if optional != nil && *optional {
		return
	}
	o := c.find(kind, ns, name)
	if o == nil {
		c.errorf(where, "%s %q: not defined in namespace %q", kind, name, ns)
		return
	}
	if key == "" {
		return
	}
	var ok bool
	switch t := o.typed.(type) {
	case *corev1.ConfigMap:
		_, ok = t.Data[key]
		if !ok {
			_, ok = t.BinaryData[key]
		}
	case *corev1.Secret:
		_, ok = t.StringData[key]
		if !ok {
			_, ok = t.Data[key]
		}
	}
	if !ok {
		c.errorf(where, "%s %q has no key %q", kind, name, key)
	}
}

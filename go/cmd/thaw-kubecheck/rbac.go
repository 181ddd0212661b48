package main

import (
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The verbs the API server authorizes (k8s.io/apiserver request info, plus the
// RBAC-only ones); "*" is every verb.
var verbs = map[string]bool{"get": true, "list": true, "watch": true, "create": true, "update": true,
	"patch": true, "delete": true, "deletecollection": true, "proxy": true, "impersonate": true,
	"bind": true, "escalate": true, "approve": true, "sign": true, "use": true, "*": true}

// rules: each names verbs the API server knows and either resources or non-resource URLs.
func (c *checker) rules(where string, rules []rbacv1.PolicyRule) {
	for i, r := range rules {
		rw := fmt.Sprintf("%s rule %d", where, i)
		if len(r.Verbs) == 0 {
			c.errorf(rw, "no verbs")
		}
		for _, v := range r.Verbs {
			if !verbs[v] {
				c.errorf(rw, "verb %q is not one the API server authorizes", v)
			}
		}
		if len(r.Resources) == 0 && len(r.NonResourceURLs) == 0 {
			c.errorf(rw, "neither resources nor nonResourceURLs")
		}
		if len(r.Resources) > 0 && len(r.APIGroups) == 0 {
			c.errorf(rw, "resources without apiGroups (\"\" is the core group)")
		}
	}
}

// Roles every cluster has: the bootstrap ClusterRoles.
func builtinClusterRole(name string) bool {
	return strings.HasPrefix(name, "system:") || name == "cluster-admin" || name == "admin" || name == "edit" || name == "view"
}

// binding: its role is in the set (or a bootstrap one), its ServiceAccount subjects too.
func (c *checker) binding(where, ns string, ref rbacv1.RoleRef, subjects []rbacv1.Subject) {
	if ref.APIGroup != rbacv1.GroupName {
		c.errorf(where, "roleRef.apiGroup %q is not %q", ref.APIGroup, rbacv1.GroupName)
	}
	switch ref.Kind {
	case "ClusterRole":
		if !builtinClusterRole(ref.Name) && c.find("ClusterRole", "", ref.Name) == nil {
			c.errorf(where, "roleRef: no ClusterRole %q in these manifests", ref.Name)
		}
	case "Role":
		if ns == "" {
			c.errorf(where, "a ClusterRoleBinding cannot name a Role")
		} else if c.find("Role", ns, ref.Name) == nil {
			c.errorf(where, "roleRef: no Role %q in namespace %q", ref.Name, ns)
		}
	default:
		c.errorf(where, "roleRef.kind %q is not ClusterRole or Role", ref.Kind)
	}
	if len(subjects) == 0 {
		c.errorf(where, "no subjects")
	}
	for _, s := range subjects {
		if s.Kind != rbacv1.ServiceAccountKind {
			continue
		}
		sns := s.Namespace
		if sns == "" {
			sns = ns
		}
		if sns == "" {
			c.errorf(where, "ServiceAccount subject %q has no namespace", s.Name)
		} else if c.find("ServiceAccount", sns, s.Name) == nil {
			c.errorf(where, "subject: no ServiceAccount %q in namespace %q", s.Name, sns)
		}
	}
}

// service: its selector picks a pod template of the set in its namespace, and a
// named targetPort is a port of that template's containers.
func (c *checker) service(where, ns string, svc *corev1.Service) {
	if len(svc.Spec.Ports) == 0 {
		c.errorf(where, "no ports")
	}
	if len(svc.Spec.Selector) == 0 {
		return // endpoints managed by hand
	}
	c.fieldErrs(where, metavalidation.ValidateLabels(svc.Spec.Selector, field.NewPath("spec", "selector")))
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	var picked []*corev1.PodSpec
	for _, o := range c.objects {
		if o.Namespace != ns {
			continue
		}
		if spec, lbls := podTemplate(o); spec != nil && sel.Matches(labels.Set(lbls)) {
			picked = append(picked, spec)
		}
	}
	if len(picked) == 0 {
		c.errorf(where, "spec.selector %v picks no pod template in namespace %q", svc.Spec.Selector, ns)
		return
	}
	for _, p := range svc.Spec.Ports {
		if p.TargetPort.Type != intstr.String || p.TargetPort.StrVal == "" { // a number: nothing to look up
			continue
		}
		for _, spec := range picked {
			if !hasPort(spec, p.TargetPort.StrVal) {
				c.errorf(where, "port %q: targetPort %q is no container port of the pods it selects", p.Name,
					p.TargetPort.StrVal)
			}
		}
	}
}

func hasPort(spec *corev1.PodSpec, name string) bool {
	for _, ctr := range spec.Containers {
		for _, cp := range ctr.Ports {
			if cp.Name == name {
				return true
			}
		}
	}
	return false
}

// podTemplate: the pod spec and labels an object runs pods with, if it does.
func podTemplate(o *object) (*corev1.PodSpec, map[string]string) {
	switch t := o.typed.(type) {
	case *corev1.Pod:
		return &t.Spec, t.Labels
	case *appsv1.DaemonSet:
		return &t.Spec.Template.Spec, t.Spec.Template.Labels
	}
	return nil, nil
}

// policy: a ValidatingAdmissionPolicy matches something, and each validation and
// variable has an expression (CEL is compiled by the API server only: the
// integration tier installs it on a real one).
func (c *checker) policy(where string, p *admissionv1.ValidatingAdmissionPolicy) {
	if p.Spec.MatchConstraints == nil || len(p.Spec.MatchConstraints.ResourceRules) == 0 {
		c.errorf(where, "spec.matchConstraints.resourceRules is required")
	}
	if len(p.Spec.Validations) == 0 && len(p.Spec.AuditAnnotations) == 0 {
		c.errorf(where, "neither validations nor auditAnnotations")
	}
	for i, v := range p.Spec.Validations {
		if strings.TrimSpace(v.Expression) == "" {
			c.errorf(where, "validation %d has no expression", i)
		}
	}
	for _, v := range p.Spec.Variables {
		if strings.TrimSpace(v.Expression) == "" || v.Name == "" {
			c.errorf(where, "variable %q has no name or expression", v.Name)
		}
	}
	for _, m := range p.Spec.MatchConditions {
		if strings.TrimSpace(m.Expression) == "" || m.Name == "" {
			c.errorf(where, "matchCondition %q has no name or expression", m.Name)
		}
	}
	if fp := p.Spec.FailurePolicy; fp != nil && *fp != admissionv1.Fail && *fp != admissionv1.Ignore {
		c.errorf(where, "failurePolicy %q is not Fail or Ignore", *fp)
	}
}

func (c *checker) policyBinding(where string, b *admissionv1.ValidatingAdmissionPolicyBinding) {
	if c.find("ValidatingAdmissionPolicy", "", b.Spec.PolicyName) == nil {
		c.errorf(where, "policyName %q: no such ValidatingAdmissionPolicy in these manifests", b.Spec.PolicyName)
	}
	if len(b.Spec.ValidationActions) == 0 {
		c.errorf(where, "spec.validationActions is required")
	}
	for _, a := range b.Spec.ValidationActions {
		switch a {
		case admissionv1.Deny, admissionv1.Warn, admissionv1.Audit:
		default:
			c.errorf(where, "validationAction %q is not Deny, Warn or Audit", a)
		}
	}
}

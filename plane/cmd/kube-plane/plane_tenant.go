package main

// The tenant: how servebook's users meet a shared cluster. A platform team gives a team one
// or more namespaces and a Role in each, bound to the team's identity; the team may not
// create namespaces, write anything cluster-scoped, or read nodes, CRDs or other teams'
// namespaces. `up` makes that identity (a client certificate, CN servebook-tenant), its
// namespaces and their Roles, and writes DIR/tenant.kubeconfig, whose context's namespace
// is the first of them.
//
// The Role's rules are those Kubernetes' own aggregated `edit` ClusterRole grants on the
// workload kinds (k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac/bootstrappolicy, the
// "edit" and "admin" roles), plus what a team that deploys LLM servers is typically given
// beside them: LeaderWorkerSets, and Roles and RoleBindings in its own namespace (as the
// `admin` ClusterRole grants) so that a router may be given read access to its Pods. Each
// rule is one (group, resources, verbs) line, so that a test can take one away.

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	tenantUser  = "servebook-tenant"
	tenantGroup = "servebook:tenants"
	tenantRole  = "tenant"
	// tenantLabel marks the namespaces a tenant was given (and the Role's name in each).
	tenantLabel = "servebook.io/tenant"
)

// tenantNamespaces are the namespaces the tenant is given; the kubeconfig's context names
// the first.
var tenantNamespaces = []string{"tenant-a", "tenant-b"}

var (
	writeVerbs = []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	readVerbs  = []string{"get", "list", "watch"}
)

// tenantRules is the Role each tenant namespace holds.
func tenantRules() []rbacv1.PolicyRule {
	rule := func(group string, verbs []string, resources ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{group}, Resources: resources, Verbs: verbs}
	}
	return []rbacv1.PolicyRule{
		rule("", writeVerbs, "pods", "services", "configmaps", "secrets", "serviceaccounts",
			"persistentvolumeclaims", "endpoints"),
		rule("", readVerbs, "pods/log", "pods/status", "events", "resourcequotas", "limitranges"),
		rule("", []string{"get", "create"}, "pods/portforward", "pods/exec", "pods/attach"),
		// the namespace itself (a Role in it grants get on its own Namespace object)
		rule("", []string{"get"}, "namespaces"),
		rule("apps", writeVerbs, "deployments", "deployments/scale", "statefulsets",
			"statefulsets/scale", "replicasets"),
		rule("apps", readVerbs, "controllerrevisions"),
		rule("batch", writeVerbs, "jobs", "cronjobs"),
		rule("leaderworkerset.x-k8s.io", writeVerbs, "leaderworkersets", "leaderworkersets/scale"),
		rule("leaderworkerset.x-k8s.io", readVerbs, "leaderworkersets/status"),
		rule("rbac.authorization.k8s.io", writeVerbs, "roles", "rolebindings"),
		rule("networking.k8s.io", writeVerbs, "networkpolicies"),
		rule("policy", writeVerbs, "poddisruptionbudgets"),
		rule("discovery.k8s.io", readVerbs, "endpointslices"),
		rule("events.k8s.io", readVerbs, "events"),
	}
}

// grantTenant makes the tenant's namespaces, each with its Role and RoleBinding.
func grantTenant(ctx context.Context, admin *kubernetes.Clientset) error {
	for _, ns := range tenantNamespaces {
		space := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns, Labels: map[string]string{tenantLabel: tenantUser},
		}}
		if _, err := admin.CoreV1().Namespaces().Create(ctx, space, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("namespace %s: %w", ns, err)
		}
		role := &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: tenantRole, Namespace: ns},
			Rules:      tenantRules(),
		}
		if _, err := admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("role %s/%s: %w", ns, tenantRole, err)
		}
		binding := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: tenantRole, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: tenantRole},
			Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: tenantUser}},
		}
		if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("rolebinding %s/%s: %w", ns, tenantRole, err)
		}
	}
	return nil
}

// writeTenantKubeconfig writes the tenant's kubeconfig, its context in the first namespace.
func writeTenantKubeconfig(l *layout) error {
	path := l.path("tenant.kubeconfig")
	if err := writeKubeconfig(path, l.server(), l.path("pki"), "tenant", tenantUser); err != nil {
		return err
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return err
	}
	cfg.Contexts[cfg.CurrentContext].Namespace = tenantNamespaces[0]
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, data, 0o600)
}

package main

// LeaderWorkerSet on the plane, installed the way its release manifests install it (CRD,
// the controller's ClusterRole, the mutating and validating webhooks with the pod webhooks
// limited to LWS's Pods by objectSelector, as its kustomize patches do), with two changes a
// plane without in-cluster images needs: the controller runs as a process of this machine
// (user lws-controller-manager, a client certificate), and the webhooks are called by URL
// on the plane's bridge with the plane's CA, instead of through a Service and cert-manager.
// The manifests come from the pinned sigs.k8s.io/lws module (scripts/kube-plane copies them
// next to the binary when it builds it).

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiext "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

const lwsUser = "lws-controller-manager"

// lwsFiles is where the build put the controller and LWS's own manifests.
func lwsFiles(self string) string { return filepath.Join(filepath.Dir(self), "lws") }

func installLWS(ctx context.Context, r *record, admin *kubernetes.Clientset, self string) error {
	l := &r.Layout
	files := lwsFiles(self)
	if err := applyLWSCRD(ctx, l, filepath.Join(files, "crd.yaml")); err != nil {
		return fmt.Errorf("LeaderWorkerSet CRD: %w", err)
	}
	if err := grantLWS(ctx, admin, filepath.Join(files, "role.yaml")); err != nil {
		return fmt.Errorf("LeaderWorkerSet RBAC: %w", err)
	}
	port, err := freePort(l.BridgeIP)
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig", l.path("lws.kubeconfig"), "--webhook-host", l.BridgeIP,
		"--webhook-port", strconv.Itoa(port), "--cert-dir", l.path("pki", "lws-webhook"),
	}
	if err := startBinary(r, filepath.Join(files, "lws-controller"), "lws-controller", args); err != nil {
		return err
	}
	addr := net.JoinHostPort(l.BridgeIP, strconv.Itoa(port))
	if err := waitFor(ctx, r, "the LeaderWorkerSet webhook server", func() (bool, error) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil, nil
	}); err != nil {
		return err
	}
	return registerLWSWebhooks(ctx, admin, l, filepath.Join(files, "webhooks.yaml"), "https://"+addr)
}

func applyLWSCRD(ctx context.Context, l *layout, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var crd apiextv1.CustomResourceDefinition
	if err := yaml.Unmarshal(data, &crd); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", l.path("admin.kubeconfig"))
	if err != nil {
		return err
	}
	c, err := apiext.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err := c.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
		return err
	}
	for ctx.Err() == nil {
		got, err := c.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err == nil {
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue {
					return nil
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return ctx.Err()
}

func grantLWS(ctx context.Context, admin *kubernetes.Clientset, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(data, &role); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	role.Name = "lws-manager-role"
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "lws-manager-rolebinding"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: lwsUser}},
	}
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
	return err
}

// registerLWSWebhooks creates LWS's webhook configurations, called by URL (base + path).
func registerLWSWebhooks(ctx context.Context, admin *kubernetes.Clientset, l *layout, path, base string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(l.path("pki", "ca.crt"))
	if err != nil {
		return err
	}
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		if err := registerOne(ctx, admin, doc, base, ca); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	return nil
}

func registerOne(ctx context.Context, admin *kubernetes.Clientset, doc []byte, base string, ca []byte) error {
	var head metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return err
	}
	switch head.Kind {
	case "MutatingWebhookConfiguration":
		var m admissionv1.MutatingWebhookConfiguration
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return err
		}
		m.Name = "lws-" + m.Name
		kept := m.Webhooks[:0]
		for _, w := range m.Webhooks {
			if keepLWSWebhook(&w.ClientConfig, &w.ObjectSelector, base, ca) {
				kept = append(kept, w)
			}
		}
		m.Webhooks = kept
		_, err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &m, metav1.CreateOptions{})
		return err
	case "ValidatingWebhookConfiguration":
		var v admissionv1.ValidatingWebhookConfiguration
		if err := yaml.Unmarshal(doc, &v); err != nil {
			return err
		}
		v.Name = "lws-" + v.Name
		kept := v.Webhooks[:0]
		for _, w := range v.Webhooks {
			if keepLWSWebhook(&w.ClientConfig, &w.ObjectSelector, base, ca) {
				kept = append(kept, w)
			}
		}
		v.Webhooks = kept
		_, err := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &v, metav1.CreateOptions{})
		return err
	}
	return nil
}

// keepLWSWebhook points one webhook at the controller by URL and limits the pod webhooks to
// LWS's Pods (LWS's kustomize patches); DisaggregatedSet's, whose controller is not run, go.
func keepLWSWebhook(cc *admissionv1.WebhookClientConfig, sel **metav1.LabelSelector, base string, ca []byte) bool {
	if cc.Service == nil || cc.Service.Path == nil || strings.Contains(*cc.Service.Path, "disaggregatedset") {
		return false
	}
	url := base + *cc.Service.Path
	cc.URL, cc.Service, cc.CABundle = &url, nil, ca
	if strings.HasSuffix(url, "-v1-pod") {
		*sel = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "leaderworkerset.sigs.k8s.io/name", Operator: metav1.LabelSelectorOpExists},
		}}
	}
	return true
}

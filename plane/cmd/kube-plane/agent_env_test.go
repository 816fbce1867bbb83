package main

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

type fakeObjects struct{}

func (fakeObjects) configMap(ns, name string) (*v1.ConfigMap, error) {
	if name == "cfg" {
		return &v1.ConfigMap{Data: map[string]string{"MODEL": "tiny", "PORT": "8000"}}, nil
	}
	return nil, apierrors.NewNotFound(v1.Resource("configmap"), name)
}

func (fakeObjects) secret(ns, name string) (*v1.Secret, error) {
	if name == "tok" {
		return &v1.Secret{Data: map[string][]byte{"token": []byte("s3cret")}}, nil
	}
	return nil, apierrors.NewNotFound(v1.Resource("secret"), name)
}

func envPod() *v1.Pod {
	yes := true
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u-1", Labels: map[string]string{"app": "x"}},
		Spec: v1.PodSpec{NodeName: "gpu-0", ServiceAccountName: "sa", Containers: []v1.Container{{
			Name:    "c",
			EnvFrom: []v1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}},
			Env: []v1.EnvVar{
				{Name: "A", Value: "a"},
				{Name: "B", Value: "$(A)-$(CFG_MODEL)-$(MISSING)-$$(A)"},
				{Name: "POD", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "APP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
				{Name: "IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
				{Name: "NODE", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
				{Name: "TOKEN", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "tok"}, Key: "token"}}},
				{Name: "OPT", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "gone"}, Key: "k", Optional: &yes}}},
				{Name: "CPU", ValueFrom: &v1.EnvVarSource{ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "limits.cpu"}}},
			},
		}}},
	}
}

func TestAgentContainerEnv(t *testing.T) {
	pod := envPod()
	info := podRuntimeInfo{podIP: "10.103.0.9", hostIP: "10.103.0.1", allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("96")}}
	svcEnv := map[string]string{"KUBERNETES_SERVICE_HOST": "10.163.0.1"}
	env, err := containerEnv(pod, &pod.Spec.Containers[0], info, svcEnv, fakeObjects{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"A": "a", "B": "a-tiny-$(MISSING)-$(A)", "CFG_MODEL": "tiny", "CFG_PORT": "8000", "POD": "p", "APP": "x",
		"IP": "10.103.0.9", "NODE": "gpu-0", "TOKEN": "s3cret", "CPU": "96", "KUBERNETES_SERVICE_HOST": "10.163.0.1",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	if _, ok := env["OPT"]; ok {
		t.Error("a missing optional ConfigMap must leave the variable out")
	}
	if got := expandAll([]string{"--port=$(CFG_PORT)", "$(HOME)"}, env); got[0] != "--port=8000" || got[1] != "$(HOME)" {
		t.Errorf("expandAll: %q", got)
	}
}

func TestAgentContainerEnvErrors(t *testing.T) {
	pod := envPod()
	c := &pod.Spec.Containers[0]
	c.Env = []v1.EnvVar{{Name: "X", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{
		LocalObjectReference: v1.LocalObjectReference{Name: "x"}, Key: "k"}}}}
	if _, err := containerEnv(pod, c, podRuntimeInfo{}, nil, fakeObjects{}); err == nil || err.Error() != `configmap "x" not found` {
		t.Errorf("missing ConfigMap: %v", err)
	}
	c.Env[0].ValueFrom.ConfigMapKeyRef.Name = "cfg"
	if _, err := containerEnv(pod, c, podRuntimeInfo{}, nil, fakeObjects{}); err == nil || err.Error() != "couldn't find key k in ConfigMap ns/cfg" {
		t.Errorf("missing key: %v", err)
	}
}

func TestAgentServiceEnv(t *testing.T) {
	svc := func(ns, name, ip string) *v1.Service {
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1.ServiceSpec{ClusterIP: ip,
			Ports: []v1.ServicePort{{Name: "http", Port: 8080, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}}}
	}
	all := []*v1.Service{svc("default", "kubernetes", "10.163.0.1"), svc("ns", "my-svc", "10.163.0.20"),
		svc("other", "far", "10.163.0.30"), svc("ns", "headless", v1.ClusterIPNone)}
	env := serviceEnvFor(all, "ns", true)
	if env["MY_SVC_SERVICE_HOST"] != "10.163.0.20" || env["MY_SVC_SERVICE_PORT"] != "8080" || env["KUBERNETES_SERVICE_HOST"] != "10.163.0.1" {
		t.Errorf("service links: %v", env)
	}
	if _, ok := env["FAR_SERVICE_HOST"]; ok {
		t.Error("another namespace's Service leaked into the env")
	}
	if _, ok := env["HEADLESS_SERVICE_HOST"]; ok {
		t.Error("a headless Service has no env")
	}
	env = serviceEnvFor(all, "ns", false)
	if _, ok := env["MY_SVC_SERVICE_HOST"]; ok || env["KUBERNETES_SERVICE_HOST"] == "" {
		t.Errorf("enableServiceLinks false keeps only the master service: %v", env)
	}
}

package main

import (
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	resourcehelper "k8s.io/kubernetes/pkg/api/v1/resource"
	"k8s.io/kubernetes/pkg/fieldpath"
	"k8s.io/kubernetes/pkg/kubelet/envvars"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// A container's environment, built by the kubelet's rules (makeEnvironmentVariables).

// objectGetter reads what env and volumes refer to, through the node's own client (so the
// Node authorizer limits it exactly as it limits a kubelet).
type objectGetter interface {
	configMap(ns, name string) (*v1.ConfigMap, error)
	secret(ns, name string) (*v1.Secret, error)
}

// podRuntimeInfo is what the downward API needs beyond the Pod object.
type podRuntimeInfo struct {
	podIP       string
	hostIP      string
	allocatable v1.ResourceList // the node's, for limits a container does not set
}

// serviceEnvFor picks the Services whose variables a Pod in ns gets: the master service
// default/kubernetes always, the namespace's own when service links are enabled.
func serviceEnvFor(services []*v1.Service, ns string, enableLinks bool) map[string]string {
	chosen := map[string]*v1.Service{}
	for _, s := range services {
		if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == v1.ClusterIPNone {
			continue
		}
		if s.Namespace == "default" && s.Name == "kubernetes" {
			if _, ok := chosen[s.Name]; !ok {
				chosen[s.Name] = s
			}
		} else if s.Namespace == ns && enableLinks {
			chosen[s.Name] = s
		}
	}
	list := make([]*v1.Service, 0, len(chosen))
	for _, s := range chosen {
		list = append(list, s)
	}
	env := map[string]string{}
	for _, e := range envvars.FromServices(list) {
		env[e.Name] = e.Value
	}
	return env
}

// containerEnv returns the variables the kubelet would give the container (without the
// image's defaults, which the caller adds underneath).
func containerEnv(pod *v1.Pod, c *v1.Container, info podRuntimeInfo, serviceEnv map[string]string, objs objectGetter) (map[string]string, error) {
	tmpEnv := map[string]string{}
	cache := &objectCache{objs: objs, ns: pod.Namespace}
	for _, from := range c.EnvFrom {
		if err := addEnvFrom(tmpEnv, from, cache); err != nil {
			return nil, err
		}
	}
	mapping := expansion.MappingFuncFor(tmpEnv, serviceEnv)
	for _, e := range c.Env {
		val, skip, err := envVarValue(e, pod, c, info, cache, mapping)
		if err != nil {
			return nil, err
		}
		if !skip {
			tmpEnv[e.Name] = val
		}
	}
	for k, v := range serviceEnv {
		if _, ok := tmpEnv[k]; !ok {
			tmpEnv[k] = v
		}
	}
	return tmpEnv, nil
}

func addEnvFrom(env map[string]string, from v1.EnvFromSource, cache *objectCache) error {
	switch {
	case from.ConfigMapRef != nil:
		cm, err := cache.configMap(from.ConfigMapRef.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && isTrue(from.ConfigMapRef.Optional) {
				return nil
			}
			return err
		}
		for k, v := range cm.Data {
			env[from.Prefix+k] = v
		}
	case from.SecretRef != nil:
		s, err := cache.secret(from.SecretRef.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && isTrue(from.SecretRef.Optional) {
				return nil
			}
			return err
		}
		for k, v := range s.Data {
			env[from.Prefix+k] = string(v)
		}
	}
	return nil
}

// envVarValue returns the value of one env entry; skip is true for a missing optional source.
func envVarValue(e v1.EnvVar, pod *v1.Pod, c *v1.Container, info podRuntimeInfo, cache *objectCache, mapping func(string) string) (string, bool, error) {
	if e.Value != "" || e.ValueFrom == nil {
		return expansion.Expand(e.Value, mapping), false, nil
	}
	from := e.ValueFrom
	switch {
	case from.FieldRef != nil:
		v, err := podFieldValue(from.FieldRef.FieldPath, pod, info)
		return v, false, err
	case from.ResourceFieldRef != nil:
		v, err := resourceFieldValue(from.ResourceFieldRef, pod, c.Name, info)
		return v, false, err
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := cache.configMap(ref.Name)
		if err != nil {
			return "", apierrors.IsNotFound(err) && isTrue(ref.Optional), notFoundUnlessOptional(err, ref.Optional)
		}
		v, ok := cm.Data[ref.Key]
		if !ok && !isTrue(ref.Optional) {
			return "", false, fmt.Errorf("couldn't find key %v in ConfigMap %v/%v", ref.Key, pod.Namespace, ref.Name)
		}
		return v, !ok, nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := cache.secret(ref.Name)
		if err != nil {
			return "", apierrors.IsNotFound(err) && isTrue(ref.Optional), notFoundUnlessOptional(err, ref.Optional)
		}
		v, ok := s.Data[ref.Key]
		if !ok && !isTrue(ref.Optional) {
			return "", false, fmt.Errorf("couldn't find key %v in Secret %v/%v", ref.Key, pod.Namespace, ref.Name)
		}
		return string(v), !ok, nil
	}
	return "", false, fmt.Errorf("env %s: servebook's node agent does not support this valueFrom", e.Name)
}

func notFoundUnlessOptional(err error, optional *bool) error {
	if apierrors.IsNotFound(err) && isTrue(optional) {
		return nil
	}
	return err
}

// podFieldValue is the downward API's value of a Pod field (podFieldSelectorRuntimeValue).
func podFieldValue(path string, pod *v1.Pod, info podRuntimeInfo) (string, error) {
	switch path {
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return info.hostIP, nil
	case "status.podIP", "status.podIPs":
		return info.podIP, nil
	}
	return fieldpath.ExtractFieldPathAsString(pod, path)
}

// resourceFieldValue resolves limits a container leaves unset to the node's allocatable.
func resourceFieldValue(fs *v1.ResourceFieldSelector, pod *v1.Pod, container string, info podRuntimeInfo) (string, error) {
	if fs.ContainerName != "" {
		container = fs.ContainerName
	}
	return resourcehelper.ExtractResourceValueByContainerNameAndNodeAllocatable(fs, pod, container, info.allocatable)
}

// expandAll applies the kubelet's $(VAR) expansion to command and args.
func expandAll(list []string, env map[string]string) []string {
	mapping := expansion.MappingFuncFor(env)
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = expansion.Expand(s, mapping)
	}
	return out
}

// envList renders env as KEY=VALUE, sorted so that specs are stable.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func isTrue(b *bool) bool { return b != nil && *b }

// objectCache fetches each ConfigMap and Secret once per container start, like the kubelet.
type objectCache struct {
	objs       objectGetter
	ns         string
	configMaps map[string]*v1.ConfigMap
	secrets    map[string]*v1.Secret
}

func (c *objectCache) configMap(name string) (*v1.ConfigMap, error) {
	if cm, ok := c.configMaps[name]; ok {
		return cm, nil
	}
	cm, err := c.objs.configMap(c.ns, name)
	if err == nil {
		if c.configMaps == nil {
			c.configMaps = map[string]*v1.ConfigMap{}
		}
		c.configMaps[name] = cm
	}
	return cm, err
}

func (c *objectCache) secret(name string) (*v1.Secret, error) {
	if s, ok := c.secrets[name]; ok {
		return s, nil
	}
	s, err := c.objs.secret(c.ns, name)
	if err == nil {
		if c.secrets == nil {
			c.secrets = map[string]*v1.Secret{}
		}
		c.secrets[name] = s
	}
	return s, err
}

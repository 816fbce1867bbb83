package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// A Pod's volumes, made on the host under the Pod's directory (hostPath under the node's
// directory) and bind-mounted into each container by pod-exec.

type podVolume struct {
	path     string // on the host
	readOnly bool   // the kubelet mounts configMap, secret, downwardAPI and projected read-only
}

// fileProjection is one file of a configMap, secret, downwardAPI or projected volume.
type fileProjection struct {
	data []byte
	mode os.FileMode
}

// volumeSetup has what making a Pod's volumes needs besides the Pod.
type volumeSetup struct {
	ctx      context.Context
	dir      string // the Pod's directory
	hostPath string // the node's root for hostPath volumes
	objs     objectGetter
	tokens   tokenRequester
	info     podRuntimeInfo
}

// tokenRequester asks for a service account token bound to the Pod (TokenRequest API).
type tokenRequester interface {
	podToken(ctx context.Context, pod *v1.Pod, audience string, seconds int64) (string, error)
}

// setupVolumes makes every volume of the Pod, as the kubelet mounts them all before any
// container starts. The error is the FailedMount event's message.
func setupVolumes(pod *v1.Pod, vs volumeSetup) (map[string]podVolume, error) {
	vols := map[string]podVolume{}
	for _, vol := range pod.Spec.Volumes {
		pv, err := setupVolume(pod, vol, vs)
		if err != nil {
			return nil, fmt.Errorf("MountVolume.SetUp failed for volume %q : %v", vol.Name, err)
		}
		vols[vol.Name] = pv
	}
	return vols, nil
}

func setupVolume(pod *v1.Pod, vol v1.Volume, vs volumeSetup) (podVolume, error) {
	path := filepath.Join(vs.dir, "volumes", vol.Name)
	src := vol.VolumeSource
	var files map[string]fileProjection
	var err error
	switch {
	case src.EmptyDir != nil:
		// Medium Memory is the same directory: this machine has no tmpfs quota to honour.
		return podVolume{path: path}, mkdirMode(path, 0o777)
	case src.HostPath != nil:
		p, err := hostPathVolume(vs.hostPath, src.HostPath)
		return podVolume{path: p}, err
	case src.ConfigMap != nil:
		files, err = configMapFiles(pod.Namespace, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.DefaultMode, src.ConfigMap.Optional, vs.objs)
	case src.Secret != nil:
		files, err = secretFiles(pod.Namespace, src.Secret.SecretName, src.Secret.Items, src.Secret.DefaultMode, src.Secret.Optional, vs.objs)
	case src.DownwardAPI != nil:
		files, err = downwardAPIFiles(pod, src.DownwardAPI.Items, src.DownwardAPI.DefaultMode, vs.info)
	case src.Projected != nil:
		files, err = projectedFiles(pod, src.Projected, vs)
	default:
		return podVolume{}, fmt.Errorf("servebook's node agent does not support %s volumes", volumeType(src))
	}
	if err != nil {
		return podVolume{}, err
	}
	return podVolume{path: path, readOnly: true}, writeProjection(path, files)
}

// volumeType is the field name of the volume's source, e.g. "persistentVolumeClaim".
func volumeType(src v1.VolumeSource) string {
	data, _ := json.Marshal(src)
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(data, &fields)
	for name := range fields {
		return name
	}
	return "unknown"
}

// hostPathVolume maps a hostPath into the node's directory, so that Pods never touch the
// machine's real paths, and applies the kubelet's type checks.
func hostPathVolume(root string, src *v1.HostPathVolumeSource) (string, error) {
	p := filepath.Join(root, filepath.Clean("/"+src.Path))
	typ := v1.HostPathUnset
	if src.Type != nil {
		typ = *src.Type
	}
	fi, statErr := os.Stat(p)
	fail := func(what string) (string, error) {
		return "", fmt.Errorf("hostPath type check failed: %s is not a %s", src.Path, what)
	}
	switch typ {
	case v1.HostPathDirectoryOrCreate, v1.HostPathUnset:
		if statErr != nil {
			return p, os.MkdirAll(p, 0o755)
		}
	case v1.HostPathFileOrCreate:
		if statErr != nil {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return "", err
			}
			return p, os.WriteFile(p, nil, 0o644)
		}
	case v1.HostPathDirectory:
		if statErr != nil || !fi.IsDir() {
			return fail("directory")
		}
	case v1.HostPathFile:
		if statErr != nil || !fi.Mode().IsRegular() {
			return fail("file")
		}
	case v1.HostPathSocket:
		if statErr != nil || fi.Mode()&os.ModeSocket == 0 {
			return fail("socket file")
		}
	case v1.HostPathCharDev:
		if statErr != nil || fi.Mode()&os.ModeCharDevice == 0 {
			return fail("character device")
		}
	case v1.HostPathBlockDev:
		if statErr != nil || fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
			return fail("block device")
		}
	}
	return p, nil
}

func configMapFiles(ns, name string, items []v1.KeyToPath, defaultMode *int32, optional *bool, objs objectGetter) (map[string]fileProjection, error) {
	cm, err := objs.configMap(ns, name)
	if err != nil {
		if apierrors.IsNotFound(err) && isTrue(optional) {
			return nil, nil
		}
		return nil, err
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return keyFiles(data, items, defaultMode, optional, "configmap references non-existent config key: %s")
}

func secretFiles(ns, name string, items []v1.KeyToPath, defaultMode *int32, optional *bool, objs objectGetter) (map[string]fileProjection, error) {
	s, err := objs.secret(ns, name)
	if err != nil {
		if apierrors.IsNotFound(err) && isTrue(optional) {
			return nil, nil
		}
		return nil, err
	}
	return keyFiles(s.Data, items, defaultMode, optional, "references non-existent secret key: %s")
}

// keyFiles is the kubelet's MakePayload: every key, or just the items, as files.
func keyFiles(data map[string][]byte, items []v1.KeyToPath, defaultMode *int32, optional *bool, missing string) (map[string]fileProjection, error) {
	mode := fileMode(defaultMode, nil)
	files := map[string]fileProjection{}
	if len(items) == 0 {
		for k, v := range data {
			files[k] = fileProjection{data: v, mode: mode}
		}
		return files, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if isTrue(optional) {
				continue
			}
			return nil, fmt.Errorf(missing, it.Key)
		}
		files[it.Path] = fileProjection{data: v, mode: fileMode(defaultMode, it.Mode)}
	}
	return files, nil
}

func downwardAPIFiles(pod *v1.Pod, items []v1.DownwardAPIVolumeFile, defaultMode *int32, info podRuntimeInfo) (map[string]fileProjection, error) {
	files := map[string]fileProjection{}
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = podFieldValue(it.FieldRef.FieldPath, pod, info)
		case it.ResourceFieldRef != nil:
			v, err = resourceFieldValue(it.ResourceFieldRef, pod, it.ResourceFieldRef.ContainerName, info)
		}
		if err != nil {
			return nil, err
		}
		files[it.Path] = fileProjection{data: []byte(v), mode: fileMode(defaultMode, it.Mode)}
	}
	return files, nil
}

// projectedFiles is how the ServiceAccount admission's kube-api-access volume arrives: a
// bound token, the cluster's CA (kube-root-ca.crt) and the namespace.
func projectedFiles(pod *v1.Pod, src *v1.ProjectedVolumeSource, vs volumeSetup) (map[string]fileProjection, error) {
	files := map[string]fileProjection{}
	for _, s := range src.Sources {
		var part map[string]fileProjection
		var err error
		switch {
		case s.ServiceAccountToken != nil:
			part, err = tokenFile(pod, s.ServiceAccountToken, src.DefaultMode, vs)
		case s.ConfigMap != nil:
			part, err = configMapFiles(pod.Namespace, s.ConfigMap.Name, s.ConfigMap.Items, src.DefaultMode, s.ConfigMap.Optional, vs.objs)
		case s.Secret != nil:
			part, err = secretFiles(pod.Namespace, s.Secret.Name, s.Secret.Items, src.DefaultMode, s.Secret.Optional, vs.objs)
		case s.DownwardAPI != nil:
			part, err = downwardAPIFiles(pod, s.DownwardAPI.Items, src.DefaultMode, vs.info)
		default:
			err = fmt.Errorf("servebook's node agent does not support this projected volume source (clusterTrustBundle, podCertificate)")
		}
		if err != nil {
			return nil, err
		}
		for k, v := range part {
			files[k] = v
		}
	}
	return files, nil
}

func tokenFile(pod *v1.Pod, src *v1.ServiceAccountTokenProjection, defaultMode *int32, vs volumeSetup) (map[string]fileProjection, error) {
	seconds := int64(3600)
	if src.ExpirationSeconds != nil {
		seconds = *src.ExpirationSeconds
	}
	token, err := vs.tokens.podToken(vs.ctx, pod, src.Audience, seconds)
	if err != nil {
		return nil, fmt.Errorf("failed to fetch token: %v", err)
	}
	return map[string]fileProjection{src.Path: {data: []byte(token), mode: fileMode(defaultMode, nil)}}, nil
}

// requestPodToken is the TokenRequest the kubelet makes for a projected token.
func requestPodToken(ctx context.Context, n *nodeAgent, pod *v1.Pod, audience string, seconds int64) (string, error) {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &seconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
	}}
	if audience != "" {
		req.Spec.Audiences = []string{audience}
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	resp, err := n.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return resp.Status.Token, nil
}

func fileMode(defaultMode, itemMode *int32) os.FileMode {
	switch {
	case itemMode != nil:
		return os.FileMode(*itemMode)
	case defaultMode != nil:
		return os.FileMode(*defaultMode)
	}
	return 0o644
}

// writeProjection writes the files into a fresh directory.
func writeProjection(dir string, files map[string]fileProjection) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for rel, f := range files {
		p := filepath.Join(dir, filepath.Clean("/"+rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, f.data, f.mode.Perm()); err != nil {
			return err
		}
		if err := os.Chmod(p, f.mode.Perm()); err != nil { // WriteFile's mode is subject to umask
			return err
		}
	}
	return nil
}

func mkdirMode(p string, mode os.FileMode) error {
	if err := os.MkdirAll(p, mode); err != nil {
		return err
	}
	return os.Chmod(p, mode)
}

// containerMounts lists a container's bind mounts: its volumeMounts, then /etc/hosts,
// /etc/resolv.conf and the termination log unless a volume is mounted there, parents first.
func containerMounts(spec *v1.Container, vols map[string]podVolume, sb *sandbox, termLog string, env map[string]string) ([]bindMount, error) {
	var mounts []bindMount
	taken := map[string]bool{}
	for _, m := range spec.VolumeMounts {
		vol, ok := vols[m.Name]
		if !ok {
			return nil, fmt.Errorf("volume %q of volumeMount %q is not in the Pod", m.Name, m.MountPath)
		}
		src, err := subPathSource(vol.path, m, env)
		if err != nil {
			return nil, err
		}
		target := filepath.Clean(m.MountPath)
		mounts = append(mounts, bindMount{Source: src, Target: target, ReadOnly: m.ReadOnly || vol.readOnly})
		taken[target] = true
	}
	extra := []bindMount{{Source: sb.hosts, Target: "/etc/hosts"}, {Source: sb.resolv, Target: "/etc/resolv.conf"},
		{Source: termLog, Target: filepath.Clean(spec.TerminationMessagePath)}}
	for _, m := range extra {
		if m.Source != "" && m.Target != "." && !taken[m.Target] {
			mounts = append(mounts, m)
		}
	}
	sort.SliceStable(mounts, func(i, j int) bool {
		return strings.Count(mounts[i].Target, "/") < strings.Count(mounts[j].Target, "/")
	})
	return mounts, nil
}

// subPathSource is the host path a volumeMount's subPath (or subPathExpr) names; the kubelet
// creates it as a directory when it does not exist.
func subPathSource(volPath string, m v1.VolumeMount, env map[string]string) (string, error) {
	sub := m.SubPath
	if m.SubPathExpr != "" {
		sub = expansion.Expand(m.SubPathExpr, expansion.MappingFuncFor(env))
	}
	if sub == "" {
		return volPath, nil
	}
	if filepath.IsAbs(sub) || strings.HasPrefix(filepath.Clean(sub), "..") {
		return "", fmt.Errorf("subPath %q must be a relative path within the volume", sub)
	}
	p := filepath.Join(volPath, sub)
	if _, err := os.Stat(p); os.IsNotExist(err) {
		return p, os.MkdirAll(p, 0o750)
	}
	return p, nil
}

// mountPoints creates mount targets that do not exist on the host and removes them on exit
// if they are still empty.
type mountPoints struct {
	mu      sync.Mutex
	created []string // in creation order
}

// ensure makes target exist as a directory, or as a file when isFile.
func (m *mountPoints) ensure(target string, isFile bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := os.Lstat(target); err == nil {
		return nil
	}
	var missing []string
	for p := filepath.Dir(target); p != "/"; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			break
		}
		missing = append([]string{p}, missing...)
	}
	for _, p := range missing {
		if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		m.created = append(m.created, p)
	}
	var err error
	if isFile {
		err = os.WriteFile(target, nil, 0o644)
	} else {
		err = os.Mkdir(target, 0o755)
	}
	if err == nil {
		m.created = append(m.created, target)
	}
	return err
}

// removeEmpty removes what ensure created, deepest first, where nothing was put inside.
func (m *mountPoints) removeEmpty() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := len(m.created) - 1; i >= 0; i-- {
		p := m.created[i]
		if fi, err := os.Lstat(p); err == nil && (fi.IsDir() || fi.Size() == 0) {
			_ = os.Remove(p) // fails, as it should, on a directory that is not empty
		}
	}
	m.created = nil
}

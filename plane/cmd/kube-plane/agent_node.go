package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	kuberecord "k8s.io/client-go/tools/record"
)

// nodeAgent is one Node: its own client (identity system:node:NAME, so that the Node
// authorizer and NodeRestriction judge it as they judge a kubelet), registration, heartbeats,
// events and GPUs.
type nodeAgent struct {
	a           *agent
	name        string
	cfg         agentNodeConfig
	client      kubernetes.Interface
	allocatable v1.ResourceList
	recorder    kuberecord.EventRecorder
	broadcaster kuberecord.EventBroadcaster
	gpus        *gpuAllocator
	uid         types.UID
}

const (
	agentKubeletVersion = "v1.37.2"
	nodeLeaseSeconds    = 40
	leaseRenewInterval  = 10 * time.Second
	nodeStatusInterval  = time.Minute
)

func newNodeAgent(a *agent, cfg agentNodeConfig) (*nodeAgent, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", cfg.Name, err)
	}
	rc.UserAgent = "servebook-node-agent/" + cfg.Name
	rc.QPS, rc.Burst = 50, 100
	rc.WarningHandler = rest.NoWarnings{} // reading v1 Endpoints (see agent_services.go) warns each time
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	capacity := v1.ResourceList{}
	for k, v := range cfg.Capacity {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("node %s: capacity %s: %w", cfg.Name, k, err)
		}
		capacity[v1.ResourceName(k)] = q
	}
	n := &nodeAgent{a: a, name: cfg.Name, cfg: cfg, client: client, allocatable: capacity}
	gpus := capacity[v1.ResourceName(gpuResource)]
	n.gpus = newGPUAllocator(int(gpus.Value()))
	n.broadcaster = kuberecord.NewBroadcaster()
	n.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	n.recorder = n.broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: cfg.Name})
	return n, nil
}

// register creates the Node (or takes over an existing one) and reports its status.
func (n *nodeAgent) register(ctx context.Context) error {
	want := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: n.labels(),
		Annotations: map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"}}}
	got, err := n.client.CoreV1().Nodes().Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err == nil {
			for k, v := range want.Labels {
				if got.Labels == nil {
					got.Labels = map[string]string{}
				}
				got.Labels[k] = v
			}
			got, err = n.client.CoreV1().Nodes().Update(ctx, got, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", n.name, err)
	}
	n.uid = got.UID
	if err := n.updateStatus(ctx); err != nil {
		return err
	}
	return n.renewLease(ctx)
}

// labels are the kubelet's own (hostname, os, arch) under the configured ones.
func (n *nodeAgent) labels() map[string]string {
	l := map[string]string{"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		"beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}
	for k, v := range n.cfg.Labels {
		l[k] = v
	}
	return l
}

func (n *nodeAgent) updateStatus(ctx context.Context) error {
	node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	node.Status = n.status(node.Status, time.Now())
	_, err = n.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	return err
}

func (n *nodeAgent) status(old v1.NodeStatus, now time.Time) v1.NodeStatus {
	conds := []v1.NodeCondition{
		{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"},
		{Type: v1.NodeDiskPressure, Status: v1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure"},
		{Type: v1.NodePIDPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available"},
		{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"},
	}
	for i := range conds {
		conds[i].LastHeartbeatTime = metav1.NewTime(now)
		conds[i].LastTransitionTime = metav1.NewTime(now)
		for _, o := range old.Conditions {
			if o.Type == conds[i].Type && o.Status == conds[i].Status {
				conds[i].LastTransitionTime = o.LastTransitionTime
			}
		}
	}
	return v1.NodeStatus{
		Capacity:        n.allocatable,
		Allocatable:     n.allocatable,
		Phase:           old.Phase,
		Conditions:      conds,
		Addresses:       []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: n.a.cfg.BridgeIP}, {Type: v1.NodeHostName, Address: n.name}},
		DaemonEndpoints: v1.NodeDaemonEndpoints{KubeletEndpoint: v1.DaemonEndpoint{Port: int32(n.a.cfg.KubeletPort)}},
		NodeInfo:        nodeInfo(),
	}
}

func nodeInfo() v1.NodeSystemInfo {
	read := func(p string) string {
		data, _ := os.ReadFile(p)
		return strings.TrimSpace(string(data))
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	return v1.NodeSystemInfo{
		MachineID:               read("/etc/machine-id"),
		SystemUUID:              read("/sys/class/dmi/id/product_uuid"),
		BootID:                  read("/proc/sys/kernel/random/boot_id"),
		KernelVersion:           unix.ByteSliceToString(uts.Release[:]),
		OSImage:                 "servebook node agent (Pods as local processes)",
		ContainerRuntimeVersion: "servebook-agent://1",
		KubeletVersion:          agentKubeletVersion,
		OperatingSystem:         "linux",
		Architecture:            "amd64",
	}
}

// renewLease is the kubelet's heartbeat in kube-node-lease, which the node lifecycle
// controller watches.
func (n *nodeAgent) renewLease(ctx context.Context) error {
	leases := n.client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, n.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		seconds := int32(nodeLeaseSeconds)
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.name, Namespace: v1.NamespaceNodeLease,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.name, UID: n.uid}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &n.name, LeaseDurationSeconds: &seconds, RenewTime: &now},
		}
		_, err = leases.Create(ctx, lease, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

// heartbeat renews the lease every 10 s and the Node's status every minute.
func (n *nodeAgent) heartbeat(ctx context.Context) {
	lease := time.NewTicker(leaseRenewInterval)
	status := time.NewTicker(nodeStatusInterval)
	defer lease.Stop()
	defer status.Stop()
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case <-lease.C:
			err = n.renewLease(ctx)
		case <-status.C:
			err = n.updateStatus(ctx)
		}
		if err != nil && ctx.Err() == nil {
			log.Printf("node-agent: node %s heartbeat: %v", n.name, err)
		}
	}
}

// configMap and secret implement objectGetter. A missing object reads like the kubelet's
// object managers put it: `configmap "x" not found`.
func (n *nodeAgent) configMap(ns, name string) (*v1.ConfigMap, error) {
	cm, err := n.client.CoreV1().ConfigMaps(ns).Get(n.a.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, apierrors.NewNotFound(v1.Resource("configmap"), name)
	}
	return cm, err
}

func (n *nodeAgent) secret(ns, name string) (*v1.Secret, error) {
	s, err := n.client.CoreV1().Secrets(ns).Get(n.a.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, apierrors.NewNotFound(v1.Resource("secret"), name)
	}
	return s, err
}

// podToken implements tokenRequester.
func (n *nodeAgent) podToken(ctx context.Context, pod *v1.Pod, audience string, seconds int64) (string, error) {
	return requestPodToken(ctx, n, pod, audience, seconds)
}

// GPUs: a node's nvidia.com/gpu are indices 0..N-1; a container that asks for some gets its
// own for as long as its Pod runs.

const gpuResource = "nvidia.com/gpu"

func gpuRequest(c *v1.Container) int {
	q, ok := c.Resources.Limits[v1.ResourceName(gpuResource)]
	if !ok {
		q = c.Resources.Requests[v1.ResourceName(gpuResource)]
	}
	return int(q.Value())
}

type gpuAllocator struct {
	mu    sync.Mutex
	owner []string // by index; "" when free
}

func newGPUAllocator(n int) *gpuAllocator { return &gpuAllocator{owner: make([]string, n)} }

func (g *gpuAllocator) allocate(owner string, n int) ([]int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var ids []int
	for i, o := range g.owner {
		if o == "" && len(ids) < n {
			ids = append(ids, i)
		}
	}
	if len(ids) < n {
		return nil, fmt.Errorf("%d %s requested, %d free on this node", n, gpuResource, len(ids))
	}
	for _, i := range ids {
		g.owner[i] = owner
	}
	return ids, nil
}

// release frees every GPU whose owner starts with prefix (a Pod's UID + "/").
func (g *gpuAllocator) release(prefix string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, o := range g.owner {
		if o != "" && strings.HasPrefix(o, prefix) {
			g.owner[i] = ""
		}
	}
}

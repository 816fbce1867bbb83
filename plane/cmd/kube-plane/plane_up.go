package main

// `kube-plane up DIR`: certificates, etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and the node agent, each a process of its own (its log in DIR/logs), the
// plane's record in DIR/plane.json, a tenant's kubeconfig in DIR/tenant.kubeconfig
// (plane_tenant.go), and the admin kubeconfig in DIR/kubeconfig, written last:
// when it exists, the plane answers, its nodes are Ready and the default ServiceAccount is
// there. Interrupted or failed, up stops everything it started.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type upOptions struct {
	dir         string
	python      string
	pathPrepend []string
	timeout     time.Duration
}

func parseUp(args []string) (*upOptions, error) {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	python := fs.String("python", "", "the Python that Pods' python/vllm commands run (this machine's venv)")
	prepend := fs.String("path-prepend", "", "directories (colon-separated) put first on Pods' PATH")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long the plane may take to answer with Ready nodes")
	dir, rest := "", args
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		dir, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return nil, err
	}
	if dir == "" && fs.NArg() == 1 {
		dir = fs.Arg(0)
	}
	if dir == "" {
		return nil, errors.New("usage: kube-plane up DIR [--python PATH] [--path-prepend DIRS] [--timeout 5m]")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	o := &upOptions{dir: abs, python: *python, timeout: *timeout}
	if *prepend != "" {
		o.pathPrepend = strings.Split(*prepend, ":")
	}
	if o.python == "" {
		if o.python, err = exec.LookPath("python3"); err != nil {
			return nil, errors.New("no python3 on PATH: pass --python")
		}
	}
	if o.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %s: give a positive duration such as 5m", o.timeout)
	}
	return o, nil
}

func runUp(args []string) int {
	o, err := parseUp(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-plane up:", err)
		return 2
	}
	if r, err := readRecord(o.dir); err == nil && anyAlive(r) {
		fmt.Fprintf(os.Stderr, "kube-plane up: a plane already runs from %s (%s): `scripts/kube-plane down %s` first\n", o.dir, r.Server, o.dir)
		return 2
	}
	if err := claimDir(o.dir); err != nil {
		fmt.Fprintln(os.Stderr, "kube-plane up:", err)
		if errors.Is(err, errNotOurs) {
			return 2
		}
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sig)
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	go func() {
		if _, ok := <-sig; ok {
			cancel()
		}
	}()
	r, err := bringUp(ctx, o)
	if err != nil {
		code := 1
		if errors.Is(ctx.Err(), context.Canceled) {
			err, code = fmt.Errorf("interrupted: %w", err), 130
		}
		fmt.Fprintln(os.Stderr, "kube-plane up:", err)
		if r != nil {
			tearDown(r, os.Stderr)
		}
		return code
	}
	fmt.Printf("plane up: Kubernetes %s at %s\n", KubeVersion, r.Server)
	for _, p := range r.Processes {
		fmt.Printf("  %-24s pid %-7d log %s\n", p.Part, p.PID, p.Log)
	}
	fmt.Printf("nodes: gpu-0, gpu-1 (8 nvidia.com/gpu each), cpu-0; Pods run as local processes\n")
	fmt.Printf("kubeconfig: %s\n", r.Kubeconfig)
	fmt.Printf("tenant:     %s (user %s: a Role in %s only)\n", r.TenantKubeconfig, tenantUser, strings.Join(r.TenantNamespaces, ", "))
	fmt.Printf("stop it:    scripts/kube-plane down %s\n", o.dir)
	return 0
}

func anyAlive(r *record) bool {
	for _, p := range r.Processes {
		if p.alive() {
			return true
		}
	}
	return false
}

// bringUp returns the record of what it started even when it fails, so the caller can stop it.
func bringUp(ctx context.Context, o *upOptions) (*record, error) {
	// what an earlier up left in DIR was removed by claimDir (runUp), and only that
	if err := os.MkdirAll(filepath.Join(o.dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(o.dir, "pki", "lws-webhook"), 0o700); err != nil {
		return nil, err
	}
	// The binary that started this plane, by path and digest in the record: `down` runs it
	// (even after the sources, and so the cached binary's name, changed) and no other.
	// DIR/kube-plane links to it, for a person to see.
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	digest, err := fileDigest(self)
	if err != nil {
		return nil, err
	}
	if err := os.Symlink(self, filepath.Join(o.dir, "kube-plane")); err != nil {
		return nil, err
	}
	l, err := claimBridge(o.dir)
	if err != nil {
		return nil, err
	}
	r := &record{Version: KubeVersion, Layout: *l, Binary: self, BinarySHA256: digest}
	if err := writeRecord(r); err != nil {
		return r, err
	}
	if err := l.choosePorts(); err != nil {
		return r, err
	}
	r.Layout, r.Server = *l, l.server()
	if err := makeCredentials(l); err != nil {
		return r, fmt.Errorf("certificates: %w", err)
	}
	if err := startAll(ctx, o, r); err != nil {
		return r, err
	}
	if err := writeTenantKubeconfig(l); err != nil {
		return r, fmt.Errorf("the tenant's kubeconfig: %w", err)
	}
	r.Kubeconfig = l.path("kubeconfig")
	r.TenantKubeconfig, r.TenantNamespaces = l.path("tenant.kubeconfig"), tenantNamespaces
	if err := writeRecord(r); err != nil {
		return r, err
	}
	// Last: the file that says the plane is usable.
	data, err := os.ReadFile(l.path("admin.kubeconfig"))
	if err != nil {
		return r, err
	}
	return r, writeFileAtomic(r.Kubeconfig, data, 0o600)
}

func makeCredentials(l *layout) error {
	pki := l.path("pki")
	ca, err := newAuthority(pki)
	if err != nil {
		return err
	}
	ids := []identity{
		{file: "apiserver", cn: "kube-apiserver", server: true,
			ips: parseIPs(l.BridgeIP, l.KubernetesIP, "127.0.0.1"),
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}},
		{file: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", groups: []string{"kubeadm:cluster-admins"}},
		{file: "admin", cn: "kubernetes-admin", groups: []string{"system:masters"}},
		{file: "tenant", cn: tenantUser, groups: []string{tenantGroup}},
		{file: "front-proxy-client", cn: "front-proxy-client"},
		{file: "lws", cn: lwsUser},
		{file: "lws-webhook/tls", cn: "lws-webhook", server: true, ips: parseIPs(l.BridgeIP)},
		{file: "controller-manager", cn: "system:kube-controller-manager"},
		{file: "scheduler", cn: "system:kube-scheduler"},
		{file: "kubelet-serving", cn: "servebook-node-agent", server: true, ips: parseIPs(l.BridgeIP)},
	}
	for _, n := range planeNodes() {
		ids = append(ids, identity{file: "node-" + n.Name, cn: "system:node:" + n.Name, groups: []string{"system:nodes"}})
	}
	for _, id := range ids {
		if err := ca.issue(pki, id); err != nil {
			return fmt.Errorf("%s: %w", id.file, err)
		}
	}
	if err := serviceAccountKeys(pki); err != nil {
		return err
	}
	kubeconfigs := map[string]string{
		"admin": "kubernetes-admin", "controller-manager": "system:kube-controller-manager",
		"scheduler": "system:kube-scheduler", "lws": lwsUser,
	}
	for _, n := range planeNodes() {
		kubeconfigs["node-"+n.Name] = "system:node:" + n.Name
	}
	for file, user := range kubeconfigs {
		if err := writeKubeconfig(l.path(file+".kubeconfig"), l.server(), pki, file, user); err != nil {
			return err
		}
	}
	return nil
}

func startAll(ctx context.Context, o *upOptions, r *record) error {
	l := &r.Layout
	self, err := os.Executable()
	if err != nil {
		return err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", l.EtcdPort)
	if err := start(r, self, "etcd", etcdArgs(l, etcdURL)); err != nil {
		return err
	}
	if err := start(r, self, "kube-apiserver", apiserverArgs(l, etcdURL)); err != nil {
		return err
	}
	admin, err := clientFor(l.path("admin.kubeconfig"))
	if err != nil {
		return err
	}
	if err := waitFor(ctx, r, "the API server to answer /readyz", func() (bool, error) {
		body, err := admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && strings.TrimSpace(string(body)) == "ok", nil
	}); err != nil {
		return err
	}
	if err := start(r, self, "kube-controller-manager", controllerManagerArgs(l)); err != nil {
		return err
	}
	if err := start(r, self, "kube-scheduler", schedulerArgs(l)); err != nil {
		return err
	}
	if err := installLWS(ctx, r, admin, self); err != nil {
		return err
	}
	if err := grantTenant(ctx, admin); err != nil {
		return fmt.Errorf("the tenant: %w", err)
	}
	cfg, err := writeAgentConfig(o, l)
	if err != nil {
		return err
	}
	if err := start(r, self, "node-agent", []string{"--config", cfg}); err != nil {
		return err
	}
	return waitUsable(ctx, r, admin)
}

func waitUsable(ctx context.Context, r *record, admin *kubernetes.Clientset) error {
	want := len(planeNodes())
	if err := waitFor(ctx, r, fmt.Sprintf("%d Ready nodes", want), func() (bool, error) {
		nodes, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, n := range nodes.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == want, nil
	}); err != nil {
		return err
	}
	return waitFor(ctx, r, "the default ServiceAccount and kube-root-ca.crt", func() (bool, error) {
		_, err1 := admin.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		_, err2 := admin.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err1 == nil && err2 == nil, nil
	})
}

func clientFor(kubeconfig string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 5 * time.Second
	return kubernetes.NewForConfig(cfg)
}

// waitFor polls until ready says so, a started part dies (its log's tail is the error), or
// ctx ends (time out or a signal).
func waitFor(ctx context.Context, r *record, what string, ready func() (bool, error)) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := ready()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		for _, p := range r.Processes {
			if !p.alive() {
				return fmt.Errorf("%s exited while waiting for %s; the end of %s:\n%s", p.Part, what, p.Log, tail(p.Log, 20))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up waiting for %s (%v); the plane's logs are in %s", what, ctx.Err(), r.Layout.path("logs"))
		case <-tick.C:
		}
	}
}

func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return "  " + strings.Join(all, "\n  ")
}

// start runs `self part args...` (one part of the plane's own binary).
func start(r *record, self, part string, args []string) error {
	return startBinary(r, self, part, append([]string{part}, args...))
}

// startBinary runs bin in a process group of its own, detached from up's terminal (it
// outlives up), logging to DIR/logs/part.log, and records it before anything waits on it.
func startBinary(r *record, bin, part string, args []string) error {
	log := r.Layout.path("logs", part+".log")
	out, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", part, err)
	}
	st, err := startTime(cmd.Process.Pid)
	if err != nil {
		return fmt.Errorf("%s exited at once; see %s", part, log)
	}
	go func() { _ = cmd.Wait() }() // reap it if it dies while up still runs
	r.Processes = append(r.Processes, started{Part: part, PID: cmd.Process.Pid, StartTime: st, Log: log})
	return writeRecord(r)
}

func parseIPs(ips ...string) (out []net.IP) {
	for _, s := range ips {
		out = append(out, net.ParseIP(s))
	}
	return out
}

func etcdArgs(l *layout, url string) []string {
	return []string{
		"--data-dir", l.path("etcd"), "--listen-client-url", url,
		"--listen-peer-url", fmt.Sprintf("http://127.0.0.1:%d", l.EtcdPeerPort),
	}
}

func apiserverArgs(l *layout, etcdURL string) []string {
	pki := l.path("pki")
	p := func(f string) string { return filepath.Join(pki, f) }
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + l.BridgeIP, "--advertise-address=" + l.BridgeIP,
		"--secure-port=" + strconv.Itoa(l.APIPort),
		"--tls-cert-file=" + p("apiserver.crt"), "--tls-private-key-file=" + p("apiserver.key"),
		"--client-ca-file=" + p("ca.crt"),
		"--service-cluster-ip-range=" + l.ServiceCIDR,
		"--service-account-key-file=" + p("sa.pub"), "--service-account-signing-key-file=" + p("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=Node,RBAC",
		// The defaults (NamespaceLifecycle, ServiceAccount, PodSecurity, ...) stay on;
		// NodeRestriction is the one kubeadm adds beside them.
		"--enable-admission-plugins=NodeRestriction",
		"--kubelet-client-certificate=" + p("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + p("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority=" + p("ca.crt"),
		"--kubelet-preferred-address-types=InternalIP",
		// The aggregation layer as kubeadm sets it up (no front-proxy CA of its own here).
		"--requestheader-client-ca-file=" + p("ca.crt"), "--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + p("front-proxy-client.crt"), "--proxy-client-key-file=" + p("front-proxy-client.key"),
		"--allow-privileged=true", "--profiling=false", "--event-ttl=2h",
		"--cert-dir=" + l.path("pki", "apiserver-generated"),
	}
}

func controllerManagerArgs(l *layout) []string {
	kc := l.path("controller-manager.kubeconfig")
	pki := l.path("pki")
	return []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(l.CMPort),
		"--cert-dir=" + l.path("pki", "controller-manager-generated"),
		"--service-account-private-key-file=" + filepath.Join(pki, "sa.key"),
		"--root-ca-file=" + filepath.Join(pki, "ca.crt"),
		"--cluster-signing-cert-file=" + filepath.Join(pki, "ca.crt"),
		"--cluster-signing-key-file=" + filepath.Join(pki, "ca.key"),
		"--use-service-account-credentials=true",
		"--controllers=*,bootstrapsigner,tokencleaner",
		"--service-cluster-ip-range=" + l.ServiceCIDR,
		"--leader-elect=false", "--profiling=false",
	}
}

func schedulerArgs(l *layout) []string {
	kc := l.path("scheduler.kubeconfig")
	return []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(l.SchedPort),
		"--cert-dir=" + l.path("pki", "scheduler-generated"),
		"--leader-elect=false", "--profiling=false",
	}
}

type planeNode struct {
	Name       string            `json:"name"`
	Kubeconfig string            `json:"kubeconfig"`
	Labels     map[string]string `json:"labels"`
	Capacity   map[string]string `json:"capacity"`
}

// planeNodes: two 8-GPU nodes shaped like a cloud's H100 nodes (the labels NVIDIA's GPU
// feature discovery sets) and one CPU node. NodeRestriction lets a node set these on itself.
func planeNodes() []planeNode {
	gpu := func(name string) planeNode {
		return planeNode{Name: name, Labels: map[string]string{
			"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"node.kubernetes.io/instance-type": "servebook-sim.8xh100",
			"nvidia.com/gpu.present":           "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
			"nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559",
		}, Capacity: map[string]string{
			"cpu": "96", "memory": "1Ti", "pods": "110", "ephemeral-storage": "1Ti", "nvidia.com/gpu": "8",
		}}
	}
	return []planeNode{gpu("gpu-0"), gpu("gpu-1"), {Name: "cpu-0", Labels: map[string]string{
		"kubernetes.io/hostname": "cpu-0", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		"node.kubernetes.io/instance-type": "servebook-sim.cpu16",
	}, Capacity: map[string]string{"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "1Ti"}}}
}

func writeAgentConfig(o *upOptions, l *layout) (string, error) {
	nodes := planeNodes()
	for i := range nodes {
		nodes[i].Kubeconfig = l.path("node-" + nodes[i].Name + ".kubeconfig")
	}
	pki := l.path("pki")
	cfg := map[string]any{
		"stateDir": l.path("agent"), "bridge": l.Bridge, "bridgeIP": l.BridgeIP,
		"podCIDR": l.PodCIDR, "serviceCIDR": l.ServiceCIDR, "serviceInterface": l.Bridge + "s",
		"clusterDomain": "cluster.local", "kubeletPort": l.KubeletPort,
		"tlsCert": filepath.Join(pki, "kubelet-serving.crt"), "tlsKey": filepath.Join(pki, "kubelet-serving.key"),
		"clientCA": filepath.Join(pki, "ca.crt"), "nodes": nodes,
		"python": o.python, "pathPrepend": o.pathPrepend, "shimDir": l.path("agent", "shims"),
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return "", err
	}
	path := l.path("agent.json")
	return path, writeFileAtomic(path, data, 0o600)
}

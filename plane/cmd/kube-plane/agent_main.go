package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// The node agent: servebook's kubelet for local processes. It registers the plane's Nodes,
// runs the Pods bound to them as processes in namespaces of their own, serves the kubelet API
// (logs, port-forward, exec), ClusterIP Services and the cluster's DNS.

type agent struct {
	cfg      *agentConfig
	exe      string // this binary: pod-exec and the vllm shim run it
	podPATH  string // PATH inside Pods
	ctx      context.Context
	cancel   context.CancelFunc
	stopping chan struct{}

	ips          *ipAllocator
	procs        *processTable
	mounts       *mountPoints
	nodes        []*nodeAgent
	podInformers []cache.SharedIndexInformer
	services     *serviceProxy
	pods         podRegistry
	dns          *dnsServer
	server       *http.Server
}

// runNodeAgent: `kube-plane node-agent --config FILE.json`. It runs until SIGTERM or SIGINT,
// then stops every Pod process and removes what it made, and exits 0.
func runNodeAgent(args []string) int {
	fs := flag.NewFlagSet("node-agent", flag.ContinueOnError)
	configPath := fs.String("config", "", "the agent's JSON config (written by `kube-plane up`)")
	if err := fs.Parse(args); err != nil || *configPath == "" {
		fmt.Fprintln(os.Stderr, "usage: kube-plane node-agent --config FILE.json")
		return 2
	}
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	cfg, err := loadAgentConfig(*configPath)
	if err != nil {
		log.Printf("node-agent: %v", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	a, err := newAgent(ctx, cfg)
	if err != nil {
		log.Printf("node-agent: %v", err)
		return 1
	}
	err = a.start()
	if err == nil {
		log.Printf("node-agent: ready: %d nodes, kubelet API on %s:%d, DNS on %s:53", len(a.nodes), cfg.BridgeIP, cfg.KubeletPort, cfg.BridgeIP)
		<-ctx.Done()
	} else if ctx.Err() == nil {
		log.Printf("node-agent: %v", err)
	}
	a.shutdown()
	if err != nil && ctx.Err() == nil {
		return 1
	}
	return 0
}

func newAgent(parent context.Context, cfg *agentConfig) (*agent, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ips, err := newIPAllocator(cfg.PodCIDR, cfg.BridgeIP)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(parent)
	// The shims come first: the project's venv has a `vllm` console script that does not work
	// on this machine, and `sh -c "vllm serve ..."` must find the shim instead.
	path := append(append([]string{cfg.ShimDir}, cfg.PathPrepend...), os.Getenv("PATH"))
	return &agent{cfg: cfg, exe: exe, podPATH: strings.Join(path, ":"), ctx: ctx, cancel: cancel,
		stopping: make(chan struct{}), ips: ips, mounts: &mountPoints{},
		procs: newProcessTable(filepath.Join(cfg.StateDir, "processes.json")),
		pods:  podRegistry{workers: map[types.UID]*podWorker{}, finished: map[types.UID]bool{}}}, nil
}

func (a *agent) start() error {
	if err := a.prepareHost(); err != nil {
		return err
	}
	for _, nc := range a.cfg.Nodes {
		n, err := newNodeAgent(a, nc)
		if err != nil {
			return err
		}
		a.nodes = append(a.nodes, n)
	}
	for _, n := range a.nodes {
		if err := retry(a.ctx, func() error { return n.register(a.ctx) }); err != nil {
			return err
		}
		go n.heartbeat(a.ctx)
	}
	svcInformer := informers.NewSharedInformerFactory(a.nodes[0].client, 0).Core().V1().Services().Informer()
	a.services = newServiceProxy(a, svcInformer)
	go svcInformer.Run(a.ctx.Done())
	var err error
	if a.dns, err = startDNS(a.cfg.BridgeIP, a.cfg.ClusterDomain, agentDNS{a}); err != nil {
		return fmt.Errorf("DNS: %w", err)
	}
	if a.server, err = a.startKubeletServer(); err != nil {
		return fmt.Errorf("kubelet API: %w", err)
	}
	// Like the kubelet, start Pods only once Services are known (their env depends on them).
	if !cache.WaitForCacheSync(a.ctx.Done(), svcInformer.HasSynced) {
		return a.ctx.Err()
	}
	for _, n := range a.nodes {
		inf := n.podInformer()
		a.podInformers = append(a.podInformers, inf)
		go inf.Run(a.ctx.Done())
	}
	return nil
}

// prepareHost writes the shims, clears what a killed agent of this plane left behind, and
// makes the service interface.
func (a *agent) prepareHost() error {
	if err := writeShims(a.cfg.ShimDir, a.cfg.Python, a.exe); err != nil {
		return err
	}
	a.removeLeftoverLinks()
	_ = os.RemoveAll(filepath.Join(a.cfg.StateDir, "pods"))
	_ = exec.Command("ip", "link", "del", a.cfg.ServiceInterface).Run()
	// A bridge without ports holds the ClusterIPs as a dummy link would: the dummy module is
	// missing on some machines (containers among them), bridges are not, since the plane needs one.
	if err := ipCmd("link", "add", a.cfg.ServiceInterface, "type", "bridge"); err != nil {
		return err
	}
	return ipCmd("link", "set", a.cfg.ServiceInterface, "up")
}

// removeLeftoverLinks deletes network namespaces and links named <bridge>-*.
func (a *agent) removeLeftoverLinks() {
	prefix := a.cfg.Bridge + "-"
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], prefix) {
				_ = exec.Command("ip", "netns", "del", f[0]).Run()
			}
		}
	}
	if out, err := exec.Command("ip", "-o", "link", "show").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 1 {
				name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
				if strings.HasPrefix(name, prefix) {
					_ = exec.Command("ip", "link", "del", name).Run()
				}
			}
		}
	}
}

func (a *agent) isStopping() bool {
	select {
	case <-a.stopping:
		return true
	default:
		return false
	}
}

// shutdown stops every Pod (SIGTERM, SIGKILL after 5 s), then removes what the agent made.
func (a *agent) shutdown() {
	a.pods.mu.Lock()
	close(a.stopping)
	a.pods.mu.Unlock()
	a.cancel()
	if !a.waitWorkers(8 * time.Second) {
		a.procs.signalAll(syscall.SIGKILL)
		a.waitWorkers(3 * time.Second)
	}
	if a.services != nil {
		a.services.closeAll()
	}
	if a.dns != nil {
		a.dns.close()
	}
	if a.server != nil {
		_ = a.server.Close()
	}
	_ = exec.Command("ip", "link", "del", a.cfg.ServiceInterface).Run()
	a.removeLeftoverLinks()
	a.mounts.removeEmpty()
	for _, n := range a.nodes {
		n.broadcaster.Shutdown()
	}
	log.Printf("node-agent: stopped")
}

// waitWorkers waits for every pod worker to end; false if some are still running after d.
func (a *agent) waitWorkers(d time.Duration) bool {
	deadline := time.After(d)
	for _, w := range a.workerList() {
		select {
		case <-w.done:
		case <-deadline:
			return false
		}
	}
	return true
}

// retry calls f until it succeeds or ctx ends, waiting a little longer each time.
func retry(ctx context.Context, f func() error) error {
	wait := 500 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		log.Printf("node-agent: %v (retrying)", err)
		if !sleepCtx(ctx, wait) {
			return err
		}
		wait = min(2*wait, 10*time.Second)
	}
}

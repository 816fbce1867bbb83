package main

import (
	"context"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
)

// ClusterIP Services: each ClusterIP sits on the service interface (a portless bridge) as a /32 and
// the agent listens on ClusterIP:port, proxying every TCP connection to a ready endpoint, round
// robin, as kube-proxy would route it.
//
// Endpoints come from the Pods the agent runs (every Pod of the plane's nodes) by the
// EndpointSlice controller's rules, because a node's identity may not list EndpointSlices;
// Services without a selector (default/kubernetes) read their Endpoints object, which a node
// may get.

type serviceProxy struct {
	a        *agent
	informer cache.SharedIndexInformer

	mu        sync.Mutex
	listeners map[string]*svcListener // by "ip:port"
	addrs     map[string]bool         // ClusterIPs on the service interface
	manual    map[string]manualEndpoints
}

type svcListener struct {
	ln   net.Listener
	svc  atomic.Pointer[svcPort]
	next atomic.Uint64
}

type svcPort struct {
	namespace, name string
	port            v1.ServicePort
}

// manualEndpoints caches a selectorless Service's Endpoints for a few seconds.
type manualEndpoints struct {
	at  time.Time
	eps *v1.Endpoints
}

func newServiceProxy(a *agent, informer cache.SharedIndexInformer) *serviceProxy {
	p := &serviceProxy{a: a, informer: informer, listeners: map[string]*svcListener{}, addrs: map[string]bool{},
		manual: map[string]manualEndpoints{}}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.reconcile() },
		UpdateFunc: func(any, any) { p.reconcile() },
		DeleteFunc: func(any) { p.reconcile() },
	})
	return p
}

func (p *serviceProxy) list() []*v1.Service {
	var out []*v1.Service
	for _, o := range p.informer.GetStore().List() {
		out = append(out, o.(*v1.Service))
	}
	return out
}

func (p *serviceProxy) get(ns, name string) *v1.Service {
	o, ok, _ := p.informer.GetStore().GetByKey(ns + "/" + name)
	if !ok {
		return nil
	}
	return o.(*v1.Service)
}

// reconcile makes listeners and addresses match the Services.
func (p *serviceProxy) reconcile() {
	want := map[string]svcPort{}
	for _, s := range p.list() {
		if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == v1.ClusterIPNone {
			continue
		}
		for _, port := range s.Spec.Ports {
			if port.Protocol == v1.ProtocolTCP || port.Protocol == "" {
				addr := net.JoinHostPort(s.Spec.ClusterIP, strconv.Itoa(int(port.Port)))
				want[addr] = svcPort{namespace: s.Namespace, name: s.Name, port: port}
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, l := range p.listeners {
		if _, ok := want[addr]; !ok {
			l.ln.Close()
			delete(p.listeners, addr)
		}
	}
	p.syncAddresses(want)
	for addr, sp := range want {
		if l, ok := p.listeners[addr]; ok {
			l.svc.Store(&sp)
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			log.Printf("node-agent: service %s/%s: %v", sp.namespace, sp.name, err)
			continue
		}
		l := &svcListener{ln: ln}
		l.svc.Store(&sp)
		p.listeners[addr] = l
		go p.serve(l)
	}
}

// syncAddresses puts exactly the wanted ClusterIPs on the service interface.
func (p *serviceProxy) syncAddresses(want map[string]svcPort) {
	ips := map[string]bool{}
	for addr := range want {
		ip, _, _ := net.SplitHostPort(addr)
		ips[ip] = true
	}
	for ip := range p.addrs {
		if !ips[ip] {
			_ = ipCmd("addr", "del", ip+"/32", "dev", p.a.cfg.ServiceInterface)
			delete(p.addrs, ip)
		}
	}
	for ip := range ips {
		if !p.addrs[ip] {
			if err := ipCmd("addr", "replace", ip+"/32", "dev", p.a.cfg.ServiceInterface); err != nil {
				log.Printf("node-agent: %v", err)
				continue
			}
			p.addrs[ip] = true
		}
	}
}

func (p *serviceProxy) serve(l *svcListener) {
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			return
		}
		go p.proxy(l, conn)
	}
}

// proxy connects a client to the next ready endpoint; with none, it closes the connection
// (kube-proxy rejects it).
func (p *serviceProxy) proxy(l *svcListener, conn net.Conn) {
	defer conn.Close()
	sp := l.svc.Load()
	eps := p.endpoints(sp.namespace, sp.name, &sp.port)
	if len(eps) == 0 {
		return
	}
	target := eps[int(l.next.Add(1)-1)%len(eps)]
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	pipe(conn, up)
}

// pipe copies both ways until both directions are done, passing half-closes on.
func pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
}

func (p *serviceProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, l := range p.listeners {
		l.ln.Close()
		delete(p.listeners, addr)
	}
}

// endpoints lists "ip:port" of a Service port's ready endpoints.
func (p *serviceProxy) endpoints(ns, name string, port *v1.ServicePort) []string {
	svc := p.get(ns, name)
	if svc == nil {
		return nil
	}
	if svc.Spec.Selector == nil {
		return p.manualEndpoints(ns, name, port)
	}
	var out []string
	for _, pod := range p.a.endpointPods(svc) {
		if target, ok := targetPort(port, pod); ok {
			out = append(out, net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(target)))
		}
	}
	return out
}

func (p *serviceProxy) manualEndpoints(ns, name string, port *v1.ServicePort) []string {
	key := ns + "/" + name
	p.mu.Lock()
	cached, ok := p.manual[key]
	p.mu.Unlock()
	if !ok || time.Since(cached.at) > 5*time.Second {
		ctx, cancel := context.WithTimeout(p.a.ctx, 3*time.Second)
		eps, err := p.a.nodes[0].client.CoreV1().Endpoints(ns).Get(ctx, name, metav1.GetOptions{})
		cancel()
		if err != nil {
			return nil
		}
		cached = manualEndpoints{at: time.Now(), eps: eps}
		p.mu.Lock()
		p.manual[key] = cached
		p.mu.Unlock()
	}
	var out []string
	for _, subset := range cached.eps.Subsets {
		for _, ep := range subset.Ports {
			if ep.Name != port.Name {
				continue
			}
			for _, addr := range subset.Addresses {
				out = append(out, net.JoinHostPort(addr.IP, strconv.Itoa(int(ep.Port))))
			}
		}
	}
	return out
}

// endpointPods are the Pods the EndpointSlice controller would list as ready endpoints of svc:
// selected, with an IP, not terminal, and ready unless the Service publishes unready ones.
func (a *agent) endpointPods(svc *v1.Service) []*v1.Pod {
	if len(svc.Spec.Selector) == 0 {
		return nil
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	var out []*v1.Pod
	for _, pod := range a.podsInNamespace(svc.Namespace) {
		if !sel.Matches(labels.Set(pod.Labels)) || pod.Status.PodIP == "" ||
			pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
			continue
		}
		if svc.Spec.PublishNotReadyAddresses || (pod.DeletionTimestamp == nil && podutil.IsPodReady(pod)) {
			out = append(out, pod)
		}
	}
	return out
}

// targetPort resolves a Service port's targetPort (a number or a container port's name).
func targetPort(sp *v1.ServicePort, pod *v1.Pod) (int, bool) {
	tp := sp.TargetPort
	switch {
	case tp.Type == intstr.Int && tp.IntVal == 0:
		return int(sp.Port), true
	case tp.Type == intstr.Int:
		return int(tp.IntVal), true
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == tp.StrVal && (p.Protocol == sp.Protocol || p.Protocol == "" || sp.Protocol == "") {
				return int(p.ContainerPort), true
			}
		}
	}
	return 0, false
}

package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
)

// A Pod's sandbox: its network namespace (a veth on the plane's bridge, its own Pod IP), and
// the /etc/hosts and /etc/resolv.conf its containers see.

type sandbox struct {
	netns    string // name under /run/netns, also the host end of the veth; empty for hostNetwork
	ip       string
	hostname string
	hosts    string // files bind-mounted over /etc/hosts and /etc/resolv.conf ("" = the host's)
	resolv   string
}

func (s *sandbox) netnsPath() string {
	if s.netns == "" {
		return ""
	}
	return "/run/netns/" + s.netns
}

// setupSandbox makes the sandbox of pod in dir.
func (a *agent) setupSandbox(pod *v1.Pod, dir string) (*sandbox, error) {
	sb := &sandbox{hostname: podHostname(pod)}
	if pod.Spec.HostNetwork {
		// The node's network and UTS namespaces, as on a real node.
		sb.ip, sb.hostname = a.cfg.BridgeIP, ""
		return sb, nil
	}
	ip, err := a.ips.allocate()
	if err != nil {
		return nil, err
	}
	sb.ip = ip
	sb.netns = a.cfg.Bridge + "-" + string(pod.UID)[:8]
	if err := a.makeNetns(sb); err != nil {
		a.teardownSandbox(sb)
		return nil, err
	}
	sb.hosts = filepath.Join(dir, "etc-hosts")
	sb.resolv = filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(sb.hosts, []byte(hostsFile(pod, sb.ip, a.cfg.ClusterDomain)), 0o644); err != nil {
		a.teardownSandbox(sb)
		return nil, err
	}
	if err := os.WriteFile(sb.resolv, []byte(resolvConf(pod, a.cfg.BridgeIP, a.cfg.ClusterDomain)), 0o644); err != nil {
		a.teardownSandbox(sb)
		return nil, err
	}
	return sb, nil
}

func (a *agent) makeNetns(sb *sandbox) error {
	_, cidr, _ := net.ParseCIDR(a.cfg.PodCIDR)
	ones, _ := cidr.Mask.Size()
	ns := sb.netns
	steps := [][]string{
		{"netns", "add", ns},
		{"link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"link", "set", ns, "master", a.cfg.Bridge, "up"},
		{"-n", ns, "addr", "add", fmt.Sprintf("%s/%d", sb.ip, ones), "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "route", "add", "default", "via", a.cfg.BridgeIP},
	}
	for _, args := range steps {
		if err := ipCmd(args...); err != nil {
			return err
		}
	}
	return nil
}

// teardownSandbox deletes the netns (which deletes the veth pair) and frees the IP.
func (a *agent) teardownSandbox(sb *sandbox) {
	if sb.netns != "" {
		_ = ipCmd("netns", "del", sb.netns)
		_ = exec.Command("ip", "link", "del", sb.netns).Run() // gone with the netns unless setup stopped halfway
		a.ips.release(sb.ip)
	}
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// podHostname is the kubelet's: spec.hostname or the Pod's name, at most 63 characters.
func podHostname(pod *v1.Pod) string {
	name := pod.Spec.Hostname
	if name == "" {
		name = pod.Name
	}
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-.")
	}
	return name
}

// hostsFile is the kubelet's managed hosts file.
func hostsFile(pod *v1.Pod, ip, domain string) string {
	var b strings.Builder
	b.WriteString("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n")
	host := podHostname(pod)
	if pod.Spec.Subdomain != "" {
		fmt.Fprintf(&b, "%s\t%s.%s.%s.svc.%s\t%s\n", ip, host, pod.Spec.Subdomain, pod.Namespace, domain, host)
	} else {
		fmt.Fprintf(&b, "%s\t%s\n", ip, host)
	}
	for _, alias := range pod.Spec.HostAliases {
		fmt.Fprintf(&b, "\n# Entries added by HostAliases.\n%s\t%s\n", alias.IP, strings.Join(alias.Hostnames, "\t"))
	}
	return b.String()
}

// resolvConf points every Pod at the agent's DNS server. dnsPolicy Default would give the
// node's resolver on a real node; here that is the same server without the search path, so
// that no lookup ever leaves the machine.
func resolvConf(pod *v1.Pod, nameserver, domain string) string {
	servers := []string{nameserver}
	searches := []string{pod.Namespace + ".svc." + domain, "svc." + domain, domain}
	options := []string{"ndots:5"}
	switch pod.Spec.DNSPolicy {
	case v1.DNSDefault:
		searches, options = nil, nil
	case v1.DNSNone:
		servers, searches, options = nil, nil, nil
	}
	if cfg := pod.Spec.DNSConfig; cfg != nil {
		servers = append(servers, cfg.Nameservers...)
		searches = append(searches, cfg.Searches...)
		for _, o := range cfg.Options {
			if o.Value != nil {
				options = append(options, o.Name+":"+*o.Value)
			} else {
				options = append(options, o.Name)
			}
		}
	}
	var b strings.Builder
	if len(searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(searches, " "))
	}
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if len(options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(options, " "))
	}
	return b.String()
}

// ipAllocator hands out Pod IPs from the Pod CIDR, round robin (as host-local IPAM does, so
// that an IP is not reused at once), never the network, broadcast or bridge address.
type ipAllocator struct {
	mu         sync.Mutex
	first, end uint32 // [first, end)
	bridge     uint32
	next       uint32
	used       map[uint32]bool
}

func newIPAllocator(cidr, bridgeIP string) (*ipAllocator, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, err
	}
	ones, bits := n.Mask.Size()
	base := binary.BigEndian.Uint32(n.IP.To4())
	first := base + 2
	return &ipAllocator{first: first, end: base + 1<<(bits-ones) - 1, next: first,
		bridge: binary.BigEndian.Uint32(net.ParseIP(bridgeIP).To4()), used: map[uint32]bool{}}, nil
}

func (p *ipAllocator) allocate() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for range p.end - p.first {
		ip := p.next
		p.next++
		if p.next >= p.end {
			p.next = p.first
		}
		if ip != p.bridge && !p.used[ip] {
			p.used[ip] = true
			return uint32ToIP(ip), nil
		}
	}
	return "", fmt.Errorf("no free Pod IP left")
}

func (p *ipAllocator) release(ip string) {
	if parsed := net.ParseIP(ip).To4(); parsed != nil {
		p.mu.Lock()
		delete(p.used, binary.BigEndian.Uint32(parsed))
		p.mu.Unlock()
	}
}

func uint32ToIP(v uint32) string {
	b := make(net.IP, 4)
	binary.BigEndian.PutUint32(b, v)
	return b.String()
}

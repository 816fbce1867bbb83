package main

import (
	"encoding/binary"
	"io"
	"net"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	v1 "k8s.io/api/core/v1"
)

// The cluster's DNS, as CoreDNS's kubernetes plugin answers it, on bridgeIP:53 (UDP and TCP):
//   <svc>.<ns>.svc.<domain>                ClusterIP, or the ready endpoints of a headless Service
//   <host>.<subdomain>.<ns>.svc.<domain>   a Pod with that hostname behind headless Service <subdomain>
//   <a-b-c-d>.<ns>.pod.<domain>            a-b-c-d
// Anything else in the cluster domain is NXDOMAIN; any other name is REFUSED and never
// forwarded, so that no lookup leaves the machine.

const dnsTTL = 5 // seconds, CoreDNS's default for the kubernetes plugin

// dnsIndex answers the lookups that depend on cluster state.
type dnsIndex interface {
	serviceIPs(ns, name string) ([]net.IP, bool)
	hostnameIPs(ns, subdomain, hostname string) ([]net.IP, bool)
}

// resolveName returns the A records of name and the response code.
func resolveName(domain string, idx dnsIndex, name string) ([]net.IP, dnsmessage.RCode) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	domain = strings.ToLower(domain)
	if name == domain {
		return nil, dnsmessage.RCodeSuccess
	}
	rest, ok := strings.CutSuffix(name, "."+domain)
	if !ok {
		return nil, dnsmessage.RCodeRefused
	}
	l := strings.Split(rest, ".")
	var ips []net.IP
	found := false
	switch {
	case len(l) == 3 && l[2] == "svc":
		ips, found = idx.serviceIPs(l[1], l[0])
	case len(l) == 4 && l[3] == "svc":
		ips, found = idx.hostnameIPs(l[2], l[1], l[0])
	case len(l) == 3 && l[2] == "pod":
		ip := net.ParseIP(strings.ReplaceAll(l[0], "-", ".")).To4()
		ips, found = []net.IP{ip}, ip != nil
	}
	if !found {
		return nil, dnsmessage.RCodeNameError
	}
	return ips, dnsmessage.RCodeSuccess
}

// dnsAnswer builds the response to a query; nil when the query cannot be parsed. maxSize
// truncates (TC, no answers) a UDP response that would not fit.
func dnsAnswer(domain string, idx dnsIndex, query []byte, maxSize int) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired}
	var ips []net.IP
	rh.RCode = dnsmessage.RCodeRefused
	if h.OpCode == 0 && q.Class == dnsmessage.ClassINET {
		ips, rh.RCode = resolveName(domain, idx, q.Name.String())
		rh.Authoritative = rh.RCode != dnsmessage.RCodeRefused
	}
	if q.Type != dnsmessage.TypeA && q.Type != dnsmessage.TypeALL {
		ips = nil // AAAA and the rest: the name exists but has no such record
	}
	msg := buildDNS(rh, q, ips)
	if len(msg) > maxSize {
		rh.Truncated = true
		msg = buildDNS(rh, q, nil)
	}
	return msg
}

func buildDNS(h dnsmessage.Header, q dnsmessage.Question, ips []net.IP) []byte {
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), h)
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	for _, ip := range ips {
		var a [4]byte
		copy(a[:], ip.To4())
		_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: dnsTTL}, dnsmessage.AResource{A: a})
	}
	msg, _ := b.Finish()
	return msg
}

type dnsServer struct {
	domain string
	idx    dnsIndex
	udp    net.PacketConn
	tcp    net.Listener
}

func startDNS(ip, domain string, idx dnsIndex) (*dnsServer, error) {
	addr := net.JoinHostPort(ip, "53")
	udp, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, err
	}
	tcp, err := net.Listen("tcp", addr)
	if err != nil {
		udp.Close()
		return nil, err
	}
	s := &dnsServer{domain: domain, idx: idx, udp: udp, tcp: tcp}
	go s.serveUDP()
	go s.serveTCP()
	return s, nil
}

func (s *dnsServer) close() {
	s.udp.Close()
	s.tcp.Close()
}

func (s *dnsServer) serveUDP() {
	buf := make([]byte, 4096)
	for {
		n, from, err := s.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		if resp := dnsAnswer(s.domain, s.idx, buf[:n], 512); resp != nil {
			_, _ = s.udp.WriteTo(resp, from)
		}
	}
}

func (s *dnsServer) serveTCP() {
	for {
		conn, err := s.tcp.Accept()
		if err != nil {
			return
		}
		go s.serveConn(conn)
	}
}

// serveConn answers length-prefixed queries until the client is done.
func (s *dnsServer) serveConn(conn net.Conn) {
	defer conn.Close()
	for {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		var n uint16
		if err := binary.Read(conn, binary.BigEndian, &n); err != nil {
			return
		}
		query := make([]byte, n)
		if _, err := io.ReadFull(conn, query); err != nil {
			return
		}
		resp := dnsAnswer(s.domain, s.idx, query, 65535)
		if resp == nil {
			return
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(len(resp)))
		if _, err := conn.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// agentDNS is the agent's dnsIndex, over its Services and Pods.
type agentDNS struct{ a *agent }

func (d agentDNS) serviceIPs(ns, name string) ([]net.IP, bool) {
	svc := d.a.services.get(ns, name)
	if svc == nil {
		return nil, false
	}
	if svc.Spec.ClusterIP != v1.ClusterIPNone {
		if ip := net.ParseIP(svc.Spec.ClusterIP); ip != nil {
			return []net.IP{ip}, true
		}
		return nil, true
	}
	var ips []net.IP
	seen := map[string]bool{}
	for _, pod := range d.a.endpointPods(svc) {
		if !seen[pod.Status.PodIP] {
			seen[pod.Status.PodIP] = true
			ips = append(ips, net.ParseIP(pod.Status.PodIP))
		}
	}
	return ips, true
}

// hostnameIPs: the EndpointSlice controller names an endpoint after its Pod's hostname when
// the Pod's subdomain is the Service's name; CoreDNS serves those names for headless Services.
func (d agentDNS) hostnameIPs(ns, subdomain, hostname string) ([]net.IP, bool) {
	svc := d.a.services.get(ns, subdomain)
	if svc == nil || svc.Spec.ClusterIP != v1.ClusterIPNone {
		return nil, false
	}
	var ips []net.IP
	for _, pod := range d.a.endpointPods(svc) {
		if pod.Spec.Hostname == hostname && pod.Spec.Subdomain == subdomain {
			ips = append(ips, net.ParseIP(pod.Status.PodIP))
		}
	}
	return ips, len(ips) > 0
}

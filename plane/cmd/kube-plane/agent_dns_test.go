package main

import (
	"net"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

type fakeDNSIndex struct{}

func (fakeDNSIndex) serviceIPs(ns, name string) ([]net.IP, bool) {
	switch ns + "/" + name {
	case "default/kubernetes":
		return []net.IP{net.ParseIP("10.163.0.1")}, true
	case "lws/group": // headless, two ready endpoints
		return []net.IP{net.ParseIP("10.103.0.5"), net.ParseIP("10.103.0.6")}, true
	}
	return nil, false
}

func (fakeDNSIndex) hostnameIPs(ns, subdomain, hostname string) ([]net.IP, bool) {
	if ns == "lws" && subdomain == "group" && hostname == "group-0" {
		return []net.IP{net.ParseIP("10.103.0.5")}, true
	}
	return nil, false
}

func TestAgentResolveName(t *testing.T) {
	cases := []struct {
		name  string
		ips   int
		rcode dnsmessage.RCode
	}{
		{"kubernetes.default.svc.cluster.local.", 1, dnsmessage.RCodeSuccess},
		{"KUBERNETES.default.svc.Cluster.Local", 1, dnsmessage.RCodeSuccess},
		{"group.lws.svc.cluster.local.", 2, dnsmessage.RCodeSuccess},
		{"group-0.group.lws.svc.cluster.local.", 1, dnsmessage.RCodeSuccess},
		{"group-1.group.lws.svc.cluster.local.", 0, dnsmessage.RCodeNameError},
		{"10-103-0-7.lws.pod.cluster.local.", 1, dnsmessage.RCodeSuccess},
		{"nope.default.svc.cluster.local.", 0, dnsmessage.RCodeNameError},
		{"kubernetes.default.svc.default.svc.cluster.local.", 0, dnsmessage.RCodeNameError},
		{"cluster.local.", 0, dnsmessage.RCodeSuccess},
		{"example.com.", 0, dnsmessage.RCodeRefused},
		{"huggingface.co.", 0, dnsmessage.RCodeRefused},
	}
	for _, c := range cases {
		ips, rcode := resolveName("cluster.local", fakeDNSIndex{}, c.name)
		if len(ips) != c.ips || rcode != c.rcode {
			t.Errorf("%s: %v %v, want %d addresses and %v", c.name, ips, rcode, c.ips, c.rcode)
		}
	}
}

func query(t *testing.T, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
	msg, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func TestAgentDNSAnswer(t *testing.T) {
	var m dnsmessage.Message
	if err := m.Unpack(dnsAnswer("cluster.local", fakeDNSIndex{}, query(t, "group.lws.svc.cluster.local.", dnsmessage.TypeA), 512)); err != nil {
		t.Fatal(err)
	}
	if m.ID != 7 || !m.Response || m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 2 {
		t.Fatalf("A answer: %+v", m)
	}
	if a := m.Answers[0].Body.(*dnsmessage.AResource).A; net.IP(a[:]).String() != "10.103.0.5" {
		t.Errorf("first A record %v", a)
	}
	if err := m.Unpack(dnsAnswer("cluster.local", fakeDNSIndex{}, query(t, "kubernetes.default.svc.cluster.local.", dnsmessage.TypeAAAA), 512)); err != nil {
		t.Fatal(err)
	}
	if m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 0 {
		t.Errorf("AAAA of a known name: want empty NOERROR, got %v with %d answers", m.RCode, len(m.Answers))
	}
	if err := m.Unpack(dnsAnswer("cluster.local", fakeDNSIndex{}, query(t, "pypi.org.", dnsmessage.TypeA), 512)); err != nil {
		t.Fatal(err)
	}
	if m.RCode != dnsmessage.RCodeRefused {
		t.Errorf("outside name: %v, want REFUSED", m.RCode)
	}
	if err := m.Unpack(dnsAnswer("cluster.local", fakeDNSIndex{}, query(t, "group.lws.svc.cluster.local.", dnsmessage.TypeA), 40)); err != nil {
		t.Fatal(err)
	}
	if !m.Truncated || len(m.Answers) != 0 {
		t.Errorf("oversized UDP answer: want TC and no answers, got %+v", m.Header)
	}
}

package main

// Where a plane lives: its directory, its bridge and addresses, and the record of what `up`
// started (DIR/plane.json), which is all `down` goes by.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// KubeVersion is the Kubernetes release the plane is built from (go.mod pins the same).
var KubeVersion = "unknown" // set at build time from go.mod by scripts/kube-plane

// maxPlanes bounds the bridge index: each plane takes 10.(100+i).0.0/16 for Pods and
// 10.(150+i).0.0/16 for Services, so planes on one machine never overlap.
const maxPlanes = 50

type layout struct {
	Dir          string `json:"dir"`
	Index        int    `json:"index"`
	Bridge       string `json:"bridge"`
	BridgeIP     string `json:"bridgeIP"`
	PodCIDR      string `json:"podCIDR"`
	ServiceCIDR  string `json:"serviceCIDR"`
	KubernetesIP string `json:"kubernetesIP"`
	APIPort      int    `json:"apiPort"`
	EtcdPort     int    `json:"etcdPort"`
	EtcdPeerPort int    `json:"etcdPeerPort"`
	KubeletPort  int    `json:"kubeletPort"`
	CMPort       int    `json:"controllerManagerPort"`
	SchedPort    int    `json:"schedulerPort"`
}

type started struct {
	Part      string `json:"part"`
	PID       int    `json:"pid"`
	StartTime string `json:"startTime"`
	Log       string `json:"log"`
}

type record struct {
	Version    string `json:"version"`
	Server     string `json:"server"`
	Kubeconfig string `json:"kubeconfig"`
	// The tenant's kubeconfig and the namespaces its Role is in (plane_tenant.go).
	TenantKubeconfig string    `json:"tenantKubeconfig"`
	TenantNamespaces []string  `json:"tenantNamespaces"`
	Layout           layout    `json:"layout"`
	Processes        []started `json:"processes"`
	// The binary that started the plane and its digest: the one `down` runs (plane_dir.go).
	Binary       string `json:"binary"`
	BinarySHA256 string `json:"binarySHA256"`
}

func (l *layout) server() string {
	return fmt.Sprintf("https://%s:%d", l.BridgeIP, l.APIPort)
}

func (l *layout) path(parts ...string) string {
	return filepath.Join(append([]string{l.Dir}, parts...)...)
}

// claimBridge takes the first free index by creating its bridge: `ip link add` fails when
// the name exists, so two planes starting at once never take the same addresses.
func claimBridge(dir string) (*layout, error) {
	for i := 0; i < maxPlanes; i++ {
		name := "sbk" + strconv.Itoa(i)
		if _, err := net.InterfaceByName(name); err == nil {
			continue
		}
		if out, err := exec.Command("ip", "link", "add", name, "type", "bridge").CombinedOutput(); err != nil {
			if strings.Contains(string(out), "File exists") {
				continue
			}
			return nil, fmt.Errorf("ip link add %s type bridge: %v: %s", name, err, strings.TrimSpace(string(out)))
		}
		l := &layout{
			Dir:          dir,
			Index:        i,
			Bridge:       name,
			BridgeIP:     fmt.Sprintf("10.%d.0.1", 100+i),
			PodCIDR:      fmt.Sprintf("10.%d.0.0/16", 100+i),
			ServiceCIDR:  fmt.Sprintf("10.%d.0.0/16", 150+i),
			KubernetesIP: fmt.Sprintf("10.%d.0.1", 150+i),
		}
		for _, args := range [][]string{
			{"addr", "add", l.BridgeIP + "/16", "dev", name},
			{"link", "set", name, "up"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				_ = exec.Command("ip", "link", "del", name).Run()
				return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
			}
		}
		return l, nil
	}
	return nil, fmt.Errorf("all %d plane bridges (sbk0..sbk%d) are taken: `scripts/kube-plane down DIR` the planes you no longer need", maxPlanes, maxPlanes-1)
}

// freePort asks the kernel for a port nobody holds on host.
func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (l *layout) choosePorts() error {
	for _, p := range []struct {
		host string
		into *int
	}{
		{l.BridgeIP, &l.APIPort}, {"127.0.0.1", &l.EtcdPort}, {"127.0.0.1", &l.EtcdPeerPort},
		{l.BridgeIP, &l.KubeletPort}, {"127.0.0.1", &l.CMPort}, {"127.0.0.1", &l.SchedPort},
	} {
		port, err := freePort(p.host)
		if err != nil {
			return err
		}
		*p.into = port
	}
	return nil
}

func recordPath(dir string) string { return filepath.Join(dir, "plane.json") }

func readRecord(dir string) (*record, error) {
	data, err := os.ReadFile(recordPath(dir))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s is not a plane record (%v): remove it if no plane runs from %s", recordPath(dir), err, dir)
	}
	return &r, nil
}

func writeRecord(r *record) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(recordPath(r.Layout.Dir), append(data, '\n'), 0o644)
}

// startTime is field 22 of /proc/PID/stat: with the PID it names one process for good, so
// a recycled PID is never taken for one of ours.
func startTime(pid int) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	s := string(data)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return "", errors.New("unreadable /proc stat")
	}
	fields := strings.Fields(s[end+1:])
	if len(fields) < 20 {
		return "", errors.New("short /proc stat")
	}
	return fields[19], nil
}

// alive says whether the process recorded is still the same process.
func (s started) alive() bool {
	now, err := startTime(s.PID)
	return err == nil && now == s.StartTime
}

package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// agentConfig is what `up` writes for the node agent (see runNodeAgent).
type agentConfig struct {
	StateDir         string            `json:"stateDir"`
	Bridge           string            `json:"bridge"`
	BridgeIP         string            `json:"bridgeIP"`
	PodCIDR          string            `json:"podCIDR"`
	ServiceCIDR      string            `json:"serviceCIDR"`
	ServiceInterface string            `json:"serviceInterface"`
	ClusterDomain    string            `json:"clusterDomain"`
	KubeletPort      int               `json:"kubeletPort"`
	TLSCert          string            `json:"tlsCert"`
	TLSKey           string            `json:"tlsKey"`
	ClientCA         string            `json:"clientCA"`
	Nodes            []agentNodeConfig `json:"nodes"`
	Python           string            `json:"python"`
	PathPrepend      []string          `json:"pathPrepend"`
	ShimDir          string            `json:"shimDir"`
}

type agentNodeConfig struct {
	Name       string            `json:"name"`
	Kubeconfig string            `json:"kubeconfig"`
	Labels     map[string]string `json:"labels"`
	Capacity   map[string]string `json:"capacity"`
}

func loadAgentConfig(path string) (*agentConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cfg agentConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if cfg.ClusterDomain == "" {
		cfg.ClusterDomain = "cluster.local"
	}
	return &cfg, cfg.validate()
}

func (c *agentConfig) validate() error {
	for name, p := range map[string]string{"stateDir": c.StateDir, "shimDir": c.ShimDir, "python": c.Python,
		"tlsCert": c.TLSCert, "tlsKey": c.TLSKey, "clientCA": c.ClientCA} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("config: %s must be an absolute path, got %q", name, p)
		}
	}
	if net.ParseIP(c.BridgeIP).To4() == nil {
		return fmt.Errorf("config: bridgeIP %q is not an IPv4 address", c.BridgeIP)
	}
	for _, cidr := range []string{c.PodCIDR, c.ServiceCIDR} {
		if _, _, err := net.ParseCIDR(cidr); err != nil {
			return fmt.Errorf("config: %w", err)
		}
	}
	// Every link and netns the agent makes is named after the bridge so that `down` can find
	// leftovers; Linux allows 15 characters in a link name and the agent adds "-" + 8.
	if c.Bridge == "" || len(c.Bridge) > 6 || c.ServiceInterface == "" {
		return fmt.Errorf("config: bridge (1-6 characters) and serviceInterface are required")
	}
	if len(c.Nodes) == 0 || c.KubeletPort == 0 {
		return fmt.Errorf("config: nodes and kubeletPort are required")
	}
	return nil
}

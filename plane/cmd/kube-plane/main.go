// kube-plane is one binary that runs each part of the test control plane, chosen by its
// first argument: kube-apiserver, kube-controller-manager and kube-scheduler are Kubernetes'
// own commands (the same app packages as the release binaries); etcd is etcd's embed server;
// node-agent is servebook's kubelet for local processes; up and down manage a whole plane;
// kubectl is Kubernetes' own kubectl of the same release (also when called as `kubectl`).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	if filepath.Base(os.Args[0]) == "kubectl" {
		os.Exit(cli.Run(kubectl.NewDefaultKubectlCommand()))
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kube-plane up|down|kubectl|kube-apiserver|kube-controller-manager|kube-scheduler|etcd|node-agent [flags]")
		os.Exit(2)
	}
	which, rest := os.Args[1], os.Args[2:]
	os.Args = append([]string{which}, rest...)
	switch which {
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubectl":
		os.Exit(cli.Run(kubectl.NewDefaultKubectlCommand()))
	case "etcd":
		os.Exit(runEtcd(rest))
	case "node-agent":
		os.Exit(runNodeAgent(rest))
	case "pod-exec":
		os.Exit(runPodExec(rest))
	case "up":
		os.Exit(runUp(rest))
	case "down":
		os.Exit(runDown(rest))
	default:
		fmt.Fprintf(os.Stderr, "kube-plane: unknown part %q\n", which)
		os.Exit(2)
	}
}

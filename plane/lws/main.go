// lws-controller runs LeaderWorkerSet's own reconcilers and admission webhooks (the packages
// of sigs.k8s.io/lws, as its release binary wires them) against the test plane. The plane
// gives it its kubeconfig, the webhook server's address and its serving certificate (signed
// by the plane's CA, which the webhook configurations trust); LWS's internal certificate
// rotation, leader election, metrics and gang scheduling are off.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	leaderworkersetv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"
	"sigs.k8s.io/lws/pkg/controllers"
	"sigs.k8s.io/lws/pkg/webhooks"
)

func main() {
	// --kubeconfig is controller-runtime's own flag (it registers it), read by ctrl.GetConfig.
	host := flag.String("webhook-host", "127.0.0.1", "address the webhook server listens on")
	port := flag.Int("webhook-port", 9443, "port of the webhook server")
	certDir := flag.String("cert-dir", "", "directory with tls.crt and tls.key for the webhook server")
	flag.Parse()
	ctrl.SetLogger(zap.New())
	if err := run(*host, *port, *certDir); err != nil {
		fmt.Fprintln(os.Stderr, "lws-controller:", err)
		os.Exit(1)
	}
}

func run(host string, port int, certDir string) error {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(leaderworkersetv1.AddToScheme(scheme))
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		WebhookServer:          webhook.NewServer(webhook.Options{Host: host, Port: port, CertDir: certDir}),
	})
	if err != nil {
		return err
	}
	if err := controllers.SetupIndexes(mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := controllers.NewLeaderWorkerSetReconciler(mgr.GetClient(), mgr.GetScheme(),
		mgr.GetEventRecorder("leaderworkerset")).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := controllers.NewPodReconciler(mgr.GetClient(), mgr.GetScheme(),
		mgr.GetEventRecorder("leaderworkerset"), nil).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := webhooks.SetupLeaderWorkerSetWebhook(mgr); err != nil {
		return err
	}
	if err := webhooks.NewPodWebhook(nil).Setup(mgr); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}

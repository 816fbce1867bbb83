package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
)

// Stand-ins for the programs of the serving stacks' images that this machine lacks, so that
// manifests shaped like the stacks' own run on the plane with their labels, ports and argv
// unchanged. Each keeps the part servebook reads (where the engine listens, where its
// counters are, which request reaches which engine) and says in its log what it is.
//
//   - llm-d's routing sidecar (image llm-d-routing-sidecar, args only): listens on --port and
//     forwards every request to the vLLM of its Pod on --vllm-port, as the real one does for a
//     request without a prefill header (llm-d-routing-sidecar's proxy: no
//     x-prefiller-host-port header = decode only). The header is not honoured: the P/D split
//     is left to the entry in front.
//   - NVIDIA Dynamo's vLLM worker (`python3 -m dynamo.vllm`): vLLM's OpenAI server on the
//     worker's system port (DYN_SYSTEM_PORT, 9090), where Dynamo serves health and vLLM's
//     counters; the wrapper's own flags are dropped.
//   - Dynamo's frontend (`python3 -m dynamo.frontend`): finds its graph's ready prefill and
//     decode workers through the API server (Pods labelled
//     nvidia.com/dynamo-graph-deployment-name=$DYN_PARENT_DGD_K8S_NAME, which the operator
//     sets on every component) with the Pod's service account, then runs vllm-router in P/D
//     mode on --http-port. Real Dynamo discovers through etcd/NATS or the Kubernetes API and
//     moves the KV cache with NIXL; here the workers' own --kv-transfer-config does.

const (
	dynamoGraphLabel   = "nvidia.com/dynamo-graph-deployment-name"
	dynamoTypeLabel    = "nvidia.com/dynamo-component-type"
	dynamoSubTypeLabel = "nvidia.com/dynamo-sub-component-type"
	dynamoSystemPort   = 9090
	routingSidecarName = "llm-d-routing-sidecar"
)

// pythonModule splits a Python argv (without the interpreter) at `-m MODULE`: the
// interpreter's own options before it, the module, and the module's arguments. ok is false
// when the argv runs a script, -c or nothing.
func pythonModule(args []string) (opts []string, module string, rest []string, ok bool) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-m" && i+1 < len(args):
			return args[:i], args[i+1], args[i+2:], true
		case strings.HasPrefix(a, "-m") && len(a) > 2:
			return args[:i], a[2:], args[i+1:], true
		case a == "-X" || a == "-W" || a == "--check-hash-based-pycs":
			i++ // the option's value
		case a == "-c" || a == "-" || !strings.HasPrefix(a, "-"):
			return nil, "", nil, false
		}
	}
	return nil, "", nil, false
}

// standInModule: whether pod-exec's python shim stands in for this module.
func standInModule(module string) bool {
	return module == "dynamo.vllm" || module == "dynamo.frontend"
}

// execPythonShim is what the python shims (and a container's own `python -m dynamo.*`) run.
func execPythonShim(python string, args []string) int {
	if _, module, rest, ok := pythonModule(args); ok {
		switch module {
		case "dynamo.vllm":
			argv := dynamoWorkerArgv(python, rest, os.Getenv("DYN_SYSTEM_PORT"))
			fmt.Fprintf(os.Stderr, "servebook node agent: Dynamo's vLLM worker stands in as vLLM's server on the system port: %s\n", describeArgv(argv))
			err := syscall.Exec(python, argv, os.Environ())
			return podExecFail(126, fmt.Errorf("exec %s: %w", python, err))
		case "dynamo.frontend":
			return runDynamoFrontend(rest)
		}
	}
	err := syscall.Exec(python, append([]string{python}, args...), os.Environ())
	return podExecFail(126, fmt.Errorf("exec %s: %w", python, err))
}

// dynamoWrapperFlags are dynamo.vllm's own options (its DynamoVllmArgGroup), which vLLM's
// parser does not know: true when the option takes a value.
var dynamoWrapperFlags = map[string]bool{
	"--disaggregation-mode": true, "--is-prefill-worker": false, "--is-decode-worker": false,
	"--endpoint": true, "--migration-limit": true, "--connector": true, "--use-vllm-tokenizer": false,
	"--dyn-tool-call-parser": true, "--dyn-reasoning-parser": true, "--custom-jinja-template": true,
	"--store-kv": true, "--request-plane": true, "--event-plane": true, "--namespace": true,
	"--enable-local-indexer": false, "--dyn-endpoint-types": true,
}

// dynamoWorkerArgv: the worker's engine arguments for vLLM's server, on the system port.
func dynamoWorkerArgv(python string, args []string, systemPort string) []string {
	port := strconv.Itoa(dynamoSystemPort)
	if n, err := strconv.Atoi(systemPort); err == nil && n > 0 && n < 65536 {
		port = systemPort
	}
	out := []string{python, "-m", vllmServerModule}
	for i := 0; i < len(args); i++ {
		name, _, inline := strings.Cut(args[i], "=")
		takes, known := dynamoWrapperFlags[name]
		if !known {
			out = append(out, args[i])
			continue
		}
		if takes && !inline && i+1 < len(args) {
			i++
		}
	}
	return append(out, "--host", "0.0.0.0", "--port", port)
}

// goFlag reads a Go flag package option (-name V, --name V, -name=V, --name=V); the last wins.
func goFlag(args []string, name string) (string, bool) {
	value, found := "", false
	for i := 0; i < len(args); i++ {
		a := strings.TrimPrefix(strings.TrimPrefix(args[i], "-"), "-")
		if a == args[i] {
			continue
		}
		if k, v, ok := strings.Cut(a, "="); ok && k == name {
			value, found = v, true
		} else if a == name && i+1 < len(args) {
			value, found = args[i+1], true
			i++
		}
	}
	return value, found
}

// routingSidecarPorts reads the sidecar's --port and --vllm-port (its defaults 8000, 8001)
// and refuses the TLS it cannot serve.
func routingSidecarPorts(args []string) (listen, target int, err error) {
	listen, target = 8000, 8001
	for name, p := range map[string]*int{"port": &listen, "vllm-port": &target} {
		if v, ok := goFlag(args, name); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 || n > 65535 {
				return 0, 0, fmt.Errorf("--%s %q is not a port", name, v)
			}
			*p = n
		}
	}
	if v, ok := goFlag(args, "secure-proxy"); !ok || v != "false" {
		return 0, 0, fmt.Errorf("the stand-in serves plain HTTP only: give --secure-proxy=false (the real sidecar's default is true, with a self-signed certificate)")
	}
	return listen, target, nil
}

// routingSidecarHandler forwards every request to the engine on port target of this Pod.
func routingSidecarHandler(target int) http.Handler {
	to := &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(target))}
	proxy := httputil.NewSingleHostReverseProxy(to)
	proxy.FlushInterval = -1 // stream server-sent events as they come
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := r.Header.Get("x-prefiller-host-port"); h != "" {
			fmt.Fprintf(os.Stderr, "llm-d routing sidecar stand-in: header x-prefiller-host-port %q not honoured: decode only\n", h)
		}
		proxy.ServeHTTP(w, r)
	})
}

func runRoutingSidecar(args []string) int {
	listen, target, err := routingSidecarPorts(args)
	if err != nil {
		return podExecFail(2, fmt.Errorf("llm-d routing sidecar stand-in: %w", err))
	}
	fmt.Fprintf(os.Stderr, "servebook node agent: llm-d's routing sidecar stands in as a plain proxy: :%d -> 127.0.0.1:%d\n", listen, target)
	err = http.ListenAndServe(net.JoinHostPort("", strconv.Itoa(listen)), routingSidecarHandler(target))
	return podExecFail(1, fmt.Errorf("llm-d routing sidecar stand-in: %w", err))
}

// dynamoWorker is a ready worker Pod of the frontend's graph.
type dynamoWorker struct {
	role, url string
}

// dynamoRole: prefill or decode from the component labels (type prefill|decode, or the older
// type worker with a sub-component type); "" for anything else.
func dynamoRole(labels map[string]string) string {
	role := labels[dynamoTypeLabel]
	if role == "worker" {
		role = labels[dynamoSubTypeLabel]
	}
	if role == "prefill" || role == "decode" {
		return role
	}
	return ""
}

// dynamoSystemPortOf: the worker container's port named system, else its DYN_SYSTEM_PORT.
func dynamoSystemPortOf(pod *v1.Pod) int {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == "system" {
				return int(p.ContainerPort)
			}
		}
		for _, e := range c.Env {
			if n, err := strconv.Atoi(e.Value); e.Name == "DYN_SYSTEM_PORT" && err == nil && n > 0 {
				return n
			}
		}
	}
	return dynamoSystemPort
}

// dynamoWorkers: the ready prefill and decode workers among pods, by URL.
func dynamoWorkers(pods []v1.Pod) []dynamoWorker {
	var out []dynamoWorker
	for i := range pods {
		p := &pods[i]
		role := dynamoRole(p.Labels)
		if role == "" || p.DeletionTimestamp != nil || p.Status.PodIP == "" || !podutil.IsPodReady(p) {
			continue
		}
		u := "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(dynamoSystemPortOf(p)))
		out = append(out, dynamoWorker{role, u})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].role+out[i].url < out[j].role+out[j].url })
	return out
}

// dynamoRouterArgv: vllm-router in P/D mode over the workers, on the frontend's port.
func dynamoRouterArgv(workers []dynamoWorker, port string) []string {
	argv := []string{"vllm-router", "--vllm-pd-disaggregation"}
	for _, w := range workers {
		argv = append(argv, "--"+w.role, w.url)
	}
	return append(argv, "--host", "0.0.0.0", "--port", port)
}

func runDynamoFrontend(args []string) int {
	port := "8000"
	if v, ok := goFlag(args, "http-port"); ok {
		port = v
	} else if v := os.Getenv("DYN_HTTP_PORT"); v != "" {
		port = v
	}
	graph := os.Getenv("DYN_PARENT_DGD_K8S_NAME")
	if graph == "" {
		return podExecFail(2, fmt.Errorf("Dynamo frontend stand-in: DYN_PARENT_DGD_K8S_NAME is not set: it names the graph whose workers the frontend serves (the operator sets it on every component)"))
	}
	ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return podExecFail(2, fmt.Errorf("Dynamo frontend stand-in: no service account in this Pod to find the workers with: %w", err))
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return podExecFail(2, fmt.Errorf("Dynamo frontend stand-in: %w", err))
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return podExecFail(2, fmt.Errorf("Dynamo frontend stand-in: %w", err))
	}
	selector := dynamoGraphLabel + "=" + graph
	fmt.Fprintf(os.Stderr, "servebook node agent: Dynamo's frontend stands in as vllm-router over the ready workers of %s/%s (Pods %s)\n", ns, graph, selector)
	var last string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		list, err := client.CoreV1().Pods(string(ns)).List(ctx, metav1.ListOptions{LabelSelector: selector})
		cancel()
		var workers []dynamoWorker
		say := ""
		if err != nil {
			say = fmt.Sprintf("listing the workers: %v", err)
		} else {
			workers = dynamoWorkers(list.Items)
			roles := map[string]bool{}
			for _, w := range workers {
				roles[w.role] = true
			}
			if roles["prefill"] && roles["decode"] {
				argv := dynamoRouterArgv(workers, port)
				path, err := lookPath(argv[0], os.Getenv("PATH"), isExecutable)
				if err != nil {
					return podExecFail(127, err)
				}
				fmt.Fprintf(os.Stderr, "servebook node agent: %s\n", strings.Join(argv, " "))
				err = syscall.Exec(path, argv, os.Environ())
				return podExecFail(126, fmt.Errorf("exec %s: %w", path, err))
			}
			say = fmt.Sprintf("waiting for a ready prefill and a ready decode worker (ready now: %d)", len(workers))
		}
		if say != last {
			fmt.Fprintf(os.Stderr, "Dynamo frontend stand-in: %s\n", say)
			last = say
		}
		time.Sleep(2 * time.Second)
	}
}

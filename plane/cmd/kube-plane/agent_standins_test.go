package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAgentPythonModule(t *testing.T) {
	cases := []struct {
		args       []string
		module     string
		opts, rest []string
		ok         bool
	}{
		{[]string{"-m", "dynamo.vllm", "--model", "m"}, "dynamo.vllm", []string{}, []string{"--model", "m"}, true},
		{[]string{"-u", "-X", "dev", "-m", "dynamo.frontend"}, "dynamo.frontend", []string{"-u", "-X", "dev"}, []string{}, true},
		{[]string{"-mdynamo.vllm", "a"}, "dynamo.vllm", []string{}, []string{"a"}, true},
		{[]string{"script.py", "-m", "dynamo.vllm"}, "", nil, nil, false},
		{[]string{"-c", "import x", "-m", "y"}, "", nil, nil, false},
		{nil, "", nil, nil, false},
	}
	for _, c := range cases {
		opts, module, rest, ok := pythonModule(c.args)
		if ok != c.ok || module != c.module || (ok && (!reflect.DeepEqual(append([]string{}, opts...), c.opts) || !reflect.DeepEqual(append([]string{}, rest...), c.rest))) {
			t.Errorf("pythonModule(%q) = %q %q %q %v", c.args, opts, module, rest, ok)
		}
	}
}

func TestAgentLocalArgvDynamo(t *testing.T) {
	// Shapes from ai-dynamo/dynamo examples/backends/vllm/deploy/disagg.yaml.
	got := localArgv([]string{"python3", "-m", "dynamo.vllm", "--model", "m"}, testPython, "/bin/kube-plane")
	want := []string{"/bin/kube-plane", "pod-exec", "python-shim", testPython, "-m", "dynamo.vllm", "--model", "m"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("dynamo.vllm: %q", got)
	}
	if got := localArgv([]string{"python3", "-m", "dynamo.planner"}, testPython, "/bin/kube-plane"); got[0] != testPython {
		t.Errorf("a module without a stand-in runs as it is: %q", got)
	}
}

func TestAgentDynamoWorkerArgv(t *testing.T) {
	args := []string{"--model", "/models/tiny", "--served-model-name", "tiny", "--disaggregation-mode", "prefill",
		"--is-prefill-worker", "--migration-limit=3", "--kv-transfer-config", `{"kv_connector":"NixlConnector"}`, "--enforce-eager"}
	got := dynamoWorkerArgv(testPython, args, "9345")
	want := []string{testPython, "-m", vllmServerModule, "--model", "/models/tiny", "--served-model-name", "tiny",
		"--kv-transfer-config", `{"kv_connector":"NixlConnector"}`, "--enforce-eager", "--host", "0.0.0.0", "--port", "9345"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if got := dynamoWorkerArgv(testPython, nil, "not a port"); got[len(got)-1] != "9090" {
		t.Errorf("default system port: %q", got)
	}
}

func TestAgentRoutingSidecarImage(t *testing.T) {
	// llm-d-modelservice's decode Pod: image and args only, no command.
	got, err := containerArgv("ghcr.io/llm-d/llm-d-routing-sidecar:v0.3.0", nil, []string{"--port=8000", "--vllm-port=8200"})
	if err != nil || !reflect.DeepEqual(got, []string{routingSidecarName, "--port=8000", "--vllm-port=8200"}) {
		t.Errorf("%q %v", got, err)
	}
}

func TestAgentRoutingSidecarPorts(t *testing.T) {
	l, tgt, err := routingSidecarPorts([]string{"--port=8000", "--vllm-port", "8200", "--connector=nixlv2", "-secure-proxy=false"})
	if err != nil || l != 8000 || tgt != 8200 {
		t.Errorf("%d %d %v", l, tgt, err)
	}
	if _, _, err := routingSidecarPorts([]string{"--port=8000", "--vllm-port=8200"}); err == nil || !strings.Contains(err.Error(), "--secure-proxy=false") {
		t.Errorf("TLS by default is refused naming the flag: %v", err)
	}
	if _, _, err := routingSidecarPorts([]string{"--vllm-port=x", "--secure-proxy=false"}); err == nil || !strings.Contains(err.Error(), "--vllm-port") {
		t.Errorf("a bad port: %v", err)
	}
}

func TestAgentRoutingSidecarForwards(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Write([]byte("engine " + r.Method + " " + r.URL.Path + " " + string(body)))
	}))
	defer engine.Close()
	_, port, _ := net.SplitHostPort(engine.Listener.Addr().String())
	n, _ := strconv.Atoi(port)
	sidecar := httptest.NewServer(routingSidecarHandler(n))
	defer sidecar.Close()
	resp, err := http.Post(sidecar.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != `engine POST /v1/completions {"prompt":"x"}` {
		t.Errorf("%q", got)
	}
}

func dynPod(name string, labels map[string]string, ip string, ready bool, ports ...v1.ContainerPort) v1.Pod {
	status := v1.ConditionFalse
	if ready {
		status = v1.ConditionTrue
	}
	return v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "main", Ports: ports}}},
		Status:     v1.PodStatus{PodIP: ip, Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: status}}},
	}
}

func TestAgentDynamoWorkers(t *testing.T) {
	// Both labellings of ai-dynamo's operator (deploy/operator/internal/consts): type
	// prefill|decode, and the older type worker + sub-component type.
	old := map[string]string{dynamoGraphLabel: "g", dynamoTypeLabel: "worker", dynamoSubTypeLabel: "prefill"}
	pods := []v1.Pod{
		dynPod("front", map[string]string{dynamoGraphLabel: "g", dynamoTypeLabel: "frontend"}, "10.0.0.1", true),
		dynPod("p", old, "10.0.0.2", true, v1.ContainerPort{Name: "system", ContainerPort: 9091}),
		dynPod("d", map[string]string{dynamoGraphLabel: "g", dynamoTypeLabel: "decode"}, "10.0.0.3", true),
		dynPod("d-starting", map[string]string{dynamoGraphLabel: "g", dynamoTypeLabel: "decode"}, "10.0.0.4", false),
	}
	got := dynamoWorkers(pods)
	want := []dynamoWorker{{"decode", "http://10.0.0.3:9090"}, {"prefill", "http://10.0.0.2:9091"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%v", got)
	}
	argv := dynamoRouterArgv(got, "8000")
	if strings.Join(argv, " ") != "vllm-router --vllm-pd-disaggregation --decode http://10.0.0.3:9090 --prefill http://10.0.0.2:9091 --host 0.0.0.0 --port 8000" {
		t.Errorf("%q", argv)
	}
}

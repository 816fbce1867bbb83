package main

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const testPython = "/venv/bin/python"

func TestAgentContainerArgv(t *testing.T) {
	cases := []struct {
		name          string
		image         string
		command, args []string
		want          []string
	}{
		{"command and args", "busybox", []string{"sh", "-c"}, []string{"exit 3"}, []string{"sh", "-c", "exit 3"}},
		{"vllm image args", "vllm/vllm-openai:v0.9.0", nil, []string{"Qwen/Qwen3-0.6B", "--port", "8000"},
			[]string{"vllm", "serve", "Qwen/Qwen3-0.6B", "--port", "8000"}},
		{"cpu image", "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.9", nil, nil, []string{"vllm", "serve"}},
		{"router image", "ghcr.io/vllm-project/vllm-router@sha256:abc", nil, []string{"--port", "80"},
			[]string{"vllm-router", "--port", "80"}},
	}
	for _, c := range cases {
		got, err := containerArgv(c.image, c.command, c.args)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	if got, err := containerArgv("busybox", nil, []string{"sh", "-c", "true"}); err != nil || len(got) != 3 || got[0] != "sh" {
		t.Errorf("args of an image without an entrypoint: %q, %v", got, err)
	}
	_, err := containerArgv("nginx:1.27", nil, nil)
	if !errors.As(err, new(errCannotRun)) {
		t.Errorf("nginx without command or args: want errCannotRun, got %v", err)
	}
}

func TestAgentImageRepository(t *testing.T) {
	for in, want := range map[string]string{
		"localhost:5000/vllm/vllm-openai:latest": "localhost:5000/vllm/vllm-openai",
		"python:3.12":                            "python",
		"Repo/Img@sha256:0123":                   "repo/img",
	} {
		if got := imageRepository(in); got != want {
			t.Errorf("imageRepository(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestAgentLocalArgv(t *testing.T) {
	server := []string{testPython, "-m", vllmServerModule}
	cases := []struct{ in, want []string }{
		{[]string{"python3", "-m", "http.server", "8080"}, []string{testPython, "-m", "http.server", "8080"}},
		{[]string{"/usr/bin/python3.12", "x.py"}, []string{testPython, "x.py"}},
		{[]string{"python3-config"}, []string{"python3-config"}},
		{[]string{"vllm", "serve", "m", "--port", "8000"}, append(append([]string{}, server...), "--model", "m", "--port", "8000")},
		// The model after flags: a flag's value is not the model, a boolean flag has none.
		{[]string{"vllm", "serve", "--port", "8000", "--enforce-eager", "m", "--dtype", "bfloat16"},
			append(append([]string{}, server...), "--model", "m", "--port", "8000", "--enforce-eager", "--dtype", "bfloat16")},
		{[]string{"vllm", "serve", "--no-enable-prefix-caching", "m"}, append(append([]string{}, server...), "--model", "m", "--no-enable-prefix-caching")},
		{[]string{"vllm", "serve", "--model=m", "--port=1"}, append(append([]string{}, server...), "--model=m", "--port=1")},
		{[]string{"/opt/venv/bin/vllm", "serve", "--model", "m"}, append(append([]string{}, server...), "--model", "m")},
		{[]string{"vllm", "bench"}, []string{"vllm", "bench"}},
		{[]string{"vllm-router", "--port", "1"}, []string{"vllm-router", "--port", "1"}},
	}
	for _, c := range cases {
		if got := localArgv(c.in, testPython, "/bin/kube-plane"); !reflect.DeepEqual(got, c.want) {
			t.Errorf("localArgv(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestAgentLookPathThroughMounts(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "start.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	exists := existsInMounts([]bindMount{{Source: dir, Target: "/scripts"}})
	if p, err := lookPath("/scripts/start.sh", "", exists); err != nil || p != "/scripts/start.sh" {
		t.Errorf("script in a mounted volume: %q, %v", p, err)
	}
	if p, err := lookPath("start.sh", "/nowhere:/scripts", exists); err != nil || p != "/scripts/start.sh" {
		t.Errorf("script on PATH through a mount: %q, %v", p, err)
	}
	_, err := lookPath("no-such-command-here", "/nowhere", exists)
	if err == nil || err.Error() != `exec: "no-such-command-here": executable file not found in $PATH` {
		t.Errorf("missing command: %v", err)
	}
}

func TestAgentShims(t *testing.T) {
	dir := t.TempDir()
	if err := writeShims(dir, "/py it's", "/bin/kube-plane"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "vllm"))
	if err != nil {
		t.Fatal(err)
	}
	want := "exec '/bin/kube-plane' pod-exec vllm-shim '/py it'\\''s' \"$@\"\n"
	if !strings.HasPrefix(string(data), "#!/bin/sh\n") || !strings.HasSuffix(string(data), want) {
		t.Errorf("vllm shim:\n%s\nwant:\n%s", data, want)
	}
}

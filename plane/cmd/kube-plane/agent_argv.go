package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Images are never pulled: a container runs a command of this machine. This file maps a
// container's image, command and args to the argv that runs here.

const vllmServerModule = "vllm.entrypoints.openai.api_server"

// errCannotRun is a CreateContainerError: the container stays waiting with this message.
type errCannotRun struct{ msg string }

func (e errCannotRun) Error() string { return e.msg }

// containerArgv is the kubelet's rule (command + args; args alone append to the image's
// entrypoint) with the entrypoints of the images this agent knows standing in for pulled ones.
func containerArgv(image string, command, args []string) ([]string, error) {
	if len(command) > 0 {
		return append(append([]string{}, command...), args...), nil
	}
	repo := imageRepository(image)
	switch {
	case strings.Contains(repo, "vllm-router"):
		return append([]string{"vllm-router"}, args...), nil
	case strings.Contains(repo, routingSidecarName):
		return append([]string{routingSidecarName}, args...), nil
	case strings.Contains(repo, "vllm-openai"), strings.Contains(repo, "vllm-cpu"), strings.Contains(repo, "vllm/vllm"):
		return append([]string{"vllm", "serve"}, args...), nil
	case len(args) > 0:
		// Most other images (busybox, python, debian) have no ENTRYPOINT: args are the command,
		// as with `kubectl run --image=busybox -- sh -c ...`.
		return append([]string{}, args...), nil
	}
	return nil, errCannotRun{fmt.Sprintf("servebook's node agent does not pull images, and image %q is not one whose command it knows: "+
		"give the container a command (python, vllm serve, vllm-router or any program on this machine's PATH), "+
		"or use a vLLM (vllm-openai, vllm-cpu, vllm/vllm) or vllm-router image", image)}
}

// imageRepository strips the tag and digest: "reg:5000/a/b:tag@sha256:.." -> "reg:5000/a/b".
func imageRepository(image string) string {
	repo, _, _ := strings.Cut(image, "@")
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	return strings.ToLower(repo)
}

var pythonName = regexp.MustCompile(`^python(3(\.[0-9]+)?)?$`)

// localArgv rewrites an argv for this machine: Python runs config.python (through pod-exec's
// python shim, exe, for the modules it stands in for), and `vllm serve` (whose console script
// does not work here) runs vLLM's OpenAI server module.
func localArgv(argv []string, python, exe string) []string {
	base := filepath.Base(argv[0])
	switch {
	case pythonName.MatchString(base):
		if _, module, _, ok := pythonModule(argv[1:]); ok && standInModule(module) {
			return append([]string{exe, "pod-exec", "python-shim", python}, argv[1:]...)
		}
		return append([]string{python}, argv[1:]...)
	case base == "vllm" && len(argv) > 1 && argv[1] == "serve":
		return vllmServeArgv(python, argv[2:])
	}
	return argv
}

// vllmServeArgv turns `vllm serve [flags] MODEL [flags]` into the server module's argv; the
// module has no positional model, so it becomes --model.
func vllmServeArgv(python string, rest []string) []string {
	out := []string{python, "-m", vllmServerModule}
	i := vllmModelIndex(rest)
	if i < 0 {
		return append(out, rest...)
	}
	out = append(out, "--model", rest[i])
	out = append(out, rest[:i]...)
	return append(out, rest[i+1:]...)
}

// vllmModelIndex finds the positional model the way argparse would: the first word that is
// neither a flag nor a flag's value. -1 when there is none.
func vllmModelIndex(words []string) int {
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "-") {
			return i
		}
		if w == "--" {
			if i+1 < len(words) {
				return i + 1
			}
			return -1
		}
		if !strings.Contains(w, "=") && !vllmFlagWithoutValue(w) && i+1 < len(words) && !strings.HasPrefix(words[i+1], "-") {
			i++ // skip the flag's value
		}
	}
	return -1
}

// vllmFlagWithoutValue: vLLM's boolean flags (read from `vllm serve`'s parser of vLLM 0.32:
// every --no-*, --enable-*, --disable-* but one, and these).
func vllmFlagWithoutValue(flag string) bool {
	if flag == "--disable-access-log-for-endpoints" {
		return false
	}
	for _, p := range []string{"--no-", "--enable-", "--disable-"} {
		if strings.HasPrefix(flag, p) {
			return true
		}
	}
	return vllmBoolFlags[flag] || !strings.HasPrefix(flag, "--") // -h and the like
}

var vllmBoolFlags = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`--aggregate-engine-logging --allow-credentials --allow-deprecated-quantization
		--async-scheduling --cohere-is-reasoning-model --cudagraph-metrics --data-parallel-external-lb
		--data-parallel-hybrid-lb --data-parallel-multi-port-external-lb --dcp-q-replicate --enforce-eager
		--exclude-tools-when-tool-choice-none --fail-on-environ-validation --fully-sharded-loras --grpc --headless
		--help --interleave-mm-strings --jit-monitor-verbose --kv-cache-metrics --kv-sharing-fast-prefill
		--language-model-only --log-error-stack --long-prefill-token-threshold-adaptive --mm-device-do-normalize
		--mm-encoder-only --numa-bind --ray-workers-use-nsight --return-sampling-mask --return-tokens-as-token-ids
		--scheduler-reserve-full-isl --skip-mm-profiling --skip-tokenizer-init --sleep-mode-offload-cudagraph
		--specialize-active-lora --swa-bounded-replay --tokens-only --trust-remote-code --trust-request-chat-template
		--trust-request-mm-kwargs --use-fp64-gumbel --use-replayssm --use-tqdm-on-load`) {
		vllmBoolFlags[f] = true
	}
}

// describeArgv is the "runs ..." part of the Pulled event.
func describeArgv(argv []string) string {
	const max = 160
	s := strings.Join(argv, " ")
	if len(s) > max {
		s = s[:max] + "..."
	}
	return s
}

// lookPath finds file on pathEnv like execve's callers do; exists maps a path as the
// container sees it to whether it is an executable file there.
func lookPath(file, pathEnv string, exists func(string) bool) (string, error) {
	if strings.Contains(file, "/") {
		if exists(file) {
			return file, nil
		}
		return "", fmt.Errorf("exec: %q: stat %s: no such file or directory", file, file)
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		if p := filepath.Join(dir, file); exists(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec: %q: executable file not found in $PATH", file)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// writeShims puts python, python3, vllm and llm-d's routing sidecar into shimDir so that shell scripts in Pods
// (`sh -c "vllm serve ..."`) get the same mapping as a container's own command.
func writeShims(shimDir, python, exe string) error {
	if err := os.MkdirAll(shimDir, 0o755); err != nil {
		return err
	}
	// A volume mounted over a directory of this machine hides it inside the container: say so
	// rather than "not found".
	check := fmt.Sprintf("[ -x %[1]s ] || { echo \"servebook node agent: %[1]s is hidden by a volume mounted over it in this container\" >&2; exit 127; }\n",
		shellQuote(python))
	shims := map[string]string{
		"python":           "exec " + shellQuote(exe) + " pod-exec python-shim " + shellQuote(python) + ` "$@"`,
		"python3":          "exec " + shellQuote(exe) + " pod-exec python-shim " + shellQuote(python) + ` "$@"`,
		"vllm":             "exec " + shellQuote(exe) + " pod-exec vllm-shim " + shellQuote(python) + ` "$@"`,
		routingSidecarName: "exec " + shellQuote(exe) + ` pod-exec routing-sidecar "$@"`,
	}
	for name, body := range shims {
		script := "#!/bin/sh\n# written by servebook's node agent\n" + check + body + "\n"
		if err := os.WriteFile(filepath.Join(shimDir, name), []byte(script), 0o755); err != nil {
			return err
		}
	}
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

package main

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func statusPod(policy v1.RestartPolicy, initContainers ...string) *v1.Pod {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Generation: 1},
		Spec: v1.PodSpec{RestartPolicy: policy, Containers: []v1.Container{{Name: "c", Image: "python:3.12"}}}}
	for _, n := range initContainers {
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, v1.Container{Name: n, Image: "busybox"})
	}
	return pod
}

func running(id string) *runView { return &runView{ID: id, StartedAt: t0} }

func exited(id string, code int32) *runView {
	return &runView{ID: id, StartedAt: t0, Exited: true, ExitCode: code, FinishedAt: t0.Add(time.Second)}
}

func view(terminal bool, cs map[string]containerView) podView {
	return podView{SandboxReady: !terminal, PodIP: "10.103.0.2", HostIP: "10.103.0.1", StartTime: t0, Terminal: terminal, Containers: cs}
}

func cond(s v1.PodStatus, typ v1.PodConditionType) v1.PodCondition {
	_, c := podutil.GetPodConditionFromList(s.Conditions, typ)
	if c == nil {
		return v1.PodCondition{}
	}
	return *c
}

func TestAgentStatusCreating(t *testing.T) {
	pod := statusPod(v1.RestartPolicyAlways)
	v := view(false, nil)
	v.SandboxReady, v.PodIP = false, "" // the worker reports no IP before the sandbox
	s := computePodStatus(pod, pod.Status, v, t0)
	if s.Phase != v1.PodPending || s.ContainerStatuses[0].State.Waiting.Reason != "ContainerCreating" {
		t.Errorf("phase %s, state %+v", s.Phase, s.ContainerStatuses[0].State)
	}
	if c := cond(s, v1.PodReadyToStartContainers); c.Status != v1.ConditionFalse {
		t.Errorf("PodReadyToStartContainers %+v", c)
	}
	if c := cond(s, v1.PodReady); c.Status != v1.ConditionFalse || c.Reason != "ContainersNotReady" || c.Message != "containers with unready status: [c]" {
		t.Errorf("Ready %+v", c)
	}
	if c := cond(s, v1.PodInitialized); c.Status != v1.ConditionTrue {
		t.Errorf("Initialized %+v", c)
	}
	if s.PodIP != "" || *s.ContainerStatuses[0].Started || s.HostIP != "10.103.0.1" {
		t.Errorf("before the sandbox: podIP %q, hostIP %q, started %v", s.PodIP, s.HostIP, *s.ContainerStatuses[0].Started)
	}
}

func TestAgentStatusRunningReady(t *testing.T) {
	pod := statusPod(v1.RestartPolicyAlways)
	s := computePodStatus(pod, pod.Status, view(false, map[string]containerView{
		"c": {Current: running("servebook-agent://1"), Started: true, Ready: true}}), t0)
	cs := s.ContainerStatuses[0]
	if s.Phase != v1.PodRunning || !cs.Ready || cs.State.Running == nil || cs.ContainerID != "servebook-agent://1" {
		t.Errorf("phase %s, %+v", s.Phase, cs)
	}
	if c := cond(s, v1.PodReady); c.Status != v1.ConditionTrue || !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("Ready %+v", c)
	}
	// Unchanged conditions keep their transition time.
	later := computePodStatus(pod, s, view(false, map[string]containerView{
		"c": {Current: running("servebook-agent://1"), Started: true, Ready: true}}), t0.Add(time.Hour))
	if c := cond(later, v1.PodReady); !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("Ready moved to %v", c.LastTransitionTime)
	}
}

func TestAgentStatusCrashLoop(t *testing.T) {
	pod := statusPod(v1.RestartPolicyAlways)
	s := computePodStatus(pod, pod.Status, view(false, map[string]containerView{"c": {
		Current: exited("servebook-agent://2", 1), Previous: exited("servebook-agent://1", 1), Restarts: 1,
		Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 10s"}}}), t0)
	cs := s.ContainerStatuses[0]
	if s.Phase != v1.PodRunning || cs.State.Waiting == nil || cs.State.Waiting.Reason != "CrashLoopBackOff" ||
		cs.LastTerminationState.Terminated == nil || cs.LastTerminationState.Terminated.ContainerID != "servebook-agent://2" ||
		cs.RestartCount != 1 || cs.LastTerminationState.Terminated.Reason != "Error" {
		t.Errorf("phase %s, %+v", s.Phase, cs)
	}
}

func TestAgentStatusJobs(t *testing.T) {
	pod := statusPod(v1.RestartPolicyNever)
	failed := computePodStatus(pod, pod.Status, view(true, map[string]containerView{"c": {Current: exited("x", 3)}}), t0)
	if failed.Phase != v1.PodFailed || cond(failed, v1.ContainersReady).Reason != "PodFailed" {
		t.Errorf("exit 3, Never: %s %+v", failed.Phase, failed.Conditions)
	}
	if term := failed.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 3 || term.Reason != "Error" {
		t.Errorf("terminated state %+v", term)
	}
	done := computePodStatus(pod, pod.Status, view(true, map[string]containerView{"c": {Current: exited("x", 0)}}), t0)
	if done.Phase != v1.PodSucceeded || cond(done, v1.PodReady).Reason != "PodCompleted" || cond(done, v1.PodInitialized).Reason != "PodCompleted" {
		t.Errorf("exit 0, Never: %s %+v", done.Phase, done.Conditions)
	}
	if done.ContainerStatuses[0].State.Terminated.Reason != "Completed" {
		t.Errorf("reason %q", done.ContainerStatuses[0].State.Terminated.Reason)
	}
	// OnFailure with a failure is being restarted: Running, not Failed.
	pod.Spec.RestartPolicy = v1.RestartPolicyOnFailure
	retry := computePodStatus(pod, pod.Status, view(false, map[string]containerView{"c": {Current: exited("x", 3)}}), t0)
	if retry.Phase != v1.PodRunning {
		t.Errorf("exit 3, OnFailure: %s", retry.Phase)
	}
	// A terminal phase never changes back.
	pod.Status.Phase = v1.PodSucceeded
	again := computePodStatus(pod, pod.Status, view(false, map[string]containerView{"c": {Current: running("y")}}), t0)
	if again.Phase != v1.PodSucceeded {
		t.Errorf("terminal phase changed to %s", again.Phase)
	}
}

func TestAgentStatusInit(t *testing.T) {
	pod := statusPod(v1.RestartPolicyAlways, "init")
	s := computePodStatus(pod, pod.Status, view(false, map[string]containerView{"init": {Current: running("i"), Started: true}}), t0)
	if s.Phase != v1.PodPending || s.ContainerStatuses[0].State.Waiting.Reason != "PodInitializing" {
		t.Errorf("phase %s, %+v", s.Phase, s.ContainerStatuses[0].State)
	}
	if c := cond(s, v1.PodInitialized); c.Status != v1.ConditionFalse || c.Message != "containers with incomplete status: [init]" {
		t.Errorf("Initialized %+v", c)
	}
	s = computePodStatus(pod, pod.Status, view(false, map[string]containerView{"init": {Current: exited("i", 0)},
		"c": {Current: running("c"), Started: true, Ready: true}}), t0)
	if s.Phase != v1.PodRunning || !s.InitContainerStatuses[0].Ready || cond(s, v1.PodInitialized).Status != v1.ConditionTrue {
		t.Errorf("after init: %s %+v", s.Phase, s.InitContainerStatuses[0])
	}
	pod.Spec.RestartPolicy = v1.RestartPolicyNever
	s = computePodStatus(pod, pod.Status, view(true, map[string]containerView{"init": {Current: exited("i", 1)}}), t0)
	if s.Phase != v1.PodFailed {
		t.Errorf("failed init with Never: %s", s.Phase)
	}
}

func TestAgentStatusSidecar(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	pod := statusPod(v1.RestartPolicyNever, "proxy")
	pod.Spec.InitContainers[0].RestartPolicy = &always
	s := computePodStatus(pod, pod.Status, view(false, map[string]containerView{
		"proxy": {Current: running("s"), Started: true, Ready: true}, "c": {Current: running("c"), Started: true, Ready: true}}), t0)
	if s.Phase != v1.PodRunning || !s.InitContainerStatuses[0].Ready || cond(s, v1.PodReady).Status != v1.ConditionTrue {
		t.Errorf("sidecar running: %s %+v", s.Phase, s.Conditions)
	}
	// The main container finished; the sidecar was stopped: the Pod succeeded.
	s = computePodStatus(pod, pod.Status, view(true, map[string]containerView{
		"proxy": {Current: exited("s", 143)}, "c": {Current: exited("c", 0)}}), t0)
	if s.Phase != v1.PodSucceeded {
		t.Errorf("sidecar stopped after the job: %s", s.Phase)
	}
}

func TestAgentBackoff(t *testing.T) {
	c := &container{}
	now := t0
	var waits []time.Duration
	for i := 0; i < 7; i++ {
		c.cur = &containerRun{finishedAt: now, exitCode: 1}
		if wait, until := c.inBackoff(now); wait {
			waits = append(waits, until.Sub(now))
			now = until
		}
		c.nextBackoff(now)
		now = now.Add(time.Second) // runs for a second, then fails again
	}
	want := []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second, 300 * time.Second}
	if len(waits) != len(want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	for i := range want {
		if waits[i] != want[i] {
			t.Errorf("wait %d: %v, want %v", i, waits[i], want[i])
		}
	}
	// After running for more than 10 minutes the back-off starts over.
	c.cur.finishedAt = now.Add(11 * time.Minute)
	if wait, _ := c.inBackoff(c.cur.finishedAt); wait {
		t.Error("back-off did not reset after a long run")
	}
}

func TestAgentLogContainerID(t *testing.T) {
	st := &v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: "c",
		State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}}
	if _, err := logContainerID("p", st, "c", false); err == nil || err.Error() != `container "c" in pod "p" is waiting to start: ContainerCreating` {
		t.Errorf("waiting: %v", err)
	}
	if _, err := logContainerID("p", st, "c", true); err == nil || err.Error() != `previous terminated container "c" in pod "p" not found` {
		t.Errorf("previous: %v", err)
	}
	st.ContainerStatuses[0].LastTerminationState.Terminated = &v1.ContainerStateTerminated{ContainerID: "servebook-agent://old"}
	st.ContainerStatuses[0].State = v1.ContainerState{Running: &v1.ContainerStateRunning{}}
	st.ContainerStatuses[0].ContainerID = "servebook-agent://new"
	if id, _ := logContainerID("p", st, "c", true); id != "servebook-agent://old" {
		t.Errorf("previous id %q", id)
	}
	if id, _ := logContainerID("p", st, "c", false); id != "servebook-agent://new" {
		t.Errorf("current id %q", id)
	}
}

func TestAgentIPAllocator(t *testing.T) {
	p, err := newIPAllocator("10.103.0.0/29", "10.103.0.3")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		ip, err := p.allocate()
		if err != nil {
			break
		}
		got = append(got, ip)
	}
	want := []string{"10.103.0.2", "10.103.0.4", "10.103.0.5", "10.103.0.6"}
	if len(got) != len(want) {
		t.Fatalf("allocated %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("allocated %v, want %v", got, want)
		}
	}
	p.release("10.103.0.4")
	if ip, _ := p.allocate(); ip != "10.103.0.4" {
		t.Errorf("after release: %s", ip)
	}
}

// A Pod past its activeDeadlineSeconds: Failed with the kubelet's reason and message, its
// containers' last states as they ended, not Ready; a Pod without the field has no deadline.
func TestAgentStatusDeadlineExceeded(t *testing.T) {
	pod := statusPod(v1.RestartPolicyAlways)
	d := int64(30)
	pod.Spec.ActiveDeadlineSeconds = &d
	if end, ok := activeDeadline(pod, t0); !ok || !end.Equal(t0.Add(30*time.Second)) {
		t.Errorf("deadline %v %v", end, ok)
	}
	if _, ok := activeDeadline(statusPod(v1.RestartPolicyAlways), t0); ok {
		t.Error("a Pod without activeDeadlineSeconds has a deadline")
	}
	v := view(true, map[string]containerView{"c": {Current: exited("servebook-agent://1", 137)}})
	v.FailReason, v.FailMessage = deadlineReason, deadlineMessage
	s := computePodStatus(pod, pod.Status, v, t0)
	if s.Phase != v1.PodFailed || s.Reason != "DeadlineExceeded" || s.Message != "Pod was active on the node longer than the specified deadline" {
		t.Errorf("phase %s, reason %q, message %q", s.Phase, s.Reason, s.Message)
	}
	if term := s.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 137 || term.Reason != "Error" {
		t.Errorf("container %+v", s.ContainerStatuses[0].State)
	}
	if c := cond(s, v1.PodReady); c.Status != v1.ConditionFalse || c.Reason != "PodFailed" {
		t.Errorf("Ready %+v", c)
	}
	// A Pod that never started a container (its volume never mounted) fails the same way.
	never := view(true, nil)
	never.FailReason, never.FailMessage = deadlineReason, deadlineMessage
	if s := computePodStatus(pod, pod.Status, never, t0); s.Phase != v1.PodFailed || s.Reason != deadlineReason {
		t.Errorf("never started: phase %s, reason %q", s.Phase, s.Reason)
	}
}
